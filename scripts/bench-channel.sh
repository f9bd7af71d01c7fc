#!/usr/bin/env bash
# The proxyless channel's benchmark (native/channel/benches/channel.rs), in release
# mode, everything in one process on 127.0.0.1:
#   1. one EDS update of 10,000 endpoints applied to the LB tree: time and
#      RSS growth (goals <= 50 ms, <= 50 MB);
#   2. picks through the xDS picker chain, round robin, least_request and
#      round robin with outlier_detection (divan; goal <= 100 ns);
#   3. unary Echo calls to three in-process tonic servers at concurrency 1
#      and 64: plain tonic, tonic balance_list, tether::Channel static (one
#      endpoint and three), with sessions (one jar; a jar per task) and over
#      xDS from tether-control's library, least_request over three, and
#      round robin with outlier detection over xDS (goals: >= 0.95 x plain
#      tonic's calls/s, p99 within 10%; sessions >= 0.95 x the same channel
#      without; least_request and outlier detection >= 0.95 x round robin).
#
#   scripts/bench-channel.sh            full run: 5 rounds x 18 runs x 3.5 s, 3 EDS rounds (about 6 minutes)
#   scripts/bench-channel.sh --quick    a smoke run (0.3 s per configuration), under 30 s once built
# Options (passed to the bench binary): --duration SECS  --warmup SECS  --rounds N
#   --eds-rounds N  --only eds,picker,throughput
#   --kinds plain,balance,one,static,session,sessions,xds,least_request,outlier_detection
# Exits non-zero when a configuration fails calls or a part cannot run;
# missed goals are reported, not failures.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
esac
exec cargo bench --quiet -p tether --bench channel -- "$@"
