#!/usr/bin/env python3
"""The workspace's crate graph and each crate's module graph, from the sources.

An edge A -> B means that module A's code names something of module B: a `use` of
`crate::`, `self::` or `super::` paths (and of child modules), or such a path written out in
the code. A `pub use` is a re-export, not a dependency of the module that re-exports: paths
through it are followed to the module that defines the item, so a facade (`pub use
core::ExecCore` in exec/mod.rs) creates no loop; the re-exporting module depends on the
source only if its own code uses the name. Test modules (`#[cfg(test)] mod ...`, inline or
in their own file) are left out: nothing depends on them, so they cannot close a loop.
Comments, doc comments and string literals are ignored. A crate's binary (src/main.rs) is
shown as the node `main`, which depends on the library through the crate's name.

Usage: scripts/module-graph.py [--mermaid | --markdown] [--root DIR]
  (default) prints every crate's modules with their edges, then any loops (strongly
  connected components of more than one module); exits 1 if there is a loop.
  --mermaid   prints the crate graph and each crate's module graph as mermaid blocks.
  --markdown  prints docs/ARCHITECTURE.md's "Module graphs" section: per crate the layers
              (each module depends only on modules in layers below it) with every module's
              one-line purpose (the first line of its `//!` comment).
"""
import argparse
import os
import re
import sys
import tomllib

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(text):
    """The text with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not re.match(r"\w", text[i - 1]) or text[i - 1] == "b"):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            m = re.match(r"'(\\[^']*|[^'\\\n])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text, open_at):
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


def is_test_attr(text, at):
    """Whether the item starting at `at` carries a #[cfg(...test...)] attribute."""
    before = text[:at]
    m = re.search(r"((?:#\[[^\]]*\]\s*)+)(?:pub(?:\([^)]*\))?\s+)?$", before)
    return bool(m and re.search(r"#\[cfg\([^\]]*\btest\b", m.group(1)))


def parse_use_tree(s):
    """Expands a use tree into (segments, alias); a glob ends in '*'."""
    tokens = re.findall(r"::|\{|\}|,|\*|" + IDENT, s)
    pos = 0

    def tree(prefix):
        nonlocal pos
        out = []
        segs = list(prefix)
        while pos < len(tokens):
            t = tokens[pos]
            if t == "{":
                pos += 1
                while pos < len(tokens) and tokens[pos] != "}":
                    if tokens[pos] == ",":
                        pos += 1
                        continue
                    out.extend(tree(segs))
                pos += 1
                return out
            if t == "*":
                pos += 1
                out.append((segs + ["*"], None))
                return out
            if t == "::":
                pos += 1
                continue
            if t in (",", "}"):
                break
            if t == "as":
                pos += 1
                alias = tokens[pos] if pos < len(tokens) else None
                pos += 1
                out.append((segs, alias))
                return out
            segs.append(t)
            pos += 1
        if segs != list(prefix):
            out.append((segs, None))
        elif segs and segs[-1] != "*":
            out.append((segs, None))  # `{self}` style
        return out

    result = tree([])
    # `a::{self, b}` yields ['a', 'self']: that names module a
    return [(s[:-1] if s and s[-1] == "self" and len(s) > 1 else s, a) for s, a in result]


class Module:
    def __init__(self, path, file, test=False):
        self.path = path  # tuple of segments below the crate root
        self.file = file
        self.test = test
        self.children = set()
        self.doc = ""
        self.defines = set()
        self.reexports = {}  # name -> absolute segments
        self.globs = []  # absolute module segments re-exported with *
        self.uses = []  # (absolute segments) named by code or private use
        self.public_uses = []  # (alias name, absolute segments): used only if the name appears in code


class Crate:
    def __init__(self, name, root):
        self.name = name
        self.root = root
        self.modules = {}  # path tuple -> Module (file modules)
        self.alias = {}  # inline module path -> file module path
        self.lib_name = name.replace("-", "_")


def module_file(dir_, name):
    for cand in (os.path.join(dir_, name + ".rs"), os.path.join(dir_, name, "mod.rs")):
        if os.path.exists(cand):
            return cand
    return None


def absolute(segs, here):
    """Resolves a path's leading crate/self/super against the module `here`."""
    segs = list(segs)
    if not segs:
        return None
    if segs[0] == "crate":
        return segs[1:]
    if segs[0] == "self":
        return list(here) + segs[1:]
    if segs[0] == "super":
        base = list(here)
        while segs and segs[0] == "super":
            if not base:
                return None
            base.pop()
            segs.pop(0)
        if segs and segs[0] == "self":
            segs.pop(0)
        return base + segs
    return None


