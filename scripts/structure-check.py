#!/usr/bin/env python3
"""Size bounds on the project's code: no source file longer than 900 lines,
no function longer than 80. A reader should be able to hold one function on
a screen and one file's role in mind; past these sizes a function wants
splitting along its steps and a file along its roles. Checks the C++ of the
given trees (src/ and bench/ by default; *_test.cc aside) and their Python
(bench/*.py). Prints each breach; exit 1 if any.

    scripts/structure-check.py [DIR ...]

For C++, a function is a brace block opened, outside any other function, by
a line whose code ends in `) {` (or `) const {`, `noexcept {`, `-> T {`, an
initializer list's last `}` ... `{`), control statements excepted. Comments
and string literals are skipped when braces are counted. A heuristic, good
for this code base's style (clang-format, one declaration per line). For
Python, a function is a `def` as Python's ast module reads it, nested ones
included.

No exceptions: a breach is fixed, not listed.
"""
import ast
import os
import re
import sys

MAX_FILE, MAX_FN = 900, 80

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


def cc_functions(lines):
    """(first, last) line numbers of each top-level function in C++ lines."""
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


def py_functions(text, path):
    """(first, last) line numbers of each def in Python source, decorators aside."""
    for node in ast.walk(ast.parse(text, path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.lineno, node.end_lineno


def breaches(path, rel):
    """(allowlist key, message) for each bound the file exceeds."""
    text = open(path, encoding="utf-8", errors="replace").read()
    lines = text.split("\n")
    n = len(lines) - (1 if text.endswith("\n") else 0)
    if n > MAX_FILE:
        yield (rel, None), "%s: %d lines (at most %d)" % (rel, n, MAX_FILE)
    fns = py_functions(text, path) if path.endswith(".py") else cc_functions(lines)
    for a, b in fns:
        if b - a + 1 > MAX_FN:
            yield (rel, lines[a - 1].strip()), \
                "%s:%d: a function of %d lines (at most %d)" % (rel, a, b - a + 1, MAX_FN)


def checked(root):
    """The files under root that the bounds apply to."""
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if f.endswith((".cc", ".h", ".py")) and not f.endswith("_test.cc"):
                yield os.path.join(d, f)


def main():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    roots = sys.argv[1:] or [os.path.join(here, "src"), os.path.join(here, "bench")]
    bad = 0
    for root in roots:
        root = os.path.abspath(root)
        for p in checked(root):
            rel = os.path.relpath(p, os.path.dirname(root))
            for _, msg in breaches(p, rel):
                print(msg)
                bad += 1
    if bad:
        print("%d breach(es) of the size bounds (files <= %d lines, functions <= %d)"
              % (bad, MAX_FILE, MAX_FN))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
