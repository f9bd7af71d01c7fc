#!/usr/bin/env bash
# Runs envoy-configs/docker-compose.yml for real and drives the demo's story
# across its containers (scripts/compose-story.py): tether-control, a backend
# service scaled to three replicas that it finds through Docker's DNS, Envoy
# with the tether plugin, a tether::Channel client and a gRPC C-core client,
# each with its own address on the compose network. Then the fault cases
# (scripts/compose-faults.py) on the same project.
#   scripts/compose-test.sh
#   TETHER_FAULTS=3,4 scripts/compose-test.sh    only those fault cases, no story
#   TETHER_STORY_LOG=1 ...                        the clients' logs with each session's row
#   TETHER_MTLS=1 scripts/compose-test.sh         the mTLS variant (docker-compose.mtls.yml
#                                                 laid over it): the story with mTLS on every
#                                                 hop, no fault cases
# The images are built FROM scratch by scripts/compose-images.sh (nothing is
# pulled) under the tags tether-compose-test/*:latest, which later runs
# reuse (the build is cached; an image replaced under its tag is removed).
# The project gets a free /24 in 10.203.117-126 and free ports on 127.0.0.1,
# and is taken down (containers, network, volume) whatever happens.
# With no Docker engine or no Docker Compose it says so loudly and exits 0,
# unless CI=true, where that is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "compose-test: $*" >&2; }
skip() {
  say "********** SKIPPED: $* **********"
  if [ "${CI:-}" = true ]; then
    say "CI=true, so this is a failure"
    exit 1
  fi
  exit 0
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

docker info >/dev/null 2>&1 || skip "no Docker engine answers (docker info failed)"
if docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null && docker-compose version >/dev/null 2>&1; then
  compose_cmd=(docker-compose)
else
  skip "no Docker Compose (neither 'docker compose' nor 'docker-compose')"
fi
command -v python3 >/dev/null || { say "python3 is needed to drive the story"; exit 1; }

export TETHER_IMAGE=tether-compose-test/tether:latest
export ENVOY_IMAGE=tether-compose-test/envoy:latest
export PYTHON_IMAGE=tether-compose-test/python-grpcio:latest

started=$(now)
t=$(now)
scripts/compose-images.sh
images_took=$(since "$t")

# A /24 no Docker network and no route of this machine uses.
used="$(docker network inspect $(docker network ls -q) -f '{{range .IPAM.Config}}{{.Subnet}} {{end}}' 2>/dev/null || true)"
used="$used $( (ip -4 route 2>/dev/null || true) | awk '{print $1}')"
net=""
for third in $(seq 117 126); do
  if ! grep -q "10\.203\.$third\." <<<"$used"; then
    net="10.203.$third"
    break
  fi
done
[ -n "$net" ] || { say "no free /24 in 10.203.117-126 for the compose network"; exit 1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export TETHER_NET=$net
export TETHER_HTTP_PORT=$(free_port)
export TETHER_ADMIN_PORT=$(free_port)
export TETHER_CONTROL_ADMIN_PORT=$(free_port)

# The containers read tether-control's file from a folder the story rewrites.
config="$(mktemp -d)"
chmod 755 "$config"
cp -R envoy-configs/compose/. "$config/"
sed -i "s/10\.203\.117\./$net./g" "$config"/tether*.yaml
export TETHER_CONFIG_DIR=$config

project="tether-compose-test-$$"
files=(-f envoy-configs/docker-compose.yml)
if [ "${TETHER_MTLS:-}" = 1 ]; then
  files+=(-f envoy-configs/docker-compose.mtls.yml)
  export TETHER_MTLS
fi
compose() { "${compose_cmd[@]}" -p "$project" "${files[@]}" "$@"; }
# The story and the fault cases scale the backends with it (no spaces in it).
export TETHER_COMPOSE="${compose_cmd[*]} -p $project ${files[*]}"
export TETHER_COMPOSE_PROJECT=$project
passed=false
cleanup() {
  local t
  t=$(now)
  if [ "$passed" != true ]; then
    say "logs of the compose project:"
    compose logs --no-color --tail 30 >&2 2>/dev/null || true
  fi
  compose down -v --remove-orphans -t 15 >/dev/null 2>&1 || true
  rm -rf "$config"
  say "compose down in $(since "$t")"
}
trap cleanup EXIT

t=$(now)
if ! out="$(compose up -d --no-build 2>&1)"; then
  say "compose up failed: $out"
  exit 1
fi
containers=()
# The backends' replicas are found by the scripts (compose-story.py's Stage).
[ "$(compose ps -q backend | wc -l)" = 3 ] || { say "not three backend replicas: $(compose ps backend)"; exit 1; }
for service in tether-control envoy channel-client grpcio-client; do
  id="$(compose ps -q "$service")"
  [ -n "$id" ] || { say "no container for $service"; exit 1; }
  containers+=("$service=$id")
  [ "$service" != grpcio-client ] || grpcio=$id
done
# Ready: Envoy answers through the published port (so tether-control serves
# it and the backends answer) and the C-core client has grpcio.
ready=false
for _ in $(seq 1 120); do
  if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
    "http://127.0.0.1:$TETHER_HTTP_PORT/" 2>/dev/null \
    && grep -q 'grpcio-client: ready' <<<"$(docker logs "$grpcio" 2>&1)"; then
    ready=true
    break
  fi
  sleep 0.5
done
[ "$ready" = true ] || { say "the project was not ready within 60 s"; exit 1; }
up_took=$(since "$t")
echo "compose-test: ${compose_cmd[*]}, network $net.0/24, Envoy on 127.0.0.1:$TETHER_HTTP_PORT (admin :$TETHER_ADMIN_PORT)"
t=$(now)
if [ -z "${TETHER_FAULTS:-}" ]; then
  python3 scripts/compose-story.py "$config" "$net" "$TETHER_HTTP_PORT" "$TETHER_ADMIN_PORT" "${containers[@]}"
fi
story_took=$(since "$t")
t=$(now)
if [ "${TETHER_MTLS:-}" != 1 ]; then
  python3 scripts/compose-faults.py "$config" "$net" "$TETHER_HTTP_PORT" "$TETHER_ADMIN_PORT" "${containers[@]}"
fi
passed=true
echo "compose-test: PASS in $(since "$started") (images $images_took, up $up_took, story $story_took, faults $(since "$t"))"