def purpose(raw):
    """The first sentence of a module's `//!` comment."""
    lines = []
    for ln in raw.splitlines():
        if not ln.startswith("//!"):
            if lines or ln.strip():
                break
            continue
        text = ln[3:].strip()
        if not text:
            if lines:
                break
            continue
        lines.append(text)
    para = " ".join(lines)
    m = re.search(r"^(.*?[a-z0-9)`'\]]\.)(\s|$)", para)
    return (m.group(1) if m else para) if para else ""


def load_file(crate, path, file, test, bin_root=False):
    mod = Module(path, file, test)
    crate.modules[path] = mod
    raw = open(file, encoding="utf-8").read()
    mod.doc = purpose(raw)
    text = strip(raw)
    dir_ = os.path.dirname(file)
    if not (file.endswith("mod.rs") or file.endswith("lib.rs") or file.endswith("main.rs")):
        dir_ = os.path.join(dir_, os.path.splitext(os.path.basename(file))[0])

    # Inline modules: test ones are cut out, others are namespaces of this file's node.
    regions = []  # (start, end, inline path, test)
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
        regions.append((m.start(), matching_brace(text, m.end() - 1), m.group(1), is_test_attr(text, m.start())))

    def scope(at):
        inner = list(path)
        for start, end, name, t in regions:
            if start <= at <= end:
                if t:
                    return None
                inner.append(name)
        return tuple(inner)

    for start, end, name, t in regions:
        if not t and scope(start) is not None:
            crate.alias[tuple(list(scope(start)) + [name])] = path

    # File modules declared here.
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*;", text):
        if scope(m.start()) is None:
            continue
        name = m.group(1)
        child = module_file(dir_, name)
        if child is None:
            continue
        child_test = test or is_test_attr(text, m.start())
        mod.children.add(name)
        load_file(crate, path + (name,), child, child_test)

    for m in re.finditer(r"\b(?:fn|struct|enum|trait|type|const|static|union|mod)\s+(" + IDENT + ")", text):
        mod.defines.add(m.group(1))
    for m in re.finditer(r"macro_rules!\s*(" + IDENT + ")", text):
        mod.defines.add(m.group(1))

    def first_relative(segs, here):
        # A path that starts at a child module of `here` (2018 paths), or at the crate's own
        # library from its binary.
        if bin_root and segs and segs[0] == crate.lib_name:
            return ["LIB"] + segs[1:]
        if segs and segs[0] not in ("crate", "self", "super"):
            hm = crate.modules.get(crate.alias.get(tuple(here), tuple(here)))
            if hm and tuple(here) == hm.path and segs[0] in hm.children:
                return list(here) + segs
            return None
        return absolute(segs, here)

    use_spans = []
    for m in re.finditer(r"\b(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);", text):
        use_spans.append((m.start(), m.end()))
        here = scope(m.start())
        if here is None:
            continue
        public = m.group(1) is not None
        for segs, alias in parse_use_tree(m.group(2)):
            target = first_relative(segs, here)
            if target is None:
                if public and segs and segs[-1] != "*":
                    mod.reexports[alias or segs[-1]] = ["EXTERN"] + segs
                continue
            if public:
                if segs[-1] == "*":
                    mod.globs.append(target[:-1])
                    mod.public_uses.append(("*", target))
                else:
                    name = alias or target[-1]
                    mod.reexports[name] = target
                    mod.public_uses.append((name, target))
            else:
                mod.uses.append(target)

    code = list(text)
    for s, e in use_spans:
        code[s:e] = " " * (e - s)
    code = "".join(code)
    for name, target in mod.public_uses:
        if name != "*" and re.search(r"(?<![\w:])" + re.escape(name) + r"\b", code):
            mod.uses.append(target)

    # Paths written out in code.
    path_re = re.compile(r"(?<![\w:$])((?:" + IDENT + r")(?:::" + IDENT + r")+)")
    for m in path_re.finditer(code):
        here = scope(m.start())
        if here is None:
            continue
        segs = m.group(1).split("::")
        target = first_relative(segs, here)
        if target is not None:
            mod.uses.append(target)


def resolve(crate, segs, depth=0):
    """The file module that defines what `segs` (absolute) names, or None if external."""
    if segs is None or depth > 16 or (segs and segs[0] == "EXTERN"):
        return None
    if segs and segs[0] == "LIB":
        return resolve(crate, segs[1:], depth + 1) if crate.has_lib else None
    best, rest = (), list(segs)
    for k in range(len(segs), -1, -1):
        key = tuple(segs[:k])
        if key in crate.modules or key in crate.alias:
            best, rest = crate.alias.get(key, key), list(segs[k:])
            break
    mod = crate.modules.get(best)
    if mod is None:
        return None
    if rest and rest[0] != "*":
        name = rest[0]
        if name in mod.reexports:
            return resolve(crate, mod.reexports[name] + rest[1:], depth + 1)
        if name not in mod.defines:
            for g in mod.globs:
                src = resolve(crate, g, depth + 1)
                if src is not None and name in crate.modules[src].defines:
                    return resolve(crate, list(src) + rest, depth + 1)
    return best


