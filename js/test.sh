#!/usr/bin/env bash
# Builds tether-js, the tether CLI and tether-control, then runs every
# JavaScript test with Node's built-in runner: the shared vectors, the API,
# round-trips with the CLI, the package as a user imports it, and the pages in
# headless Chromium (installed with apt-get when missing): the inspector, and
# tether-control's status page. Screenshots are left in target/artifacts/.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cd "$repo"

node_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if [ "$node_major" -lt 18 ]; then
  echo "test.sh: Node >= 18 is needed (found: $(node --version 2>/dev/null || echo none))" >&2
  exit 1
fi

# Debian packages: chromium for the inspector test, binaryen for wasm-opt
# (optional: build.sh says so and builds without it when apt cannot install it).
missing=()
[ -n "${CHROMIUM:-}" ] || command -v chromium >/dev/null || missing+=(chromium)
command -v wasm-opt >/dev/null || missing+=(binaryen)
if [ ${#missing[@]} -gt 0 ]; then
  echo "test.sh: installing ${missing[*]} with apt-get" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  . "$repo/scripts/retry.sh"
  retry $sudo apt-get update -qq
  export DEBIAN_FRONTEND=noninteractive
  retry $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
chromium="${CHROMIUM:-$(command -v chromium)}"

"$here/build.sh"
cargo build -p tether-cli --bin tether -p tether-control --bin tether-control

mkdir -p target/artifacts
CHROMIUM="$chromium" TETHER_BIN="$repo/target/debug/tether" TETHER_CONTROL_BIN="$repo/target/debug/tether-control" \
  node --test "$here"/test/*.test.mjs "$here"/test/browser/*.test.mjs
