#!/usr/bin/env python3
"""Lines per class in src/: its body plus its out-of-line members.

A class's size is the lines of its definition in a header (nested classes
included) plus the lines of every `Class::member` defined at namespace scope
in any .cc or .h file (the definition from its signature to its closing
brace), comments and blank lines inside them included. This is the measure
of issue 40's "no class over 500 lines".

    python3 tools/arch/class_sizes.py [--src DIR] [--top N] [--max LINES]

With --max, exits 1 when a class passes LINES (and names it).
"""

import argparse
import collections
import pathlib
import re
import sys

CLASS_RE = re.compile(r"^(?:class|struct)\s+(?:\w+\s+)*?(\w+)\s*(?:final\s*)?(?::[^;{]*)?\{",
                      re.M)
# An out-of-line member: `Type Class::Name(` or `Class::Class(` at column 0
# (the codebase's style puts namespace-scope definitions there).
MEMBER_RE = re.compile(r"^[^\s#/][^;{}()]*?\b(\w+)::~?\w+\s*\(", re.M)


def strip_literals(text):
    """Blanks out comments and string/char literals, keeping line breaks."""
    def blank(match):
        return re.sub(r"[^\n]", " ", match.group(0))
    pattern = r'//[^\n]*|/\*.*?\*/|R"(\w*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
    return re.sub(pattern, blank, text, flags=re.S)


def block_end(code, open_brace):
    """Index of the brace closing the one at open_brace."""
    depth = 0
    for i in range(open_brace, len(code)):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return len(code) - 1


def line_of(code, index):
    return code.count("\n", 0, index) + 1


def class_sizes(src):
    sizes = collections.Counter()
    parts = collections.defaultdict(list)
    for path in sorted(pathlib.Path(src).rglob("*")):
        if path.suffix not in (".h", ".cc"):
            continue
        code = strip_literals(path.read_text(errors="replace"))
        rel = path.relative_to(src)
        for m in CLASS_RE.finditer(code):
            # Only classes at column 0: nested ones count in their outer class.
            end = block_end(code, m.end() - 1)
            lines = line_of(code, end) - line_of(code, m.start()) + 1
            sizes[m.group(1)] += lines
            parts[m.group(1)].append(f"{rel}: body {lines}")
        for m in MEMBER_RE.finditer(code):
            brace = code.find("{", m.end())
            semi = code.find(";", m.end())
            if brace < 0 or (0 <= semi < brace):
                continue  # a declaration or a call, not a definition
            end = block_end(code, brace)
            lines = line_of(code, end) - line_of(code, m.start()) + 1
            sizes[m.group(1)] += lines
            parts[m.group(1)].append(f"{rel}:{line_of(code, m.start())} {lines}")
    return sizes, parts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = pathlib.Path(__file__).resolve().parents[2]
    parser.add_argument("--src", default=str(root / "src"))
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--max", type=int, default=0)
    parser.add_argument("--detail", help="print the parts of this class")
    args = parser.parse_args()
    sizes, parts = class_sizes(args.src)
    if args.detail:
        for part in parts[args.detail]:
            print(part)
    for name, lines in sizes.most_common(args.top):
        print(f"{lines:6d}  {name}")
    over = [name for name, lines in sizes.items() if args.max and lines > args.max]
    if over:
        print(f"over {args.max} lines: {', '.join(sorted(over))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