def load_crate(dir_):
    with open(os.path.join(dir_, "Cargo.toml"), "rb") as f:
        manifest = tomllib.load(f)
    name = manifest["package"]["name"]
    crate = Crate(name, dir_)
    crate.manifest = manifest
    lib = os.path.join(dir_, manifest.get("lib", {}).get("path", "src/lib.rs"))
    crate.has_lib = os.path.exists(lib)
    if crate.has_lib:
        load_file(crate, (), lib, False)
    main = os.path.join(dir_, "src/main.rs")
    if os.path.exists(main):
        sub = Crate(name, dir_)
        sub.lib_name = crate.lib_name
        load_file(sub, (), main, False, bin_root=True)
        for p, m in sub.modules.items():
            m.path = ("main",) + p
            crate.modules[("main",) + p] = m
            # the binary's own paths stay inside the binary; LIB paths go to the library
            m.uses = [(["LIB"] + u[1:]) if u and u[0] == "LIB" else ["main"] + u for u in m.uses]
        for k, v in sub.alias.items():
            crate.alias[("main",) + k] = ("main",) + v
    return crate


def graph(crate):
    edges = {p: set() for p, m in crate.modules.items() if not m.test}
    for p, m in crate.modules.items():
        if m.test:
            continue
        for u in m.uses:
            t = resolve(crate, u)
            if t is not None and t != p and t in edges:
                edges[p].add(t)
    return edges


def sccs(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layers(edges):
    """Each module's layer: 0 for a module that depends on none, else 1 + its deepest dependency."""
    memo = {}

    def level(v, seen=()):
        if v in memo:
            return memo[v]
        if v in seen:
            return 0
        memo[v] = 1 + max((level(w, seen + (v,)) for w in edges[v]), default=-1)
        return memo[v]

    return {v: level(v) for v in edges}


def label(path):
    return "::".join(path) if path else "(root)"


def crate_deps(crates):
    names = {c.name for c in crates}
    out = {}
    for c in crates:
        deps = set()
        for k in ("dependencies",):
            for d, spec in c.manifest.get(k, {}).items():
                real = spec.get("package", d) if isinstance(spec, dict) else d
                if real in names:
                    deps.add(real)
        out[c.name] = deps
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--mermaid", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        members = tomllib.load(f)["workspace"]["members"]
    crates = [load_crate(os.path.join(root, m)) for m in members]
    deps = crate_deps(crates)
    loops = []

    if args.mermaid or args.markdown:
        print("```mermaid\ngraph BT")
        for c in crates:
            for d in sorted(deps[c.name]):
                print(f"  {c.name.replace('-', '_')}[{c.name}] --> {d.replace('-', '_')}[{d}]")
        print("```")
    for c in crates:
        edges = graph(c)
        comps = [s for s in sccs(edges) if len(s) > 1]
        loops.extend((c.name, s) for s in comps)
        if args.mermaid:
            print(f"\n{c.name}:\n\n```mermaid\ngraph BT")
            ids = {p: "m_" + ("_".join(p) or "root") for p in edges}
            for p in sorted(edges):
                print(f"  {ids[p]}[{label(p)}]")
                for t in sorted(edges[p]):
                    print(f"  {ids[p]} --> {ids[t]}")
            print("```")
        elif args.markdown:
            lv = layers(edges)
            print(f"\n#### `{c.name}`\n")
            print("| layer | module | purpose | depends on |")
            print("| --- | --- | --- | --- |")
            for p in sorted(edges, key=lambda p: (lv[p], p)):
                dep = ", ".join(f"`{label(t)}`" for t in sorted(edges[p])) or "–"
                print(f"| {lv[p]} | `{label(p)}` | {c.modules[p].doc.replace('|', '/')} | {dep} |")
        else:
            print(f"crate {c.name} -> {', '.join(sorted(deps[c.name])) or '(no workspace crates)'}")
            for p in sorted(edges):
                print(f"  {label(p)} -> {', '.join(label(t) for t in sorted(edges[p])) or '-'}")
    if loops:
        for name, comp in loops:
            print(f"LOOP in crate {name}: {' <-> '.join(label(p) for p in comp)}", file=sys.stderr)
        sys.exit(1)
    if not (args.mermaid or args.markdown):
        print("no module loops")


if __name__ == "__main__":
    main()
