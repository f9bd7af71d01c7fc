#!/usr/bin/env python3
"""The public API of tether's library crates, as a sorted text listing from
rustdoc's JSON output: every public item's path and kind; functions and
methods (trait methods too) with their signature; structs' public fields and
enums' variants; trait impls as `impl Trait for Type` lines (auto traits and
blanket impls left out). An item reachable at several paths is listed in
full at its shortest one, and each other path that names it directly is a
`pub use OTHER = SHORTEST` line. `#[doc(hidden)]` items are public too: they
are listed, marked.
  scripts/public-api.py check   compare with the checked-in listings; exit 1 on a difference
  scripts/public-api.py write   regenerate them (when the change is meant)
rustdoc JSON is unstable: it is made on the stable toolchain with
RUSTC_BOOTSTRAP=1, in target/public-api (the main build cache stays valid)."""
import difflib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_DIR = os.path.join("target", "public-api")

# (package, crate name, listing, extra cargo arguments). tether-core's
# `regex` feature is part of its API (tether-xds and tether turn it on); the
# channel's `internals` feature promises nothing and stays off.
CRATES = [
    ("tether", "tether", "native/channel/public-api.txt", []),
    ("tether-xds", "tether_xds", "native/xds/public-api.txt", []),
    ("tether-core", "tether_core", "core/public-api.txt", ["--features", "regex"]),
]

# Left out: auto traits (rustdoc's synthetic impls, or written by hand) and
# the markers the compiler's derives add (unstable, they come and go with the
# toolchain).
LEFT_OUT_TRAITS = {"Send", "Sync", "Unpin", "UnwindSafe", "RefUnwindSafe", "Freeze",
                   "StructuralPartialEq", "TrivialClone"}


def rustdoc_json(package, crate, extra):
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    cmd = ["cargo", "rustdoc", "--quiet", "-p", package, "--lib", "--target-dir", TARGET_DIR, *extra,
           "--", "-Z", "unstable-options", "--output-format", "json", "--document-hidden-items"]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    with open(os.path.join(ROOT, TARGET_DIR, "doc", crate + ".json"), encoding="utf-8") as f:
        return json.load(f)


