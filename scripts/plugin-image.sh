#!/usr/bin/env bash
# The tether plugin as an OCI image, in the layout Istio's WasmPlugin and
# Envoy Gateway's EnvoyExtensionPolicy pull (plugin.wasm alone at the root of
# one layer), two ways, each read back and checked (scripts/plugin_image.py):
#   1. an OCI image layout archive written directly, reproducibly, with the
#      Wasm image spec's compat annotation and gzip layer, ready for
#      `skopeo copy oci-archive:...` or `crane push`; loaded into the Docker
#      engine and saved back out, the same module in the same layer;
#   2. `docker build` of plugin/image/Dockerfile (FROM scratch), what
#      `docker push` sends, saved and checked.
# No registry is reachable here: nothing is pushed (plugin/README.md shows the
# push and the WasmPlugin / EnvoyExtensionPolicy to use it).
#   scripts/plugin-image.sh        -> target/plugin-image/tether-plugin-oci.tar
# With no usable engine, step 1's archive is still written and checked; the
# engine's part says so loudly and is skipped, unless CI=true, where it fails.
set -euo pipefail
cd "$(dirname "$0")/.."

version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
tag="tether-local/tether-plugin:$version"
out=target/plugin-image
wasm=target/wasm32-wasip1/wasm/tether_plugin.wasm
say() { echo "plugin-image: $*" >&2; }

cargo build --quiet -p tether-plugin --target wasm32-wasip1 --profile wasm
mkdir -p "$out"
work="$(mktemp -d)"
image_built=""
cleanup() {
  rm -rf "$work"
  for t in $image_built; do docker rmi -f "$t" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

python3 scripts/plugin_image.py write "$wasm" "$out/tether-plugin-oci.tar" --tag "$tag"
written="$(python3 scripts/plugin_image.py check "$out/tether-plugin-oci.tar" "$wasm" --oci)"
echo "$written"
diff_id() { sed -n 's/.*diff_id \(sha256:[0-9a-f]*\).*/\1/p' <<<"$1"; }
# The same archive twice is the same bytes (the digest a WasmPlugin pins).
python3 scripts/plugin_image.py write "$wasm" "$work/again.tar" --tag "$tag" >/dev/null
cmp -s "$out/tether-plugin-oci.tar" "$work/again.tar" || { say "the archive is not reproducible"; exit 1; }
python3 scripts/plugin_image.py selftest "$wasm" "$work"

if ! docker info >/dev/null 2>&1; then
  say "********** SKIPPED: no Docker engine answers (docker info failed): the engine's load, build and save **********"
  [ "${CI:-}" = true ] && { say "CI=true, so this is a failure"; exit 1; }
  exit 0
fi

# 1. The engine loads the archive as it is, and saves the same module back.
loaded="tether-local/tether-plugin-oci-check:$$"
docker load -q -i "$out/tether-plugin-oci.tar" >/dev/null
docker tag "$tag" "$loaded"
docker rmi "$tag" >/dev/null
image_built="$loaded"
docker save -o "$work/loaded.tar" "$loaded"
saved="$(python3 scripts/plugin_image.py check "$work/loaded.tar" "$wasm")"
echo "$saved"
if [ "$(diff_id "$saved")" != "$(diff_id "$written")" ]; then
  say "the engine saved another layer ($(diff_id "$saved")) than the archive's ($(diff_id "$written"))"
  exit 1
fi

# 2. docker build FROM scratch, saved back.
built="tether-local/tether-plugin-build-check:$$"
mkdir "$work/context"
cp "$wasm" "$work/context/plugin.wasm"
cp plugin/image/Dockerfile "$work/context/Dockerfile"
# The legacy builder's deprecation notice is noise unless the build fails.
if ! log="$(docker build --quiet -t "$built" "$work/context" 2>&1)"; then
  say "docker build failed: $log"
  exit 1
fi
image_built="$image_built $built"
docker save -o "$work/built.tar" "$built"
python3 scripts/plugin_image.py check "$work/built.tar" "$wasm"
say "ok: $out/tether-plugin-oci.tar ($tag) and plugin/image/Dockerfile both carry the plugin as Istio and Envoy Gateway read it"
