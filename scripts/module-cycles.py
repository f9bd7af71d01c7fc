#!/usr/bin/env python3
"""Module cycles inside a crate: two sibling modules that use each other,
directly or through other siblings. Each .rs file is a module; a use of
`crate::a::b` or `super::x` from module M counts as an edge between the two
children of their closest common ancestor (a parent using its child, or a
child its parent, is no cycle). Prints every cycle; exits 1 if any.
  scripts/module-cycles.py SRC_DIR [SRC_DIR...]"""
import os
import re
import sys

REF = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src."""
    out = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            out[tuple(rel)] = os.path.join(root, f)
    return out


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def resolve(mods, base, segs):
    """The longest module prefix of base + segs that exists."""
    path = tuple(base) + tuple(segs)
    while path and path not in mods:
        path = path[:-1]
    return path


def cycles(src):
    mods = modules(src)
    edges = {}
    for m, f in mods.items():
        if m and m[-1] == "tests":
            continue  # a test module (`#[cfg(test)] mod tests;`)
        text = strip_comments(open(f, encoding="utf-8").read())
        # Test modules may reach anywhere.
        text = text.split("#[cfg(test)]")[0]
        for kind, rest in REF.findall(text):
            segs = [s for s in rest.split("::") if s]
            if kind == "crate":
                base = ()
            else:
                # super:: from a file module refers to its parent.
                ups = 1
                while segs and segs[0] == "super":
                    ups += 1
                    segs = segs[1:]
                base = m[: max(0, len(m) - ups)]
            target = resolve(mods, base, segs)
            a, b = m, target
            i = 0
            while i < min(len(a), len(b)) and a[i] == b[i]:
                i += 1
            if i == len(a) or i == len(b):
                continue  # ancestor and descendant
            edges.setdefault(a[: i + 1], set()).add(b[: i + 1])
    # Strongly connected components (Tarjan).
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return comps


found = 0
for src in sys.argv[1:]:
    for comp in cycles(src):
        found += 1
        print(f"{src}: " + " <-> ".join("::".join(c) for c in comp))
if found:
    sys.exit(1)
print(f"no module cycles in {', '.join(sys.argv[1:])}")
