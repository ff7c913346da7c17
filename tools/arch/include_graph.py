#!/usr/bin/env python3
"""Folder-level include graph of src/: which layer includes which.

Each src/<folder>/ is one CMake target (a layer). The build already refuses
an include that goes up the layers (each layer's include root only holds the
folders below it, see CMakeLists.txt); this script is the readable view of
the same graph, for reviews and the recorded figures, and the ctest
`arch_include_graph` runs it with --check so that the order declared here and
the one in CMakeLists.txt cannot drift apart silently.

Prints one line per arrow `from -> to (N includes)`, marked UP when it goes
against the declared order. Exits 1 on a cycle; with --check also on an up
arrow, on a folder missing from the order, or on a source file directly in
src/ (every file must belong to a layer).
"""

import argparse
import collections
import os
import re
import sys

# Lowest first. Keep in step with monarch_layer() calls in CMakeLists.txt.
DEFAULT_ORDER = ["common", "config", "drivers", "metadata", "placement", "remote",
                 "core", "frontend", "service", "api"]

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/[^"]+"')
SOURCE_SUFFIXES = (".h", ".hh", ".hpp", ".cc", ".cpp", ".c", ".inc")


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
                        # Only folders of src/: "absl/...", "monarch/..." (the
                        # public API, visible to every layer) are not layers.
                        if m and m.group(1) in folders and m.group(1) != folder:
                            where = "%s:%d" % (os.path.relpath(path, src), number)
                            arrows[(folder, m.group(1))].append(where)
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


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=os.path.join(here, "..", "..", "src"))
    parser.add_argument("--order", default=",".join(DEFAULT_ORDER),
                        help="layers, lowest first, comma-separated")
    parser.add_argument("--check", action="store_true",
                        help="also fail on an up arrow, an unordered folder or a file in src/")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list the includes behind each arrow")
    args = parser.parse_args()

    order = [x for x in args.order.split(",") if x]
    rank = {name: i for i, name in enumerate(order)}
    arrows, folders, loose = scan(os.path.normpath(args.src))

    def key(arrow):
        return (rank.get(arrow[0], len(order)), arrow[0], rank.get(arrow[1], len(order)), arrow[1])

    print("order: " + " < ".join(order))
    up = []
    for arrow in sorted(arrows, key=key):
        a, b = arrow
        is_up = a in rank and b in rank and rank[b] > rank[a]
        if is_up:
            up.append(arrow)
        print("%-10s -> %-10s (%d)%s" % (a, b, len(arrows[arrow]), "  UP" if is_up else ""))
        if args.verbose or is_up:
            for where in arrows[arrow]:
                print("    " + where)
    unordered = [f for f in folders if f not in rank]
    print("arrows: %d, up: %d" % (len(arrows), len(up)))

    failed = False
    cycle = find_cycle(folders, arrows)
    if cycle:
        print("CYCLE: " + " -> ".join(cycle))
        failed = True
    if args.check:
        if up:
            print("FAIL: %d arrow(s) go up the declared order" % len(up))
            failed = True
        if unordered:
            print("FAIL: folders not in the order: " + ", ".join(unordered))
            failed = True
        if loose:
            print("FAIL: files directly in src/ (not in a layer): " + ", ".join(loose))
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
