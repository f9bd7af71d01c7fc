#!/usr/bin/env python3
"""The tether plugin as an OCI image, the way Istio's WasmPlugin and Envoy
Gateway's EnvoyExtensionPolicy pull a Wasm module (their "compat" variant:
an image FROM scratch whose one layer holds `plugin.wasm` at its root).

  plugin_image.py write WASM ARCHIVE --tag NAME:VERSION
      Writes an OCI image layout as a tar (oci-layout, index.json,
      blobs/sha256/...): one gzip layer with plugin.wasm, a linux/amd64
      config (the platform a registry client picks by default), and the
      manifest annotation module.wasm.image/variant=compat that the Wasm
      image spec asks of OCI-typed compat images. The same archive carries
      Docker's manifest.json, so `docker load` takes it as it is.
      Byte for byte reproducible: fixed times, owners and gzip header.
  plugin_image.py check ARCHIVE WASM [--oci]
      Reads an image archive back (an OCI layout, or `docker save`'s
      manifest.json form) and checks it: every blob's sha256 is its name,
      one layer, the layer's only file is plugin.wasm at the root with
      WASM's bytes, the config's diff_id is the layer's uncompressed
      digest; with --oci also the media types and the compat annotation.
      Prints the digests.
  plugin_image.py selftest WASM
      Writes an archive, then damages copies of it (a layer byte, the file's
      name, a second layer, the annotation) and shows that check refuses
      each: the check can fail.
Standard library only."""

import argparse
import gzip
import hashlib
import io
import json
import sys
import tarfile

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
VARIANT = "module.wasm.image/variant"
WASM_NAME = "plugin.wasm"


