#!/usr/bin/env bash
# Runs tether-core's fuzz targets and the xDS resource validation's for a
# bounded time each and reports how many
# inputs ran. Uses libFuzzer through the libfuzzer-sys crate with the same
# coverage flags cargo-fuzz passes, on the stable toolchain (no sanitizer).
#   scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
export CARGO_TARGET_DIR="$PWD/target/fuzz"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# With an explicit --target the flags reach only the fuzzed code, not build scripts.
host=$(rustc -vV | sed -n 's/^host: //p')
cargo build --manifest-path fuzz/Cargo.toml --release --bins --quiet --target "$host"
total=0
for t in decode sealed cookie_header config xds_resource san_match bootstrap; do
  corpus="target/fuzz/corpus/$t"
  mkdir -p "$corpus"
  # Seed with the shared vectors' values so the fuzzer starts from real cookies.
  python3 - "$corpus" <<'PY'
import json, sys, os, hashlib
v = json.load(open("testdata/vectors.json"))
vals = [d["value"] for d in v["decode"]] + [e["value"] for e in v["encode"]]
vals += [h for c in v["cookie_header"] for h in c["headers"]]
vals += [s["value"] for s in v["sealed"]["seal"]] + [o["value"] for o in v["sealed"]["open"]]
vals += ['{"cookie":{"name":"s","path":"/","ttl":"120s","attributes":[{"name":"SameSite","value":"Lax"}]}}']
# SAN matchers (a selector byte, the matcher, SANs) and bootstraps.
vals += ["\x00*.tether.test\nbackend.tether.test\nspiffe://td/sa/b", "\x04spiffe://td/.*\nspiffe://td/sa/b\nx)|(.*",
         "\x81SPIFFE://\nspiffe://td/sa/b"]
vals += ['{"xds_servers":[{"server_uri":"unix:///run/xds.sock","channel_creds":[{"type":"tls","config":{"ca_certificate_file":"ca.pem"}}],'
         '"call_creds":[{"type":"jwt_token_file","config":{"jwt_token_file":"t.jwt"}}]}],"node":{"id":"n"},'
         '"certificate_providers":{"r":{"plugin_name":"file_watcher","config":{"ca_certificate_file":"a","refresh_interval":"0.000000001s"}}}}',
         "eyJhbGciOiJub25lIn0.eyJleHAiOjFlMTl9.c2ln"]
for s in vals:
    p = os.path.join(sys.argv[1], hashlib.sha1(s.encode()).hexdigest())
    open(p, "w").write(s)
PY
  log="target/fuzz/$t.log"
  "target/fuzz/$host/release/$t" "$corpus" -max_total_time="$secs" -max_len=512 -print_final_stats=1 \
    -artifact_prefix="target/fuzz/artifacts-$t-" >"$log" 2>&1 || {
    echo "fuzz target $t FAILED (crash); last lines:"; tail -30 "$log"; exit 1; }
  runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
  [ -n "$runs" ] || { echo "fuzz target $t: no run count in its log"; tail -20 "$log"; exit 1; }
  echo "fuzz: $t: $runs executions in ${secs}s, 0 crashes"
  total=$((total + runs))
done
echo "fuzz: $total executions in all, 0 crashes"
