# Sourced by the scripts that build the static (musl) binaries: ring (rustls's
# crypto) compiles C and assembly, which needs a musl C compiler. Installs
# Debian's musl-tools when missing and points cc-rs at musl-gcc.
musl_cc() {
  if ! command -v musl-gcc >/dev/null; then
    local sudo_=""
    [ "$(id -u)" = 0 ] || sudo_=sudo
    export DEBIAN_FRONTEND=noninteractive
    retry $sudo_ apt-get update -qq
    retry $sudo_ apt-get install -y -qq --no-install-recommends musl-tools >/dev/null
  fi
  export CC_x86_64_unknown_linux_musl=musl-gcc
}
