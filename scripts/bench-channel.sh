#!/usr/bin/env bash
# The proxyless channel's benchmark (native/channel/benches/channel.rs), in release
# mode, on loopback (the instructions section runs its client in a process
# of its own under callgrind):
#   1. one EDS update of 10,000 endpoints applied to the LB tree: time and
#      RSS growth (goals <= 50 ms, <= 50 MB);
#   2. update cost: 1,000 clusters x 100 endpoints with one endpoint's
#      health changed (goal <= 1 ms), one cluster of 100,000 endpoints in
#      1,000 localities (goals <= 500 ms, <= 300 MB);
#   3. picks through the xDS picker chain, round robin, least_request and
#      round robin with outlier_detection (divan; goal <= 100 ns);
#   4. unary Echo calls to three in-process tonic servers at concurrency 1
#      and 64: plain tonic, tonic balance_list, tether::Channel static (one
#      endpoint and three), with sessions (one jar in a channel handle, one
#      as a layer; a jar per task) and over
#      xDS from tether-control's library, least_request over three, and
#      round robin with outlier detection over xDS (goals: >= 0.95 x plain
#      tonic's calls/s, p99 within 10%, each ratio the median of the rounds'
#      ratios; sessions >= 0.95 x the same channel
#      without; least_request and outlier detection >= 0.95 x round robin);
#      tonic-xds (grpc-rust's xDS for tonic, 0.1.0-alpha.4) over the same
#      tether-control resources and backends as the channel over xDS (goal:
#      the channel over xDS >= 1.0 x tonic-xds's calls/s);
#      and TLS rows against an mTLS backend: tonic with its own TLS
#      (tls-ring), the channel with ChannelBuilder::tls and with xDS mTLS
#      (A29, file_watcher) (goals >= 0.95 x tonic with TLS, p99 within 10%);
#   5. a client certificate rotation under load (xDS mTLS, 64 tasks, the
#      backend rotating connections every 500 ms): calls failed (goal 0),
#      calls/s after against before, when the new certificate was presented;
#   6. instructions per unary call under valgrind's callgrind, the client in
#      a process of its own: plain tonic, tether::Channel over the same one
#      endpoint, and with a session (goals <= 1.05 x plain tonic, sessions
#      <= 1.05 x without); tonic with TLS against the channel with TLS and
#      with xDS mTLS; tether::Channel over xDS against tonic-xds (goal
#      <= 1.0 x its instructions); the same xDS cluster reporting load (LRS)
#      against it without (goal <= 1.02 x); wall-clock ratios on a shared 2-core machine swing
#      by several percent between rounds, instruction counts do not.
#
#   scripts/bench-channel.sh            full run: 8 rounds x 30 runs x 3.5 s, 3 EDS rounds (about 17 minutes)
#   scripts/bench-channel.sh --quick    a smoke run (0.3 s per configuration), under 30 s once built
# Options (passed to the bench binary): --duration SECS  --warmup SECS  --rounds N
#   --eds-rounds N  --only eds,updates,picker,throughput,rotation,instructions
#   --kinds plain,balance,one,dns,static,session,session_layer,sessions,xds,xds_lrs,tonic_xds,least_request,
#           outlier_detection,weighted_round_robin,tonic_tls,tls,xds_mtls (also the instructions
#           section's configurations)
# Exits non-zero when a configuration fails calls or a part cannot run;
# missed goals are reported, not failures.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
esac
. scripts/retry.sh
if ! command -v valgrind >/dev/null; then
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  export DEBIAN_FRONTEND=noninteractive
  retry $sudo_ apt-get update -qq || true
  retry $sudo_ apt-get install -y -qq --no-install-recommends valgrind >/dev/null ||
    echo "bench-channel: valgrind could not be installed: the instructions section will fail (or pass --only eds,updates,picker,throughput)" >&2
fi
# The bench builds the LB tree from the crate's own policies, public only
# with the `internals` feature.
exec cargo bench --quiet -p tether --features internals --bench channel -- "$@"
