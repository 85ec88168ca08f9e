#!/usr/bin/env python3
"""Checks that every C++ source of the product and its tests is formatted as
the committed .clang-format says.

  check_format.py <source dir> [clang-format]

Runs `clang-format --dry-run -Werror` over the *.cpp and *.hpp files under
common/, contract/, coordinator/, agent/, tests/ and fuzz/ (the files `make format`
formats), and fails naming each file that would change. The fix is
`make format`. clang-format's output differs between major versions, so the
version is the one Debian 12 ships (14), which scripts/install-deps.sh
installs; another version fails here saying so, rather than reporting a tree
of false differences.
"""
import os
import re
import subprocess
import sys

FOLDERS = ("common", "contract", "coordinator", "agent", "tests", "fuzz")
WANT_MAJOR = 14


def sources(root):
    out = []
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames.sort()
            out += [os.path.join(dirpath, f) for f in sorted(filenames)
                    if f.endswith((".cpp", ".hpp"))]
    return out


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    root = sys.argv[1]
    tool = sys.argv[2] if len(sys.argv) == 3 else "clang-format"
    try:
        version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        print(f"format: cannot run {tool} ({e}): install clang-format "
              f"(scripts/install-deps.sh --test)", file=sys.stderr)
        return 1
    m = re.search(r"version (\d+)\.", version)
    if not m or int(m.group(1)) != WANT_MAJOR:
        print(f"format: {tool} is {version.strip()!r}; the tree is formatted with clang-format "
              f"{WANT_MAJOR} (Debian 12's), whose output another version does not match",
              file=sys.stderr)
        return 1
    files = sources(root)
    bad = []
    # A few hundred files per call keeps the command line short.
    for i in range(0, len(files), 200):
        chunk = files[i:i + 200]
        r = subprocess.run([tool, "--style=file", "--dry-run", "-Werror", *chunk],
                           capture_output=True, text=True, cwd=root)
        if r.returncode != 0:
            for line in r.stderr.splitlines():
                f = line.split(":", 1)[0]
                if f.endswith((".cpp", ".hpp")) and ": error:" in line and f not in bad:
                    bad.append(f)
            if not bad:  # clang-format failed for another reason: show it
                print(r.stderr, file=sys.stderr)
                return 1
    if bad:
        for f in bad:
            print(f"format: {os.path.relpath(f, root)} is not formatted", file=sys.stderr)
        print(f"format: {len(bad)} of {len(files)} files differ from .clang-format; "
              f"run `make format`", file=sys.stderr)
        return 1
    print(f"format: {len(files)} files as .clang-format says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
