#!/usr/bin/env python3
"""Issue 19's bounds on src/ (tests aside): no source file longer than
1,000 lines, no function longer than 100. Prints each breach; exit 1 if any.

    scripts/structure-check.py [SRC_DIR]

A function is a brace block opened, outside any other function, by a line
whose code ends in `) {` (or `) const {`, `noexcept {`, `-> T {`, an
initializer list's last `}` ... `{`), control statements excepted. Comments
and string literals are skipped when braces are counted. A heuristic, good
for this code base's style (clang-format, one declaration per line).
"""
import os
import re
import sys

MAX_FILE, MAX_FN = 1000, 100
CONTROL = re.compile(r"^\s*(\}\s*)?(if|for|while|switch|catch|do|else|try)\b")
OPENER = re.compile(r"(\)|\bconst|\bnoexcept|\boverride|\bfinal|->\s*[\w:<>,\s*&]+|\})\s*\{\s*$")


def strip(line, in_comment):
    """The line's code without comments and literals; the block-comment state."""
    out, i, n = [], 0, len(line)
    while i < n:
        if in_comment:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out), True
            i, in_comment = j + 2, False
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            in_comment, i = True, i + 2
        elif line[i] in "\"'":
            q, i = line[i], i + 1
            while i < n and line[i] != q:
                i += 2 if line[i] == "\\" else 1
            i += 1
        else:
            out.append(line[i])
            i += 1
    return "".join(out), in_comment


def functions(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    depth, fn_depth, fn_start, in_comment = 0, None, 0, False
    for no, raw in enumerate(lines, 1):
        code, in_comment = strip(raw, in_comment)
        if fn_depth is None and "{" in code and OPENER.search(code) and not CONTROL.match(code) \
                and not re.match(r"^\s*(namespace|extern|struct|class|union|enum)\b", code):
            fn_depth, fn_start = depth, no
        depth += code.count("{") - code.count("}")
        if fn_depth is not None and depth <= fn_depth:
            yield fn_start, no
            fn_depth = None
    return


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
    bad = 0
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith((".cc", ".h")) or f.endswith("_test.cc"):
                continue
            p = os.path.join(d, f)
            rel = os.path.relpath(p, os.path.join(root, ".."))
            n = sum(1 for _ in open(p, encoding="utf-8", errors="replace"))
            if n > MAX_FILE:
                print("%s: %d lines (at most %d)" % (rel, n, MAX_FILE))
                bad += 1
            for a, b in functions(p):
                if b - a + 1 > MAX_FN:
                    print("%s:%d: a function of %d lines (at most %d)" % (rel, a, b - a + 1, MAX_FN))
                    bad += 1
    if bad:
        print("%d breach(es) of issue 19's bounds" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
