#!/usr/bin/env python3
"""Checks that bench/results/README.md indexes every recorded results file.

The index is the first column of README.md's tables: each cell names one
results file, or a results file and its companions (json, png, csv, ...), as
backquoted paths relative to bench/results (`ram_hit.md`, `suite/results.json`).

Exits 1, naming each file, when
- a file under bench/results (recursively, README.md itself aside) is named in
  no first cell, or
- a first cell names a file that does not exist.
Prints a one-line summary otherwise. Standard library only (runs in CI).
"""

import argparse
import os
import re
import sys

INDEX = "README.md"
BACKQUOTED = re.compile(r"`([^`]+)`")
SEPARATOR = re.compile(r"^\|[\s:|-]+\|$")


def results_files(root):
    """Every file under root, as a path relative to it with '/' separators."""
    found = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories.sort()
        for name in names:
            path = os.path.relpath(os.path.join(directory, name), root)
            found.append(path.replace(os.sep, "/"))
    return sorted(p for p in found if p != INDEX)


def indexed_paths(text):
    """The backquoted paths in the first cell of each table row of text."""
    paths = set()
    header_next = True  # the first row of a table is its header
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            header_next = True
            continue
        if SEPARATOR.match(line):
            continue
        if header_next:
            header_next = False
            continue
        first_cell = re.split(r"(?<!\\)\|", line)[1]
        paths.update(p.strip() for p in BACKQUOTED.findall(first_cell))
    return paths


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             os.pardir, "bench", "results"),
                        help="the results directory (default: the repository's bench/results)")
    args = parser.parse_args()

    root = os.path.normpath(args.results)
    index = os.path.join(root, INDEX)
    try:
        with open(index, encoding="utf-8") as f:
            listed = indexed_paths(f.read())
    except OSError as error:
        print(f"results_index: cannot read {index}: {error.strerror}", file=sys.stderr)
        return 1

    files = results_files(root)
    unlisted = [p for p in files if p not in listed]
    missing = sorted(p for p in listed if not os.path.isfile(os.path.join(root, p)))

    for path in unlisted:
        print(f"results_index: {path} is not listed in {INDEX}", file=sys.stderr)
    for path in missing:
        print(f"results_index: {INDEX} lists {path}, which does not exist", file=sys.stderr)
    if unlisted or missing:
        print(f"results_index: FAILED: {len(unlisted)} unlisted, {len(missing)} listed but missing"
              f" (in {root})", file=sys.stderr)
        return 1

    print(f"results_index: all {len(files)} files under {root} are listed in {INDEX}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
