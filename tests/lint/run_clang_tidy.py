#!/usr/bin/env python3
"""Runs clang-tidy, with the checks the committed .clang-tidy lists, over the
product's sources (common/, contract/, coordinator/, agent/), as the build
compiles them.

  run_clang_tidy.py <source dir> <build dir> [--jobs N] [--only REGEX] [clang-tidy]

The compile commands are the build's own (<build>/compile_commands.json),
so every module sees exactly the include roots it has. Two things in them
are for the compiler, not for clang-tidy, and are dropped: the precompiled
header (GCC's .gch, which clang cannot read) and -Werror (the compiler's own
warnings are the build's business, with its own -Werror in CI; here only
the checks count). Every finding is an error. --only limits the run to the
sources whose path (relative to the source dir) matches REGEX, as the CTest
does (tests/CMakeLists.txt says which and why).
"""
import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

PRODUCT = ("common/", "contract/", "coordinator/", "agent/")


def clean_args(entry):
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-include":  # -include <pch header>
            skip = True
            continue
        if a.endswith("ccache") or a.startswith("-include") or "cmake_pch" in a:
            continue
        if a in ("-Werror", "-Winvalid-pch"):
            continue
        out.append(a)
    return out


UNITY_INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def sources_of(entry):
    """The files one compile command compiles, each with its arguments: the
    entry's own file, or, for a unity batch (FACTORY_UNITY), every source the
    batch includes, with the batch's flags and the source in its place."""
    f = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    args = clean_args(entry)
    if "/Unity/unity_" not in f:
        return [(f, args)]
    try:
        included = UNITY_INCLUDE.findall(open(f).read())
    except OSError:
        return []
    out = []
    for inc in included:
        g = os.path.realpath(os.path.join(os.path.dirname(f), inc))
        out.append((g, [g if os.path.realpath(os.path.join(entry["directory"], x)) == f else x
                        for x in args]))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("source_dir")
    p.add_argument("build_dir")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--only", default="")
    p.add_argument("--times", action="store_true", help="print each file's seconds")
    p.add_argument("tool", nargs="?", default="clang-tidy")
    a = p.parse_args()
    src = os.path.realpath(a.source_dir)
    try:
        cmds = json.load(open(os.path.join(a.build_dir, "compile_commands.json")))
    except (OSError, ValueError) as e:
        print(f"tidy: cannot read {a.build_dir}/compile_commands.json (configure first): {e}",
              file=sys.stderr)
        return 1
    only = re.compile(a.only) if a.only else None
    entries, seen = [], set()
    for e in cmds:
        for f, args in sources_of(e):
            rel = os.path.relpath(f, src)
            # A file compiled twice (a module and a probe) is checked once.
            if not rel.startswith(PRODUCT) or rel in seen:
                continue
            if only and not only.search(rel):
                continue
            seen.add(rel)
            entries.append({"directory": e["directory"], "file": f, "arguments": args})
    if not entries:
        print("tidy: no product source matches", file=sys.stderr)
        return 1
    entries.sort(key=lambda e: e["file"])

    with tempfile.TemporaryDirectory() as db:
        json.dump(entries, open(os.path.join(db, "compile_commands.json"), "w"))
        config = os.path.join(src, ".clang-tidy")

        def tidy(entry):
            start = time.monotonic()
            r = subprocess.run([a.tool, "-p", db, f"--config-file={config}", "--quiet",
                                "--warnings-as-errors=*", "--extra-arg=-Wno-unknown-warning-option",
                                entry["file"]], capture_output=True, text=True)
            return entry["file"], r, time.monotonic() - start

        start = time.monotonic()
        findings, failed = [], []
        with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            for f, r, took in pool.map(tidy, entries):
                if a.times:
                    print(f"tidy: {took:6.1f} s  {os.path.relpath(f, src)}", flush=True)
                if r.returncode != 0:
                    failed.append(os.path.relpath(f, src))
                    # A header's finding shows in every file that includes it: once here.
                    for block in re.split(r"\n(?=\S+:\d+:\d+: )", r.stdout.strip()):
                        if block and block not in findings:
                            findings.append(block)
                    if not r.stdout.strip():
                        findings.append(f"{os.path.relpath(f, src)}: {r.stderr.strip()}")
        took = time.monotonic() - start
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    for f in findings:
        print(f)
    print(f"tidy: {len(entries)} files in {took:.0f} s ({cpu.ru_utime + cpu.ru_stime:.0f} s of "
          f"CPU) with {a.jobs} jobs; {len(failed)} with findings",
          file=sys.stderr if failed else sys.stdout)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
