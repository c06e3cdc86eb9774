#!/usr/bin/env python3
"""The renovation's size bars, measured from the sources (issue 29).

- No crate holds more than 35% of the crates' source lines (crates/*/src, tests and
  comments included: what a reader has to page through).
- No function in crates/*/src is longer than 150 lines (from the line of `fn` to its closing
  brace; unit-test modules included, since they are code a newcomer reads too).
- The crates that define deterministic cores name no tokio, hyper or clap in their normal
  dependency tree (`cargo tree -e normal`), and their sources read no clock (`SystemTime::now`,
  `Instant::now`): time is an argument.

Usage: scripts/size-bars.py [--top N] [--no-tree]
  prints each crate's share and the N longest functions; exits 1 if a bar fails.
"""
import argparse
import importlib.util
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_SHARE = 0.35
MAX_FN_LINES = 150
# Crates whose job is a deterministic core, with the folders that hold their optional IO
# driver (bft's tokio transport, behind its `transport` feature): the compiler holds the boundary.
CORE_CRATES = {"exec": [], "bft": ["transport"]}
CORE_FORBIDDEN_DEPS = ["tokio", "hyper", "clap"]
CLOCK_READS = re.compile(r"\b(SystemTime|Instant)::now\s*\(")

spec = importlib.util.spec_from_file_location("module_graph", os.path.join(ROOT, "scripts", "module-graph.py"))
module_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module_graph)

FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def rust_files(d):
    for base, dirs, files in os.walk(d):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".rs"):
                yield os.path.join(base, f)


def functions(path):
    """(name, first line, line count) of every fn with a body in the file."""
    text = module_graph.strip(open(path, encoding="utf-8").read())
    out = []
    for m in FN.finditer(text):
        # The body starts at the first `{` after the signature, unless a `;` ends it first
        # (a trait method without a body).
        i = m.end()
        depth_paren = 0
        while i < len(text):
            c = text[i]
            if c in "([":
                depth_paren += 1
            elif c in ")]":
                depth_paren -= 1
            elif c == ";" and depth_paren == 0:
                i = -1
                break
            elif c == "{" and depth_paren == 0:
                break
            i += 1
        if i < 0 or i >= len(text):
            continue
        depth, j = 0, i
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        first = text.count("\n", 0, m.start()) + 1
        last = text.count("\n", 0, j) + 1
        out.append((m.group(1), first, last - first + 1))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--no-tree", action="store_true", help="skip the cargo tree check")
    args = ap.parse_args()
    failed = []

    crates = sorted(d for d in os.listdir(os.path.join(ROOT, "crates")) if os.path.isdir(os.path.join(ROOT, "crates", d, "src")))
    lines = {}
    fns = []
    for c in crates:
        total = 0
        for p in rust_files(os.path.join(ROOT, "crates", c, "src")):
            total += sum(1 for _ in open(p, encoding="utf-8"))
            for name, first, n in functions(p):
                fns.append((n, os.path.relpath(p, ROOT), first, name))
        lines[c] = total
    all_lines = sum(lines.values())
    print(f"crate shares of {all_lines} source lines (bar {MAX_SHARE:.0%}):")
    for c in sorted(crates, key=lambda c: -lines[c]):
        share = lines[c] / all_lines
        mark = "" if share <= MAX_SHARE else "  <- over the bar"
        print(f"  {c:12} {lines[c]:6} {share:6.1%}{mark}")
        if share > MAX_SHARE:
            failed.append(f"crate {c} holds {share:.1%} of the source lines")

    fns.sort(reverse=True)
    print(f"longest functions (bar {MAX_FN_LINES} lines):")
    for n, p, first, name in fns[: args.top]:
        mark = "" if n <= MAX_FN_LINES else "  <- over the bar"
        print(f"  {n:5}  {p}:{first} {name}{mark}")
    for n, p, first, name in fns:
        if n > MAX_FN_LINES:
            failed.append(f"{p}:{first} fn {name} is {n} lines")

    for c in CORE_CRATES:
        src = os.path.join(ROOT, "crates", c, "src")
        if not os.path.isdir(src):
            continue
        for p in rust_files(src):
            if any(os.sep + d + os.sep in p for d in CORE_CRATES[c]):
                continue
            text = module_graph.strip(open(p, encoding="utf-8").read())
            for m in CLOCK_READS.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                failed.append(f"{os.path.relpath(p, ROOT)}:{line} reads the clock in core crate {c}")
        if not args.no_tree:
            tree = subprocess.run(["cargo", "tree", "-p", c, "-e", "normal", "--prefix", "none", "--offline"],
                                  cwd=ROOT, capture_output=True, text=True)
            if tree.returncode != 0:
                tree = subprocess.run(["cargo", "tree", "-p", c, "-e", "normal", "--prefix", "none"],
                                      cwd=ROOT, capture_output=True, text=True)
            if tree.returncode != 0:
                failed.append(f"cargo tree -p {c} failed: {tree.stderr.strip()[:200]}")
                continue
            names = {l.split()[0] for l in tree.stdout.splitlines() if l.strip()}
            for dep in CORE_FORBIDDEN_DEPS:
                if dep in names:
                    failed.append(f"core crate {c} has {dep} in its normal dependency tree")
            print(f"core crate {c}: no {', '.join(d for d in CORE_FORBIDDEN_DEPS if d not in names)} in its normal dependency tree")

    if failed:
        print("size bars failed:")
        for f in failed:
            print(f"  {f}")
        return 1
    print("size bars hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
