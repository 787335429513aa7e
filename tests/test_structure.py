"""The shape of the code, as docs/design.md draws it, kept so by the build's
objects: no files that call each other in a loop (lib/serve/'s parts too,
which form layers of their own; lib/supervise/'s call each other through its
internal.h, and it is one room here), no file in lib/ over
MAX_LINES lines, and no thread started in cmd/ (cmd/ parses, calls one engine
and prints). Needs no backend: it reads `nm` of the objects `make` left in
build/obj (or build/asan/obj), and is skipped when there are none."""
import collections
import os
import shutil
import subprocess

import pytest

from conftest import ROOT

MAX_LINES = 2000
# The folders of objects whose calls are checked (the Makefile's $(B)/obj/%.o).
OBJECT_DIRS = ("lib", "lib/mirror", "lib/serve", "lib/supervise", "cmd")
# Sub-libraries, as one room when the files of lib/ and cmd/ are checked (a
# circle between such a folder and another file is still a circle); the loops
# inside lib/serve/ are test_no_loop_inside_serve's; lib/supervise/'s parts
# call each other through its internal.h, as its design says.
SUBLIBRARIES = ("lib/serve/", "lib/supervise/")


def object_root():
    for d in ("build/obj", "build/asan/obj"):
        if os.path.isdir(os.path.join(ROOT, d, "lib")):
            return os.path.join(ROOT, d)
    return None


def objects():
    """{source file: its object}, for sources that exist (a stale object of a
    renamed file is left out)."""
    root = object_root()
    if root is None or shutil.which("nm") is None:
        pytest.skip("no build/obj objects (run make) or no nm")
    found = {}
    for d in OBJECT_DIRS:
        src = os.path.join(ROOT, d)
        for name in sorted(os.listdir(src)):
            obj = os.path.join(root, d, name[:-2] + ".o")
            if name.endswith(".c") and os.path.exists(obj):
                found[f"{d}/{name}"] = obj
    assert found, f"no objects under {root}"
    return found


def symbols(obj):
    """(defined, undefined) global symbols of one object."""
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] == "U":
            undefined.add(f[1])
        elif len(f) == 3 and f[1] in "TDBRCGSVW":
            defined.add(f[2])
    return defined, undefined


def node(path):
    for sub in SUBLIBRARIES:
        if path.startswith(sub):
            return sub
    return path


def call_graph(group=True):
    """{caller: {callee: {symbols}}} between files (sub-libraries as one when group)."""
    syms = {src: symbols(obj) for src, obj in objects().items()}
    where = {s: src for src, (defined, _) in syms.items() for s in defined}
    name = node if group else (lambda p: p)
    edges = collections.defaultdict(lambda: collections.defaultdict(set))
    for src, (_, undefined) in syms.items():
        for s in undefined:
            if s in where and name(where[s]) != name(src):
                edges[name(src)][name(where[s])].add(s)
    return edges


def circles(edges):
    """The strongly connected sets of more than one file (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def describe(edges, part):
    return "\n".join(f"  {a} -> {b}: {', '.join(sorted(edges[a][b]))}"
                     for a in part for b in sorted(edges[a]) if b in part)


def test_no_files_call_each_other_in_a_loop():
    edges = call_graph()
    found = circles(edges)
    assert not found, "files that call each other (move the shared part below both):\n" + \
        "\n\n".join(describe(edges, part) for part in found)


def test_no_loop_inside_serve():
    """lib/serve/'s parts form layers (the list atop lib/serve/internal.h)."""
    edges = call_graph(group=False)
    found = [p for p in circles(edges) if all(f.startswith("lib/serve/") for f in p)]
    assert not found, "\n\n".join(describe(edges, part) for part in found)


def lib_files():
    for d, _, names in os.walk(os.path.join(ROOT, "lib")):
        for n in sorted(names):
            if n.endswith((".c", ".h")):
                yield os.path.relpath(os.path.join(d, n), ROOT)


def lines(rel):
    with open(os.path.join(ROOT, rel), "rb") as f:
        return sum(1 for _ in f)


def test_no_file_in_lib_over_the_limit():
    long = {f: n for f in lib_files() if (n := lines(f)) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split it along its parts): {long}"


def threads_in_cmd():
    return sorted(src for src, obj in objects().items()
                  if src.startswith("cmd/") and "pthread_create" in symbols(obj)[1])


def test_cmd_starts_no_thread():
    found = threads_in_cmd()
    assert not found, f"cmd/ starts threads (an engine belongs in lib/): {found}"
