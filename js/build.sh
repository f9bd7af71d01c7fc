#!/usr/bin/env bash
# Builds the tether-js package into js/pkg:
#   js/pkg/node   CommonJS for Node (>= 18), importable from ES modules too
#   js/pkg/web    an ES module for browsers (call its default export, init, first)
# each with TypeScript declarations, plus js/pkg/package.json.
#
# Steps: the wasm module with cargo (profile "wasm-js": opt-level z, LTO, abort
# on panic); wasm-bindgen-cli at exactly the version of the wasm-bindgen crate
# in Cargo.lock (installed from crates.io into .tools/ when missing); then
# wasm-opt -Oz from binaryen (the PATH's, else npm's when its registry answers,
# else none). Set TETHER_JS_NO_WASM_OPT=1 to skip wasm-opt.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
tools="$repo/.tools"
binaryen_version=132.0.0
cd "$repo"
. "$repo/scripts/retry.sh"

# The module is built without reference types and multivalue (rustc enables
# both by default for wasm32 since 1.82): wasm-bindgen then needs no externref
# table, which older binaryen releases (Debian's 108) rewrite into a module
# that fails to load; every engine runs the result, and it is smaller.
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=-reference-types,-multivalue"
wasm_opt_features="--enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext
  --enable-mutable-globals"

bindgen_version="$(awk '$0 == "name = \"wasm-bindgen\"" { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)"
if [ -z "$bindgen_version" ]; then
  echo "build.sh: no wasm-bindgen in Cargo.lock (run cargo generate-lockfile)" >&2
  exit 1
fi

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  retry rustup target add wasm32-unknown-unknown
fi

bindgen="$tools/bin/wasm-bindgen"
if [ "$("$bindgen" --version 2>/dev/null || true)" != "wasm-bindgen $bindgen_version" ]; then
  echo "build.sh: installing wasm-bindgen-cli $bindgen_version into .tools/" >&2
  # No default features: they only add a TLS stack for the test runner's
  # downloads. --locked first; if the registry lacks a version the published
  # lockfile names, resolve afresh (the CLI's own version stays exact).
  cargo install --locked --no-default-features --root "$tools" wasm-bindgen-cli --version "$bindgen_version" ||
    retry cargo install --no-default-features --root "$tools" wasm-bindgen-cli --version "$bindgen_version"
fi

cargo build -p tether-js --target wasm32-unknown-unknown --profile wasm-js
wasm="$repo/target/wasm32-unknown-unknown/wasm-js/tether_js.wasm"

rm -rf "$here/pkg"
for target in nodejs web; do
  out="$here/pkg/${target%js}"
  # The "wasm-js" profile strips all custom sections, target_features included;
  # wasm-bindgen then warns and assumes the target's default features, which
  # is what the module was built with.
  "$bindgen" --target "$target" --out-dir "$out" "$wasm" 2>&1 |
    { grep -v 'target_features` custom section is missing' || true; } >&2
done
echo '{ "type": "commonjs" }' >"$here/pkg/node/package.json"
echo '{ "type": "module" }' >"$here/pkg/web/package.json"

# wasm-opt: the PATH's first (Debian's binaryen, which scripts/setup.sh
# installs), then one installed from npm into .tools/, then npm itself when its
# registry answers; else the module is built without it.
wasm_opt=""
npm_wasm_opt="$tools/npm/node_modules/.bin/wasm-opt"
if [ "${TETHER_JS_NO_WASM_OPT:-0}" != 1 ]; then
  if command -v wasm-opt >/dev/null; then
    wasm_opt="$(command -v wasm-opt)"
  elif "$npm_wasm_opt" --version 2>/dev/null | grep -q "version ${binaryen_version%%.*}"; then
    wasm_opt="$npm_wasm_opt"
  elif command -v npm >/dev/null &&
    npm view --fetch-retries=0 --fetch-timeout=10000 "binaryen@$binaryen_version" version >/dev/null 2>&1; then
    echo "build.sh: installing binaryen $binaryen_version (wasm-opt) from npm into .tools/npm" >&2
    retry npm install --prefix "$tools/npm" --no-audit --no-fund --no-save "binaryen@$binaryen_version" >&2
    wasm_opt="$npm_wasm_opt"
  fi
  if [ -z "$wasm_opt" ]; then
    echo "build.sh: no wasm-opt (not on the PATH, npm registry unreachable): the module is built without it, about 15 KB larger" >&2
  fi
fi
if [ -n "$wasm_opt" ]; then
  web="$here/pkg/web/tether_js_bg.wasm"
  node="$here/pkg/node/tether_js_bg.wasm"
  for file in "$web" "$node"; do
    # Both targets get the same module; optimise it once.
    if [ "$file" = "$node" ] && cmp -s "$node" "$web.orig"; then
      cp "$web" "$node"
      continue
    fi
    cp "$file" "$file.orig"
    # A wasm-opt that cannot read the module leaves it as wasm-bindgen wrote it.
    if ! "$wasm_opt" -Oz --converge --strip-debug --strip-producers $wasm_opt_features "$file" -o "$file.opt"; then
      echo "build.sh: $wasm_opt ($("$wasm_opt" --version)) failed on the module: it is built without wasm-opt" >&2
      rm -f "$file.opt" "$web.orig" "$node.orig"
      break
    fi
    mv "$file.opt" "$file"
  done
  # What wasm-opt wrote must still load: else keep wasm-bindgen's module.
  if [ -f "$web.orig" ] && ! node -e "require(process.argv[1])" "$here/pkg/node/tether_js.js" >/dev/null 2>&1; then
    echo "build.sh: the module $wasm_opt ($("$wasm_opt" --version)) wrote does not load: it is built without wasm-opt" >&2
    mv "$web.orig" "$web"
    cp "$web" "$node"
  fi
  rm -f "$web.orig" "$node.orig"
fi

version="$(awk -F'"' '/^version = / { print $2; exit }' Cargo.toml)"
cat >"$here/pkg/package.json" <<JSON
{
  "name": "tether-js",
  "version": "$version",
  "description": "tether session cookies (Envoy, gRPC C-core, legacy, signed) for Node and browsers: tether-core compiled to WebAssembly",
  "license": "Apache-2.0",
  "engines": { "node": ">=18" },
  "exports": {
    ".": {
      "node": { "types": "./node/tether_js.d.ts", "default": "./node/tether_js.js" },
      "default": { "types": "./web/tether_js.d.ts", "default": "./web/tether_js.js" }
    },
    "./node": { "types": "./node/tether_js.d.ts", "default": "./node/tether_js.js" },
    "./web": { "types": "./web/tether_js.d.ts", "default": "./web/tether_js.js" }
  },
  "files": ["node", "web"]
}
JSON

size="$(stat -c %s "$here/pkg/web/tether_js_bg.wasm")"
echo "build.sh: js/pkg built; tether_js_bg.wasm is $size bytes ($(awk "BEGIN { printf \"%.1f\", $size / 1024 }") KiB)" >&2
