#!/usr/bin/env python3
"""Import cycles between the files of one module of a Rust crate.

usage: filecycles.py SRC_DIR
Complements a check of cycles between top-level modules: inside each
module, a file's references (`crate::a::b`, `super::x`, `self::x`) are
resolved to the file that defines the longest matching module path. Edges
between a module file and its own descendants (`mod.rs` and what it
declares) are left out: a parent re-exporting its children and children
using their parent's types is the usual shape. What remains must form no
cycle. `#[cfg(test)]` modules are left out. Exits 1 on a cycle.
"""
import os, re, sys

def strip(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = "\n".join(l.split("//", 1)[0] if '"' not in l.split("//", 1)[0] else l for l in text.splitlines())
    m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
    return text[: m.start()] if m else text

def modpath(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(parts)

def main():
    src = sys.argv[1]
    files = {}
    for dirpath, _, names in os.walk(src):
        if "/tests" in dirpath or dirpath.endswith("tests"):
            continue
        for f in names:
            if f.endswith(".rs"):
                p = os.path.join(dirpath, f)
                files[modpath(os.path.relpath(p, src))] = p
    def resolve(path):
        for n in range(len(path), 0, -1):
            if tuple(path[:n]) in files:
                return tuple(path[:n])
        return None
    edges = {}
    for mod, p in files.items():
        if len(mod) < 2:
            continue
        text = strip(open(p, encoding="utf-8", errors="replace").read())
        refs = []
        for m in re.finditer(r"\b(crate|super|self)((?:::(?:super|[a-z_][a-z0-9_]*))+)", text):
            head, rest = m.group(1), m.group(2).split("::")[1:]
            # A file's own module is `mod` (for foo.rs and foo/mod.rs alike).
            base = [] if head == "crate" else list(mod) if head == "self" else list(mod[:-1])
            for r in rest:
                if r == "super":
                    base = base[:-1]
                else:
                    base.append(r)
            refs.append(base)
        # `use` groups: `use super::{a, b::c}` -> each name.
        for m in re.finditer(r"\b(crate|super)::\{([^}]*)\}", text):
            base = [] if m.group(1) == "crate" else list(mod[:-1])
            for name in m.group(2).split(","):
                name = name.strip().split(" ")[0]
                if name:
                    refs.append(base + name.split("::"))
        for r in refs:
            t = resolve(r)
            if t is None or t == mod or t[0] != mod[0]:
                continue
            if t == mod[: len(t)] or mod == t[: len(mod)]:
                continue  # ancestor / descendant
            edges.setdefault(mod, set()).add(t)
    index, low, stack, on, out, i = {}, {}, [], set(), [], [0]
    def sc(v):
        index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                sc(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            sc(v)
    name = lambda m: "::".join(m)
    for comp in out:
        detail = [f"{name(a)}->{name(b)}" for a in comp for b in sorted(edges.get(a, ())) if b in comp]
        print(f"cycle: {' '.join(map(name, comp))} ({', '.join(detail)})")
    print(f"{len(out)} file-level cycle(s) among {len(files)} files of {src}")
    return 1 if out else 0

if __name__ == "__main__":
    sys.exit(main())
