#!/usr/bin/env python3
"""Folder-level include graph of src/: which layer includes which.

Each src/<folder>/ is one CMake target (a layer), declared by a
monarch_layer(<name> DEPS ...) call in the top-level CMakeLists.txt: the
order of those calls is the layer order, and a layer sees only itself and
its DEPS (with what they see). This script reads the layers from those calls,
so there is no second copy of the order to drift. The build refuses an
include the layer does not see, unless it names the file relative to the
includer ("../service/client.h"), which the compiler resolves before any
include root: this script resolves such includes as the compiler does, and
the ctest `arch_include_graph` runs it with --check.

Prints the layers, then one line per arrow `from -> to (N includes)`, marked
UP when it goes against the declared order and HIDDEN when it goes down to a
layer not among the includer's DEPS. Exits 1 on a cycle; with --check also
on an UP or HIDDEN arrow, on a folder that is not a layer (or a layer with
no folder), or on a source file directly in src/ (every file must belong to
a layer).
"""

import argparse
import collections
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
SOURCE_SUFFIXES = (".h", ".hh", ".hpp", ".cc", ".cpp", ".c", ".inc")
LAYER_CALL = re.compile(r"^\s*monarch_layer\s*\(([^)]*)\)", re.M)
LAYER_KEYWORDS = {"TARGET", "DEPS", "SOURCES", "LIBS"}


def read_layers(cmake_lists):
    """[(layer, [deps])] from the monarch_layer() calls, in their order."""
    with open(cmake_lists, encoding="utf-8") as f:
        text = re.sub(r"(^|\s)#.*", r"\1", f.read())  # Comments.
    layers = []
    for call in LAYER_CALL.finditer(text):
        name, *args = call.group(1).split()
        deps, keyword = [], None
        for arg in args:
            if arg in LAYER_KEYWORDS:
                keyword = arg
            elif keyword == "DEPS":
                deps.append(arg)
        layers.append((name, deps))
    return layers


def visible_sets(layers):
    """({layer: folders it may include}, [errors]), as monarch_layer() builds them."""
    visible, errors = {}, []
    for name, deps in layers:
        seen = {name}
        for dep in deps:
            if dep not in visible:
                errors.append("layer %s: DEPS names '%s', which is not a layer before it"
                              % (name, dep))
                continue
            seen |= visible[dep]
        visible[name] = seen
    return visible, errors


def included_folder(src, folders, path, quote, target):
    """The folder of src/ that `#include <quote>target` in `path` reads, or None.

    A quoted name is looked up next to the includer first, as the compiler
    does: "../core/x.h" and "x.h" resolve there; "core/x.h" through the
    include roots, whose first component is the layer."""
    if quote == '"':
        beside = os.path.normpath(os.path.join(os.path.dirname(path), target))
        if os.path.exists(beside) or target.startswith(("./", "../")):
            rel = os.path.relpath(beside, src)
            first = rel.split(os.sep)[0]
            return first if first in folders else None
    first = target.split("/")[0]
    return first if "/" in target and first in folders else None


def scan(src):
    """Returns ({(from, to): [file:line, ...]}, folders, loose files in src/)."""
    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    loose = sorted(f for f in os.listdir(src)
                   if f.endswith(SOURCE_SUFFIXES) and os.path.isfile(os.path.join(src, f)))
    arrows = collections.defaultdict(list)
    for folder in folders:
        for root, _, files in os.walk(os.path.join(src, folder)):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(root, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        # Only folders of src/: "absl/...", "monarch/..." (the
                        # public API, visible to every layer) are not layers.
                        to = included_folder(src, folders, path, m.group(1), m.group(2))
                        if to and to != folder:
                            where = "%s:%d" % (os.path.relpath(path, src), number)
                            arrows[(folder, to)].append(where)
    return arrows, folders, loose


def find_cycle(nodes, edges):
    """A list of nodes forming a cycle, or None."""
    succ = collections.defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    state = {}  # 1: on the stack, 2: done.
    stack = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(succ[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(nodes):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=os.path.join(here, "..", "..", "src"))
    parser.add_argument("--cmake", help="the CMakeLists.txt declaring the layers "
                        "(default: the one beside --src)")
    parser.add_argument("--check", action="store_true",
                        help="also fail on an UP or HIDDEN arrow, a folder that is not a "
                        "layer, or a file in src/")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list each layer's DEPS and the includes behind each arrow")
    args = parser.parse_args(argv)

    src = os.path.normpath(args.src)
    cmake = args.cmake or os.path.join(os.path.dirname(os.path.abspath(src)), "CMakeLists.txt")
    layers = read_layers(cmake) if os.path.exists(cmake) else []
    order = [name for name, _ in layers]
    rank = {name: i for i, name in enumerate(order)}
    visible, errors = visible_sets(layers)
    arrows, folders, loose = scan(src)

    def key(arrow):
        return (rank.get(arrow[0], len(order)), arrow[0], rank.get(arrow[1], len(order)), arrow[1])

    print("order (%s): %s" % (os.path.relpath(cmake), " < ".join(order) or "none declared"))
    if args.verbose:
        for name, deps in layers:
            print("  %-10s DEPS %s" % (name, " ".join(deps) or "-"))
    bad = []
    for arrow in sorted(arrows, key=key):
        a, b = arrow
        mark = ""
        if a in rank and b in rank and rank[b] > rank[a]:
            mark = "UP"
        elif a in visible and b in rank and b not in visible[a]:
            mark = "HIDDEN"
        if mark:
            bad.append(arrow)
        print("%-10s -> %-10s (%d)%s" % (a, b, len(arrows[arrow]), "  " + mark if mark else ""))
        if args.verbose or mark:
            for where in arrows[arrow]:
                print("    " + where)
    print("arrows: %d, up or hidden: %d" % (len(arrows), len(bad)))

    failed = False
    cycle = find_cycle(folders, arrows)
    if cycle:
        print("CYCLE: " + " -> ".join(cycle))
        failed = True
    if args.check:
        unordered = [f for f in folders if f not in rank]
        no_folder = [name for name in order if name not in folders]
        for message, items in (
                ("%d arrow(s) include a layer the includer does not see" % len(bad), bad),
                ("no monarch_layer() calls in " + cmake, [] if order else [cmake]),
                ("the layers' DEPS", errors),
                ("folders that are not layers: " + ", ".join(unordered), unordered),
                ("layers with no folder in src/: " + ", ".join(no_folder), no_folder),
                ("files directly in src/ (not in a layer): " + ", ".join(loose), loose)):
            if items:
                print("FAIL: " + message)
                failed = True
        for error in errors:
            print("    " + error)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
