#!/usr/bin/env bash
# tether's whole test suite, runnable on a fresh machine (installs what it needs):
#   scripts/test.sh
# Steps: formatting, lints and docs; the no_std proof of tether-core; the wasm
# builds; every Rust test (unit, vectors, property, real Envoy and gRPC C-core
# interop); a bounded fuzz run; the JavaScript package and its Chromium test;
# a short run of the plugin benchmark script; a FROM-scratch image of the
# static tether binary run by the Docker engine; the compose demo run for
# real, its story driven across the containers, then its mTLS variant; the
# Envoy-facing suites again on the oldest Envoy supported
# (scripts/envoy-versions.sh 1.36.4).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n=== %s\n' "$*"; }
# One full run builds everything once: incremental caches would only add disk.
export CARGO_INCREMENTAL=0

step "setup"
scripts/setup.sh

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The channel's benchmark needs the `internals` feature (--all-targets skips it without).
cargo clippy -p tether --features internals --benches --quiet -- -D warnings
# Public items are documented (deny(missing_docs)) and doc links resolve.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# The public API of tether, tether-xds and tether-core against their checked-in
# listings: a change to it shows in review (scripts/public-api.py write when meant).
python3 scripts/public-api.py check

step "the crate graph: the channel pulls no CLI or control-plane crate; tether-xds never depends on the channel"
cargo check --quiet -p tether --lib
if cargo tree -p tether -e normal --prefix none | grep -E '^(clap|env_logger|serde_yaml_ng) '; then
  echo "tether pulls a CLI or control-plane crate (above)" >&2
  exit 1
fi
for lib in tether-xds tether-control; do
  if cargo tree -p "$lib" -e normal --prefix none | grep -E '^tether v'; then
    echo "$lib depends on the channel (tether, above)" >&2
    exit 1
  fi
done

step "documentation links (every relative link between the Markdown files resolves)"
python3 scripts/doc-links.py

step "no module cycles (sibling modules that use each other)"
python3 scripts/module-cycles.py core/src native/xds/src native/channel/src

step "tether-core builds without std (no_std cdylib with its own panic handler), with and without regex"
cargo build --quiet -p tether-no-std-check --target wasm32-unknown-unknown --release
cargo build --quiet -p tether-no-std-check --target wasm32-unknown-unknown --release --features tether-core/regex

step "wasm plugin builds"
cargo build --quiet -p tether-plugin -p tether-empty-filter -p tether-host-call-filter -p tether-raw-empty-filter \
  --target wasm32-wasip1 --profile wasm
ls -l target/wasm32-wasip1/wasm/*.wasm 2>/dev/null || true

step "fuzzing (bounded)"
scripts/fuzz.sh "${FUZZ_SECONDS:-15}"

step "Docker: a FROM-scratch image runs the static tether binary"
scripts/scratch-image.sh

step "the plugin as an OCI image (Istio WasmPlugin / Envoy Gateway layout), read back and checked"
scripts/plugin-image.sh

step "Docker Compose: the demo's story across containers (envoy-configs/docker-compose.yml)"
scripts/compose-test.sh

step "Docker Compose: the demo's mTLS variant (envoy-configs/docker-compose.mtls.yml)"
TETHER_MTLS=1 scripts/compose-test.sh

if [ -x js/test.sh ]; then
  step "JavaScript package and inspector page"
  js/test.sh
fi

if [ -x scripts/bench-plugin.sh ]; then
  step "plugin benchmark script (quick mode)"
  scripts/bench-plugin.sh --quick
fi

step "Rust tests (unit, vectors, properties, Envoy and gRPC interop)"
cargo test --quiet -p tether-core --features regex 2>&1 | tee target/test-output.txt
cargo test --workspace --quiet 2>&1 | tee -a target/test-output.txt
# One closing line for the whole Rust suite (the last crate's doc-tests would
# otherwise close the log with "0 passed").
awk '/^test result: /{p+=$4; f+=$6} END {if (p == 0) exit 1; printf "rust: %d passed, %d failed\n", p, f}' target/test-output.txt

step "the Envoy-facing suites on the oldest Envoy supported (1.36.4; the rest ran on 1.40.0)"
scripts/envoy-versions.sh 1.36.4