class Crate:
    def __init__(self, doc):
        self.doc = doc
        self.index = doc["index"]
        self.paths = doc["paths"]
        self.reach = {}     # item id -> {path (tuple) it is reachable at: the module holding it there}
        self.external = {}  # re-export path -> another crate's item id
        self.walk()
        self.preferred = {i: min(ps, key=lambda p: (len(p), p)) for i, ps in self.reach.items()}
        self.preferred_module = dict(self.preferred)
        self.preferred_module[doc["root"]] = (self.item(doc["root"])["name"],)

    def aliases(self, i):
        """The other paths naming item i directly: each in a module at that
        module's own shortest path (not through a re-exported module)."""
        return sorted(p for p, mod in self.reach[i].items()
                      if p != self.preferred[i] and p[:-1] == self.preferred_module[mod])

    # --- reachability -----------------------------------------------------

    def item(self, i):
        return self.index.get(str(i))

    def walk(self):
        root = self.doc["root"]
        stack = [(root, (self.item(root)["name"],))]
        while stack:
            mod, path = stack.pop()
            for child, cpath in self.children(mod, path):
                item = self.item(child)
                if item is None:  # a re-export of another crate's item
                    self.external[cpath] = child
                    continue
                paths = self.reach.setdefault(child, {})
                if cpath in paths:
                    continue
                paths[cpath] = mod
                # A module is walked at every path it has (a bound for
                # modules that re-export an ancestor).
                if "module" in item["inner"] and len(cpath) < 12:
                    stack.append((child, cpath))

    def children(self, mod, path):
        """(id, path) of a module's public items, re-exports followed."""
        for c in self.item(mod)["inner"]["module"]["items"]:
            item = self.item(c)
            if item is None or item["visibility"] != "public":
                continue
            inner = item["inner"]
            if "use" in inner:
                use = inner["use"]
                if use["id"] is None:
                    continue
                if use["is_glob"]:
                    target = self.item(use["id"])
                    if target is not None and "module" in target["inner"]:
                        yield from self.children(use["id"], path)
                    continue
                yield use["id"], path + (use["name"],)
            elif "impl" not in inner and item["name"] is not None:
                yield c, path + (item["name"],)

    # --- rendering --------------------------------------------------------

    def path_of(self, i, written=None):
        """A local item's shortest public path, else rustdoc's path for it."""
        if i in self.preferred:
            return "::".join(self.preferred[i])
        known = self.paths.get(str(i))
        if known is not None:
            return "::".join(known["path"])
        return written or "?"

    def ty(self, t):
        if t is None:
            return "()"
        if isinstance(t, str):  # "infer"
            return "_"
        (kind, v), = t.items()
        if kind == "resolved_path":
            return self.rpath(v)
        if kind == "generic":
            return v
        if kind == "primitive":
            return v
        if kind == "tuple":
            return "(" + ", ".join(self.ty(x) for x in v) + ("," if len(v) == 1 else "") + ")"
        if kind == "slice":
            return "[" + self.ty(v) + "]"
        if kind == "array":
            return "[" + self.ty(v["type"]) + "; " + v["len"] + "]"
        if kind == "pat":
            return self.ty(v["type"]) + " is " + v["__pat_unstable_do_not_use"]
        if kind == "borrowed_ref":
            lt = v["lifetime"] + " " if v["lifetime"] else ""
            return "&" + lt + ("mut " if v["is_mutable"] else "") + self.ty(v["type"])
        if kind == "raw_pointer":
            return ("*mut " if v["is_mutable"] else "*const ") + self.ty(v["type"])
        if kind == "dyn_trait":
            parts = [self.poly_trait(p) for p in v["traits"]]
            if v["lifetime"]:
                parts.append(v["lifetime"])
            return "dyn " + " + ".join(parts)
        if kind == "impl_trait":
            return "impl " + self.bounds(v)
        if kind == "function_pointer":
            hrtb = self.hrtb(v["generic_params"])
            header = self.header(v["header"])
            sig = v["sig"]
            args = ", ".join(self.ty(a) for _, a in sig["inputs"])
            out = "" if sig["output"] is None else " -> " + self.ty(sig["output"])
            return hrtb + header + "fn(" + args + ")" + out
        if kind == "qualified_path":
            self_ty = self.ty(v["self_type"])
            base = "<" + self_ty + " as " + self.rpath(v["trait"]) + ">" if v["trait"] else self_ty
            return base + "::" + v["name"] + self.args(v["args"])
        raise SystemExit(f"public-api: unknown type kind {kind!r} (rustdoc JSON format {self.doc['format_version']})")

    def rpath(self, p):
        return self.path_of(p["id"], p["path"]) + self.args(p["args"])

    def args(self, a):
        if not a:
            return ""
        if isinstance(a, str):  # "return_type_notation"
            return "(..)"
        (kind, v), = a.items()
        if kind == "parenthesized":
            out = "" if v["output"] is None else " -> " + self.ty(v["output"])
            return "(" + ", ".join(self.ty(x) for x in v["inputs"]) + ")" + out
        parts = [self.generic_arg(x) for x in v["args"]]
        for c in v["constraints"]:
            name = c["name"] + self.args(c["args"])
            (bk, bv), = c["binding"].items()
            parts.append(name + (" = " + self.term(bv) if bk == "equality" else ": " + self.bounds(bv)))
        return "<" + ", ".join(parts) + ">" if parts else ""

    def generic_arg(self, x):
        if isinstance(x, str):
            return "_"
        (kind, v), = x.items()
        if kind == "lifetime":
            return v
        if kind == "type":
            return self.ty(v)
        return v.get("expr", "?")  # a constant

    def term(self, t):
        (kind, v), = t.items()
        return self.ty(v) if kind == "type" else v.get("expr", "?")

    def poly_trait(self, p):
        return self.hrtb(p["generic_params"]) + self.rpath(p["trait"])

    def bound(self, b):
        if isinstance(b, str):
            return b
        (kind, v), = b.items()
        if kind == "trait_bound":
            modifier = {"none": "", "maybe": "?", "maybe_const": "~const "}.get(v["modifier"], "")
            return self.hrtb(v["generic_params"]) + modifier + self.rpath(v["trait"])
        if kind == "outlives":
            return v
        if kind == "use":
            return "use<" + ", ".join(x if isinstance(x, str) else next(iter(x.values())) for x in v) + ">"
        return "?"

    def bounds(self, bs):
        return " + ".join(self.bound(b) for b in bs)

    def hrtb(self, params):
        return "for<" + ", ".join(self.param(p) for p in params) + "> " if params else ""

    def param(self, p):
        (kind, v), = p["kind"].items()
        if kind == "lifetime":
            return p["name"] + (": " + " + ".join(v["outlives"]) if v["outlives"] else "")
        if kind == "type":
            s = p["name"] + (": " + self.bounds(v["bounds"]) if v["bounds"] else "")
            return s + (" = " + self.ty(v["default"]) if v["default"] is not None else "")
        s = "const " + p["name"] + ": " + self.ty(v["type"])
        return s + (" = " + v["default"] if v.get("default") else "")

    def generics(self, g):
        params = [self.param(p) for p in g["params"]
                  if not (p["kind"].get("type") or {}).get("is_synthetic")]
        return "<" + ", ".join(params) + ">" if params else ""

    def where(self, g):
        preds = []
        for w in g["where_predicates"]:
            (kind, v), = w.items()
            if kind == "bound_predicate":
                preds.append(self.hrtb(v["generic_params"]) + self.ty(v["type"]) + ": " + self.bounds(v["bounds"]))
            elif kind == "lifetime_predicate":
                preds.append(v["lifetime"] + ": " + " + ".join(v["outlives"]))
            else:
                preds.append(self.ty(v["lhs"]) + " = " + self.term(v["rhs"]))
        return " where " + ", ".join(preds) if preds else ""

    @staticmethod
    def header(h):
        s = ("const " if h["is_const"] else "") + ("async " if h["is_async"] else "")
        s += "unsafe " if h["is_unsafe"] else ""
        abi = h["abi"]
        if abi != "Rust":
            name = abi if isinstance(abi, str) else next(iter(abi))
            s += 'extern "' + name + '" '
        return s

    def fn(self, f, path):
        sig = f["sig"]
        args = []
        for name, t in sig["inputs"]:
            if name == "self":
                if t == {"generic": "Self"}:
                    args.append("self")
                    continue
                ref = t.get("borrowed_ref")
                if ref and ref["type"] == {"generic": "Self"}:
                    lt = ref["lifetime"] + " " if ref["lifetime"] else ""
                    args.append("&" + lt + ("mut " if ref["is_mutable"] else "") + "self")
                    continue
            args.append(name + ": " + self.ty(t))
        out = "" if sig["output"] is None else " -> " + self.ty(sig["output"])
        return (self.header(f["header"]) + "fn " + path + self.generics(f["generics"])
                + "(" + ", ".join(args) + ")" + out + self.where(f["generics"]))

    # --- the listing ------------------------------------------------------

    def hidden(self, item):
        return any("doc(hidden)" in (a if isinstance(a, str) else json.dumps(a)) for a in item["attrs"])

    def listing(self):
        lines = []  # (sort key, line)

        def add(owner, group, line, item=None):
            if item is not None and self.hidden(item):
                line = "#[doc(hidden)] " + line
            lines.append(((owner, group, line), line))

        for i, path in sorted(self.preferred.items(), key=lambda kv: kv[1]):
            item = self.item(i)
            name = "::".join(path)
            for alias in self.aliases(i):
                add(alias, 0, "pub use " + "::".join(alias) + " = " + name)
            self.item_lines(item, path, name, add)
        for path, i in self.external.items():
            known = self.paths.get(str(i))
            target = "::".join(known["path"]) + " (" + known["kind"] + ")" if known else "?"
            add(path, 0, "pub use " + "::".join(path) + " = " + target)
        lines.sort()
        out, seen = [], set()
        for _, line in lines:
            if line not in seen:
                seen.add(line)
                out.append(line)
        return out

    def item_lines(self, item, path, name, add):
        (kind, v), = item["inner"].items()
        ne = "#[non_exhaustive] " if "non_exhaustive" in item["attrs"] else ""
        if kind == "module":
            add(path, 0, "pub mod " + name, item)
        elif kind == "struct":
            g = self.generics(v["generics"]) + self.where(v["generics"])
            sk = v["kind"]
            if sk == "unit":
                add(path, 0, ne + "pub struct " + name + g, item)
            elif "tuple" in sk:
                fields = [self.field(f) for f in sk["tuple"]]
                add(path, 0, ne + "pub struct " + name + self.generics(v["generics"])
                    + "(" + ", ".join(fields) + ")" + self.where(v["generics"]), item)
            else:
                add(path, 0, ne + "pub struct " + name + g, item)
                self.named_fields(sk["plain"]["fields"], path, name, add)
            self.impls(v["impls"], path, name, add)
        elif kind == "enum":
            add(path, 0, ne + "pub enum " + name + self.generics(v["generics"]) + self.where(v["generics"]), item)
            for var in v["variants"]:
                self.variant(self.item(var), path, name, add)
            self.impls(v["impls"], path, name, add)
        elif kind == "union":
            add(path, 0, "pub union " + name + self.generics(v["generics"]) + self.where(v["generics"]), item)
            self.named_fields(v["fields"], path, name, add)
            self.impls(v["impls"], path, name, add)
        elif kind == "trait":
            head = ("pub unsafe trait " if v["is_unsafe"] else "pub trait ") + name + self.generics(v["generics"])
            head += (": " + self.bounds(v["bounds"]) if v["bounds"] else "") + self.where(v["generics"])
            add(path, 0, head, item)
            for m in v["items"]:
                self.assoc(self.item(m), path, name, add, in_trait=True)
            for imp in v["implementations"]:
                self.trait_impl(self.item(imp), path, add)
        elif kind == "function":
            add(path, 0, "pub " + self.fn(v, name), item)
        elif kind == "type_alias":
            add(path, 0, "pub type " + name + self.generics(v["generics"]) + " = " + self.ty(v["type"])
                + self.where(v["generics"]), item)
        elif kind == "constant":
            add(path, 0, "pub const " + name + ": " + self.ty(v["type"]), item)
        elif kind == "static":
            add(path, 0, "pub static " + ("mut " if v["is_mutable"] else "") + name + ": " + self.ty(v["type"]), item)
        elif kind == "macro":
            add(path, 0, "pub macro " + name + "!", item)
        elif kind == "proc_macro":
            add(path, 0, "pub proc_macro " + name + " (" + v["kind"] + ")", item)
        elif kind == "trait_alias":
            add(path, 0, "pub trait " + name + self.generics(v["generics"]) + " = " + self.bounds(v["params"]), item)
        elif kind == "extern_crate":
            add(path, 0, "pub extern crate " + name, item)

    def named_fields(self, ids, path, name, add):
        """A struct's or a union's public fields, a line each."""
        for f in ids:
            field = self.item(f)
            if field is not None and field["visibility"] == "public":
                add(path, 1, "pub " + name + "::" + field["name"] + ": "
                    + self.ty(field["inner"]["struct_field"]), field)

    def field(self, f):
        """A tuple struct's field: its type, or `_` when private."""
        field = self.item(f) if f is not None else None
        if field is None or field["visibility"] != "public":
            return "_"
        return "pub " + self.ty(field["inner"]["struct_field"])

    def variant(self, item, path, name, add):
        v = item["inner"]["variant"]
        vname = name + "::" + item["name"]
        kind = v["kind"]
        if kind == "plain":
            s = vname
        elif "tuple" in kind:
            # A variant's fields are as public as its enum.
            s = vname + "(" + ", ".join("_" if f is None or self.item(f) is None
                                        else self.ty(self.item(f)["inner"]["struct_field"])
                                        for f in kind["tuple"]) + ")"
        else:
            fields = [self.item(f) for f in kind["struct"]["fields"]]
            s = vname + " { " + ", ".join(f["name"] + ": " + self.ty(f["inner"]["struct_field"])
                                          for f in fields if f is not None)
            s += (", .." if kind["struct"]["has_stripped_fields"] else "") + " }"
        if v["discriminant"]:
            s += " = " + v["discriminant"]["expr"]
        ne = "#[non_exhaustive] " if "non_exhaustive" in item["attrs"] else ""
        add(path, 1, ne + "pub " + s, item)

    def assoc(self, item, path, name, add, in_trait=False, prefix=None, where=""):
        """A trait's or an inherent impl's item; `where` is the impl's clause."""
        if item is None or (not in_trait and item["visibility"] != "public"):
            return
        (kind, v), = item["inner"].items()
        full = (prefix or name) + "::" + item["name"]
        if kind == "function":
            line = "pub " + self.fn(v, full)
            if in_trait and v["has_body"]:
                line += " (provided)"
        elif kind == "assoc_type":
            line = "pub type " + full + self.generics(v["generics"])
            line += (": " + self.bounds(v["bounds"]) if v["bounds"] else "")
            line += (" = " + self.ty(v["type"]) if v["type"] is not None else "") + self.where(v["generics"])
        elif kind == "assoc_const":
            line = "pub const " + full + ": " + self.ty(v["type"])
            if in_trait and v["value"] is not None:
                line += " (provided)"
        else:
            return
        add(path, 2, line + where, item)

    def impls(self, ids, path, name, add):
        for i in ids:
            item = self.item(i)
            if item is None:
                continue
            imp = item["inner"]["impl"]
            if imp["is_synthetic"] or imp["blanket_impl"] is not None:
                continue
            if imp["trait"] is None:
                # Inherent methods, named after the type as the impl writes it
                # when it has parameters (`CookieJarService<S>::new`).
                prefix = name
                if imp["generics"]["params"]:
                    prefix = self.ty(imp["for"])
                for m in imp["items"]:
                    self.assoc(self.item(m), path, name, add, prefix=prefix, where=self.where(imp["generics"]))
            else:
                self.trait_impl(item, path, add)

    def trait_impl(self, item, path, add):
        if item is None:
            return
        imp = item["inner"]["impl"]
        if imp["is_synthetic"] or imp["blanket_impl"] is not None:
            return
        if imp["trait"]["path"].split("::")[-1] in LEFT_OUT_TRAITS:
            return
        # An impl for a local type no one can name is not API.
        for_ = imp["for"]
        if "resolved_path" in for_:
            target = for_["resolved_path"]["id"]
            if self.item(target) is not None and target not in self.preferred:
                return
        line = ("unsafe " if imp["is_unsafe"] else "") + "impl" + self.generics(imp["generics"]) + " "
        line += ("!" if imp["is_negative"] else "") + self.rpath(imp["trait"]) + " for " + self.ty(for_)
        line += self.where(imp["generics"])
        assoc = []
        for m in imp["items"]:
            it = self.item(m)
            if it is None:
                continue
            (kind, v), = it["inner"].items()
            if kind == "assoc_type" and v["type"] is not None:
                assoc.append("type " + it["name"] + self.generics(v["generics"]) + " = " + self.ty(v["type"]))
            elif kind == "assoc_const":
                assoc.append("const " + it["name"] + ": " + self.ty(v["type"]))
        if assoc:
            line += " { " + "; ".join(assoc) + " }"
        add(path, 3, line)


