#!/usr/bin/env python3
"""Import cycles in a Rust crate: between its top-level modules, and
between the files of each module.

usage: filecycles.py SRC_DIR
A file's references (`crate::a::b`, `super::x`, `self::x`) are resolved to
the file that defines the longest matching module path.
* Top-level modules (`src/proxy/`, `src/acp/`, `src/pidfd.rs`, ...): a
  reference from a file of one to another is an edge between the two; the
  layers docs/architecture.md draws must form no cycle (the crate root,
  lib.rs/main.rs, is left out: it declares them all).
* Inside each module, edges between a module file and its own descendants
  (`mod.rs` and what it declares) are left out: a parent re-exporting its
  children and children using their parent's types is the usual shape.
  What remains must form no cycle.
`#[cfg(test)]` modules are left out. Exits 1 on a cycle; scripts/test.sh
runs it on both crates.
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
    top_edges = {}
    for mod, p in files.items():
        if len(mod) < 1 or mod in (("lib",), ("main",)):
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
            if r and r[0] != mod[0] and (r[0],) in files:
                top_edges.setdefault((mod[0],), set()).add((r[0],))
            if len(mod) < 2:
                continue
            t = resolve(r)
            if t is None or t == mod or t[0] != mod[0]:
                continue
            if t == mod[: len(t)] or mod == t[: len(mod)]:
                continue  # ancestor / descendant
            edges.setdefault(mod, set()).add(t)
    name = lambda m: "::".join(m)
    status = 0
    for what, graph in (("module", top_edges), ("file", edges)):
        comps = cycles(graph)
        for comp in comps:
            detail = [f"{name(a)}->{name(b)}" for a in comp for b in sorted(graph.get(a, ())) if b in comp]
            print(f"{what} cycle: {' '.join(map(name, comp))} ({', '.join(detail)})")
        count = len({m[0] for m in files if m not in (("lib",), ("main",))}) if what == "module" else len(files)
        print(f"{len(comps)} {what}-level cycle(s) among {count} {what}s of {src}")
        status |= 1 if comps else 0
    return status

def cycles(edges):
    """The strongly connected components of more than one node (Tarjan)."""
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
    return out

if __name__ == "__main__":
    sys.exit(main())
