#!/usr/bin/env bash
# bench: A/B of two daemon binaries: relay and `sandbox_control inspect` latency at 1/10/50 relaying runs (anchor: binary A)
# A/B of the daemon's relay and of `sandbox_control inspect` round trips
# while 1, 10 and 50 runs relay (the active phase of
# scripts/bench daemon-curve), two daemon binaries in interleaved
# rounds: A, B, A, B, ... The backend and the agent are this tree's
# release builds (examples/daemon_bench, examples/fake_agent); only
# the daemon differs. Needs root. Output: CSV rows prefixed by the
# round and the binary's label.
#
#   scripts/bench control-ab /tmp/main/tuixiu-sandbox target/release/tuixiu-sandbox [ROUNDS] [TOTAL]
#   (NO_BUILD=1: use the release builds as they are)
source "$(dirname "$0")/lib.sh"
A=${1:?usage: scripts/bench control-ab BINARY_A BINARY_B [ROUNDS] [TOTAL]}
B=${2:?usage: scripts/bench control-ab BINARY_A BINARY_B [ROUNDS] [TOTAL]}
ROUNDS=${3:-3}
TOTAL=${4:-500000}
bench_build --bins --example daemon_bench --example fake_agent
bench_machine >&2
echo "round,daemon,phase,runs,rss_kib,cpu_us_per_msg,ctl_p50_ms,ctl_p99_ms,rate_per_s,ahead_p50_kib,ahead_p99_kib"
one() {
    local scratch
    scratch=$(bench_scratch)
    "$REL/examples/daemon_bench" curve "$3" "$scratch" "$REL/examples/fake_agent" "$TOTAL" active |
        grep '^active,' | sed "s/^/$1,$2,/"
    rm -rf "$scratch"
}
bench_ab_rounds "$ROUNDS" "$A" "$B" one
echo "load after: $(bench_load)" >&2