FORMAT_VERSION = 57  # rustdoc JSON's format, as of Rust 1.95


def listing(package, crate, extra):
    doc = rustdoc_json(package, crate, extra)
    try:
        lines = Crate(doc).listing()
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SystemExit(f"public-api: cannot read rustdoc JSON format {doc.get('format_version')} "
                         f"(written for {FORMAT_VERSION}; {type(e).__name__}: {e}): update scripts/public-api.py")
    header = (f"# The public API of {package} (rustdoc JSON, sorted): scripts/public-api.py write "
              f"regenerates it, scripts/public-api.py check compares.\n")
    return header + "".join(line + "\n" for line in lines), len(lines)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("check", "write"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    differ = False
    for package, crate, path, extra in CRATES:
        text, count = listing(package, crate, extra)
        full = os.path.join(ROOT, path)
        if mode == "write":
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"{path}: {count} items")
            continue
        try:
            with open(full, encoding="utf-8") as f:
                old = f.read()
        except FileNotFoundError:
            old = ""
        if old != text:
            differ = True
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(keepends=True), text.splitlines(keepends=True),
                fromfile=path + " (checked in)", tofile=path + " (this tree)"))
        else:
            print(f"{path}: {count} items, unchanged")
    if differ:
        print("\npublic-api: the public API changed (above). If the change is meant, run "
              "`scripts/public-api.py write` and commit the listings with it.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
