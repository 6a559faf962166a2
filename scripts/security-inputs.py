#!/usr/bin/env python3
"""docs/SECURITY.md's input table against the code: every op of the control
protocol's table (src/common/op_table.h, SV_OP lines), every shared segment
layout (src/common/shm_layout.h's `struct ...Layout` and the request ring's
header) and every environment variable the library or daemon reads
(getenv("...") in src/) has a row; every test a row names exists
(TEST(Suite, Name) somewhere under tests/ or src/, or a ctest name in a
CMakeLists.txt). Prints each gap; exit 1 if any.

    scripts/security-inputs.py [REPO_ROOT]
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")


def read(path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


def section(doc, title):
    """The text of the `## title` section of doc."""
    m = re.search(r"^## " + re.escape(title) + r"\s*$(.*?)(?=^## |\Z)", doc, re.M | re.S)
    return m.group(1) if m else ""


def first_cells(text):
    """The backticked names in each table row's first cell."""
    names = set()
    for line in text.splitlines():
        if not line.startswith("|") or line.startswith("| ---"):
            continue
        cell = line.split("|")[1]
        names.update(re.findall(r"`([^`]+)`", cell))
    return names


def all_sources():
    for top in ("src", "tests", "fuzz"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith((".cc", ".h", ".c", ".sh", ".py", ".txt")):
                    yield os.path.join(d, f)


def main():
    doc = read("docs/SECURITY.md")
    inputs = section(doc, "Inputs")
    gaps = []
    if not inputs:
        print("docs/SECURITY.md: no '## Inputs' section")
        return 1
    rows = first_cells(inputs)

    ops = re.findall(r"^SV_OP(?:_DECL)?\((\w+),", read("src/common/op_table.h"), re.M)
    if len(ops) < 10:
        gaps.append("could not read the op table from src/common/op_table.h")
    gaps += [f"op {op}: no row in docs/SECURITY.md's input table" for op in ops if op not in rows]

    layouts = re.findall(r"^struct (\w+Layout)\b", read("src/common/shm_layout.h"), re.M)
    layouts += re.findall(r"^struct (PostRingHeader)\b", read("src/common/protocol.h"), re.M)
    gaps += [f"shared segment {s}: no row" for s in layouts if s not in rows]

    envs = set()
    for path in all_sources():
        if not path.startswith(os.path.join(root, "src")) or path.endswith("_test.cc"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            envs.update(re.findall(r'getenv\("(\w+)"\)', f.read()))
    gaps += [f"environment variable {e}: no row" for e in sorted(envs) if e not in rows]

    # Every test a row names exists.
    text = ""
    for path in all_sources():
        with open(path, encoding="utf-8", errors="replace") as f:
            text += f.read()
    defined = set(re.findall(r"TEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\)", text))
    defined = {f"{a}.{b}" for a, b in defined}
    for line in inputs.splitlines():
        if not line.startswith("|") or line.startswith("| ---"):
            continue
        last = line.rstrip().rstrip("|").split("|")[-1]
        for name in re.findall(r"`([A-Za-z]\w*\.[A-Za-z][\w.*/-]*)`", last):
            if "*" in name or "/" in name or "." not in name:
                continue
            if name in defined or name in text:
                continue
            gaps.append(f"test {name}: named in the input table but not found")
    # Anywhere in the page: a test of a known suite that does not exist.
    suites = {d.split(".")[0] for d in defined}
    for suite, name in set(re.findall(r"`([A-Z]\w+)\.([A-Z]\w+)`", doc)):
        if suite in suites and f"{suite}.{name}" not in defined:
            gaps.append(f"test {suite}.{name}: named in docs/SECURITY.md but not found")
    for g in gaps:
        print(g)
    print(f"security-inputs: {len(ops)} ops, {len(layouts)} segments, {len(envs)} variables; {len(gaps)} gaps")
    return 1 if gaps else 0


sys.exit(main())
