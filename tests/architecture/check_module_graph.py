#!/usr/bin/env python3
"""Checks the module graph the build declares against the one
docs/architecture.md describes, and the sources against both.

  check_module_graph.py graph <source dir> <build dir>
      The modules CMake made (<build>/module_graph.json, written by
      cmake/modules.cmake) must be exactly the ones the page lists, each with
      exactly the dependencies the page gives it; no arrow the page forbids may
      exist, directly or through other modules; the graph has no cycle; and
      every #include of another module's header in a module's sources names a
      module it can see (itself, its dependencies, and their PUBLIC ones).

  check_module_graph.py probe <build dir> <module> <header>
      Compiles a file that includes <header> with exactly the flags the build
      uses for <module>'s own sources (compile_commands.json). Exits 0 when
      the compiler refuses it because the header cannot be found: the proof
      that a forbidden include fails the build, not just this script. A
      positive control first compiles an include of one of <module>'s own
      headers with the same flags, so a probe whose flags cannot compile
      anything proves nothing and fails.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def fail(msg):
    print("module graph: " + msg, file=sys.stderr)
    sys.exit(1)


def read_page(source_dir):
    path = os.path.join(source_dir, "docs", "architecture.md")
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        fail(f"cannot read {path}: {e}")
    m = re.search(r"```module-graph\n(.*?)```", text, re.S)
    if not m:
        fail(f"{path} has no ```module-graph block")
    deps, forbidden = {}, []
    for n, raw in enumerate(m.group(1).splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        f = re.fullmatch(r"forbid\s+(\S+)\s*->\s*(\S+)", line)
        if f:
            forbidden.append((f.group(1), f.group(2)))
            continue
        d = re.fullmatch(r"(\S+):(.*)", line)
        if not d:
            fail(f"{path}, module-graph line {n}: cannot read {raw!r}")
        name = d.group(1)
        if name in deps:
            fail(f"{path}: module {name} is listed twice")
        deps[name] = sorted(d.group(2).split())
    return deps, forbidden


def reachable(graph, start):
    seen, stack = set(), [start]
    while stack:
        for d in graph.get(stack.pop(), []):
            if d not in seen:
                seen.add(d)
                stack.append(d)
    return seen


def find_cycle(graph):
    state, path = {}, []

    def visit(n):
        state[n] = 1
        path.append(n)
        for d in graph.get(n, []):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state:
                c = visit(d)
                if c:
                    return c
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            c = visit(n)
            if c:
                return c
    return None


def check_graph(source_dir, build_dir):
    try:
        built = json.load(open(os.path.join(build_dir, "module_graph.json")))["modules"]
    except (OSError, ValueError, KeyError) as e:
        fail(f"cannot read {build_dir}/module_graph.json (configure the build first): {e}")
    page, forbidden = read_page(source_dir)
    problems = []
    for m in sorted(set(built) - set(page)):
        problems.append(f"{m} is a module in the build but docs/architecture.md does not list it")
    for m in sorted(set(page) - set(built)):
        problems.append(f"docs/architecture.md lists {m}, which the build does not make")
    graph = {m: sorted(set(v["public"] + v["private"])) for m, v in built.items()}
    for m in sorted(set(built) & set(page)):
        if graph[m] != page[m]:
            problems.append(f"{m}: the build links {graph[m]}, docs/architecture.md says {page[m]}")
    for a, b in forbidden:
        if a not in built:
            problems.append(f"forbid {a} -> {b}: no module {a}")
        elif b in reachable(graph, a):
            problems.append(f"{a} depends on {b} (directly or through others): forbidden")
    cycle = find_cycle(graph)
    if cycle:
        problems.append("dependency cycle: " + " -> ".join(cycle))

    # What each module's sources can see: itself, its direct dependencies and,
    # through them, every PUBLIC dependency further down.
    def visible(m):
        seen = {m}
        frontier = list(graph[m])
        while frontier:
            d = frontier.pop()
            if d in seen or d not in built:
                continue
            seen.add(d)
            frontier.extend(built[d]["public"])
        return seen

    dir_of = {v["dir"]: m for m, v in built.items()}
    for m, v in sorted(built.items()):
        folder = os.path.join(source_dir, v["dir"])
        can_see = visible(m)
        for name in sorted(os.listdir(folder)):
            if not name.endswith((".cpp", ".hpp")):
                continue
            text = open(os.path.join(folder, name), encoding="utf-8").read()
            for inc in INCLUDE.findall(text):
                owner = dir_of.get(os.path.dirname(inc))
                if owner is None:
                    top = os.path.dirname(inc).split("/")[0]
                    if top in ("agent", "coordinator", "common", "contract"):
                        problems.append(f"{v['dir']}/{name} includes {inc}, which is in no module")
                    continue
                if owner not in can_see:
                    problems.append(f"{v['dir']}/{name} includes {inc} of {owner}, "
                                    f"which {m} does not depend on")
    if problems:
        for p in problems:
            print("module graph: " + p, file=sys.stderr)
        sys.exit(1)
    print(f"module graph: {len(built)} modules, "
          f"{sum(len(d) for d in graph.values())} arrows, as docs/architecture.md says; no cycle")


def probe(build_dir, module, header):
    cmds = json.load(open(os.path.join(build_dir, "compile_commands.json")))
    built = json.load(open(os.path.join(build_dir, "module_graph.json")))["modules"]
    folder = "/" + built[module]["dir"] + "/"
    # A unity batch of the module's sources (FACTORY_UNITY) compiles with the same flags.
    entry = next((c for c in cmds if (folder in c["file"] or f"/{module}.dir/Unity/" in c["file"])
                  and f"/{module}.dir/" in c.get("command", " ".join(c.get("arguments", [])))),
                 None)
    if entry is None:
        fail(f"no compile command for a source of {module}")
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    # Drop the launcher (ccache), the output, the source and precompiled-header
    # flags; keep every include path and definition the module really has.
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a.endswith("ccache") or a == entry["file"] or a.startswith("-include") or "cmake_pch" in a:
            continue
        if a.startswith("-Winvalid-pch") or a in ("-MD", "-MMD"):
            continue
        out.append(a)

    def compile_include(inc):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.cpp")
            open(src, "w").write(f'#include "{inc}"\n')
            return subprocess.run(out + ["-fsyntax-only", src], cwd=entry["directory"],
                                  capture_output=True, text=True)

    own_dir = built[module]["dir"]
    # The module's include root (cmake/modules.cmake) holds its own headers.
    root = os.path.join(build_dir, "modinc", module, own_dir)
    own = sorted(n for n in os.listdir(root) if n.endswith(".hpp")) if os.path.isdir(root) else []
    if not own:
        fail(f"{module} has no header of its own for the positive control")
    control = f"{own_dir}/{own[0]}"
    c = compile_include(control)
    if c.returncode != 0:
        print(f"probe: {module}'s own flags cannot compile an include of {control}, so the "
              f"probe would prove nothing:\n{c.stderr}", file=sys.stderr)
        sys.exit(1)
    r = compile_include(header)
    if r.returncode == 0:
        print(f"probe: {module} compiled a file including {header}: the boundary is not built",
              file=sys.stderr)
        sys.exit(1)
    if "No such file or directory" not in r.stderr:
        print(f"probe: {module} failed on {header} for another reason:\n{r.stderr}", file=sys.stderr)
        sys.exit(1)
    print(f"probe: {module} compiles {control} but cannot include {header}: "
          f"{r.stderr.strip().splitlines()[0]}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "graph":
        check_graph(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "probe":
        probe(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
