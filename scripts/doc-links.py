#!/usr/bin/env python3
"""Checks the links between the project's Markdown files: every relative
link names a file that exists and, with `#anchor`, a heading in it (GitHub's
slugs). Prints each broken link; exits 1 if any.
  scripts/doc-links.py"""
import os
import re
import subprocess
import sys

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.*)$", re.M)


def slug(heading):
    h = re.sub(r"`|\*|_{2}", "", heading.strip().lower())
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        text = open(path, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        found, seen = set(), {}
        for h in HEADING.findall(text):
            s = slug(h)
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        cache[path] = found
    return cache[path]


files = subprocess.run(
    ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], capture_output=True, text=True, check=True
).stdout.split()
bad = 0
for f in files:
    text = re.sub(r"```.*?```", "", open(f, encoding="utf-8").read(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
        if not os.path.exists(dest):
            print(f"{f}: {target}: no such file")
            bad += 1
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            print(f"{f}: {target}: no such heading")
            bad += 1
if bad:
    sys.exit(1)
print(f"doc links: {len(files)} Markdown files, every relative link resolves")