class Refused(Exception):
    """The archive is not the image it should be."""


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def tar_bytes(files):
    """A tar of (name, bytes) with fixed metadata, so it is reproducible."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write(wasm_path, archive, tag):
    wasm = open(wasm_path, "rb").read()
    if not wasm.startswith(b"\0asm"):
        raise Refused(f"{wasm_path}: not a Wasm module (no \\0asm header)")
    name, _, version = tag.rpartition(":")
    if not name or not version:
        raise Refused(f"--tag {tag!r}: expected NAME:VERSION")
    layer_tar = tar_bytes([(WASM_NAME, wasm)])
    # mtime=0 and no file name in the gzip header: the same bytes every time.
    layer = gzip.compress(layer_tar, compresslevel=9, mtime=0)
    config = canonical(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Labels": {
                    "org.opencontainers.image.title": "tether-plugin",
                    "org.opencontainers.image.version": version,
                    "org.opencontainers.image.description": "tether's proxy-wasm session affinity filter for Envoy",
                }
            },
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha256(layer_tar)]},
            "history": [{"created_by": f"COPY {WASM_NAME} /", "created": "1970-01-01T00:00:00Z"}],
            "created": "1970-01-01T00:00:00Z",
        }
    )
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": "sha256:" + sha256(config), "size": len(config)},
            "layers": [
                {
                    "mediaType": LAYER_GZIP,
                    "digest": "sha256:" + sha256(layer),
                    "size": len(layer),
                    "annotations": {"org.opencontainers.image.title": WASM_NAME},
                }
            ],
            "annotations": {
                VARIANT: "compat",
                "org.opencontainers.image.title": "tether-plugin",
                "org.opencontainers.image.version": version,
            },
        }
    )
    index = canonical(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": "sha256:" + sha256(manifest),
                    "size": len(manifest),
                    "annotations": {"org.opencontainers.image.ref.name": version},
                }
            ],
        }
    )
    blob = lambda data: f"blobs/sha256/{sha256(data)}"
    # Docker's own index of the archive, for `docker load` (engines before
    # 25 read only this).
    docker = canonical(
        [{"Config": blob(config), "RepoTags": [tag], "Layers": [blob(layer)]}]
    )
    files = [
        ("oci-layout", canonical({"imageLayoutVersion": "1.0.0"})),
        ("index.json", index),
        ("manifest.json", docker),
        (blob(config), config),
        (blob(layer), layer),
        (blob(manifest), manifest),
    ]
    with open(archive, "wb") as f:
        f.write(tar_bytes(files))
    return sha256(manifest)


def read_archive(archive):
    with tarfile.open(archive) as t:
        return {m.name.lstrip("./"): t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


def check(archive, wasm_path, oci):
    files = read_archive(archive)
    wasm = open(wasm_path, "rb").read()
    for path, data in files.items():
        if path.startswith("blobs/sha256/") and sha256(data) != path.rsplit("/", 1)[1]:
            raise Refused(f"{path}: its content's sha256 is {sha256(data)}")

    def blob(digest):
        if not digest.startswith("sha256:"):
            raise Refused(f"digest {digest!r} is not sha256")
        path = "blobs/sha256/" + digest[len("sha256:"):]
        if path not in files:
            raise Refused(f"blob {digest} is not in the archive")
        return files[path]

    if oci or "index.json" in files:
        index = json.loads(files["index.json"])
        if len(index.get("manifests", [])) != 1:
            raise Refused(f"index.json lists {len(index.get('manifests', []))} manifests, not one")
        desc = index["manifests"][0]
        manifest_bytes = blob(desc["digest"])
        manifest = json.loads(manifest_bytes)
        if oci:
            if desc.get("mediaType") != MANIFEST or manifest.get("mediaType") != MANIFEST:
                raise Refused(f"manifest media type {manifest.get('mediaType')!r}, not {MANIFEST}")
            if manifest.get("annotations", {}).get(VARIANT) != "compat":
                raise Refused(f"the manifest has no annotation {VARIANT}=compat")
            if manifest["config"].get("mediaType") != CONFIG:
                raise Refused(f"config media type {manifest['config'].get('mediaType')!r}")
            for l in manifest["layers"]:
                if l.get("mediaType") != LAYER_GZIP:
                    raise Refused(f"layer media type {l.get('mediaType')!r}, not {LAYER_GZIP} (Istio reads only that)")
        layers = [blob(l["digest"]) for l in manifest["layers"]]
        config = json.loads(blob(manifest["config"]["digest"]))
        manifest_digest = sha256(manifest_bytes)
    else:
        entries = json.loads(files["manifest.json"])
        if len(entries) != 1:
            raise Refused(f"manifest.json lists {len(entries)} images, not one")
        layers = [files[p] for p in entries[0]["Layers"]]
        config = json.loads(files[entries[0]["Config"]])
        manifest_digest = None
    if len(layers) != 1:
        raise Refused(f"{len(layers)} layers, not one")
    layer = layers[0]
    layer_tar = gzip.decompress(layer) if layer[:2] == b"\x1f\x8b" else layer
    diff_ids = config.get("rootfs", {}).get("diff_ids", [])
    if diff_ids != ["sha256:" + sha256(layer_tar)]:
        raise Refused(f"config diff_ids {diff_ids} are not the layer's sha256:{sha256(layer_tar)}")
    with tarfile.open(fileobj=io.BytesIO(layer_tar)) as t:
        members = [m for m in t.getmembers() if not m.isdir()]
        names = [m.name.lstrip("./").lstrip("/") for m in members]
        if names != [WASM_NAME]:
            raise Refused(f"the layer holds {names}, not {WASM_NAME} alone at its root")
        got = t.extractfile(members[0]).read()
    if got != wasm:
        raise Refused(f"{WASM_NAME} in the layer (sha256 {sha256(got)}) is not {wasm_path} (sha256 {sha256(wasm)})")
    print(f"plugin-image: {archive}: one layer, {WASM_NAME} = {wasm_path} ({len(wasm)} bytes, sha256 {sha256(wasm)})")
    print(f"plugin-image:   layer sha256:{sha256(layer)} ({'gzip' if layer is not layer_tar else 'tar'}), diff_id sha256:{sha256(layer_tar)}")
    if manifest_digest:
        print(f"plugin-image:   manifest sha256:{manifest_digest}")


def selftest(wasm_path, workdir):
    import os
    good = os.path.join(workdir, "good.tar")
    write(wasm_path, good, "selftest/plugin:0")
    check(good, wasm_path, oci=True)
    files = read_archive(good)
    index = json.loads(files["index.json"])
    manifest = json.loads(files["blobs/sha256/" + index["manifests"][0]["digest"][7:]])
    layer_path = "blobs/sha256/" + manifest["layers"][0]["digest"][7:]

    def damaged(label, change, expect):
        bad = dict(files)
        change(bad)
        path = os.path.join(workdir, "bad.tar")
        with open(path, "wb") as f:
            f.write(tar_bytes(sorted(bad.items())))
        try:
            check(path, wasm_path, oci=True)
        except Refused as e:
            if expect not in str(e):
                raise SystemExit(f"selftest: {label}: refused for another reason: {e}")
            print(f"plugin-image: selftest: {label}: refused ({e})")
            return
        raise SystemExit(f"selftest: {label}: the check accepted a damaged archive")

    def flip_layer(b):
        data = bytearray(b[layer_path])
        data[len(data) // 2] ^= 1
        b[layer_path] = bytes(data)

    def rebuild(b, layer_files, annotations=None):
        """A consistent archive (digests right) whose layer holds layer_files."""
        layer_tar = tar_bytes(layer_files)
        layer = gzip.compress(layer_tar, mtime=0)
        config = json.loads(b["blobs/sha256/" + manifest["config"]["digest"][7:]])
        config["rootfs"]["diff_ids"] = ["sha256:" + sha256(layer_tar)]
        config = canonical(config)
        m = dict(manifest)
        m["config"] = dict(m["config"], digest="sha256:" + sha256(config), size=len(config))
        m["layers"] = [dict(m["layers"][0], digest="sha256:" + sha256(layer), size=len(layer))]
        if annotations is not None:
            m["annotations"] = annotations
        m = canonical(m)
        for k in [k for k in b if k.startswith("blobs/")]:
            del b[k]
        b["blobs/sha256/" + sha256(config)] = config
        b["blobs/sha256/" + sha256(layer)] = layer
        b["blobs/sha256/" + sha256(m)] = m
        i = dict(index)
        i["manifests"] = [dict(index["manifests"][0], digest="sha256:" + sha256(m), size=len(m))]
        b["index.json"] = canonical(i)

    wasm = open(wasm_path, "rb").read()
    damaged("a layer byte flipped", flip_layer, "its content's sha256")
    damaged("the module named tether.wasm", lambda b: rebuild(b, [("tether.wasm", wasm)]), "not plugin.wasm alone")
    damaged("another module's bytes", lambda b: rebuild(b, [(WASM_NAME, wasm[:-1] + b"\0")]), "is not")
    damaged("a second file", lambda b: rebuild(b, [(WASM_NAME, wasm), ("extra", b"x")]), "not plugin.wasm alone")
    damaged("no compat annotation", lambda b: rebuild(b, [(WASM_NAME, wasm)], {}), "module.wasm.image/variant")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("wasm")
    w.add_argument("archive")
    w.add_argument("--tag", required=True)
    c = sub.add_parser("check")
    c.add_argument("archive")
    c.add_argument("wasm")
    c.add_argument("--oci", action="store_true")
    s = sub.add_parser("selftest")
    s.add_argument("wasm")
    s.add_argument("workdir")
    a = p.parse_args()
    try:
        if a.cmd == "write":
            digest = write(a.wasm, a.archive, a.tag)
            print(f"plugin-image: wrote {a.archive} ({a.tag}, manifest sha256:{digest})")
        elif a.cmd == "check":
            check(a.archive, a.wasm, a.oci)
        else:
            selftest(a.wasm, a.workdir)
    except Refused as e:
        print(f"plugin-image: {a.archive if a.cmd == 'check' else a.wasm}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
