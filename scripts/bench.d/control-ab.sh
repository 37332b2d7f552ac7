#!/usr/bin/env bash
# A/B of the daemon's relay and of `sandbox_control inspect` round trips
# while 1, 10 and 50 runs relay (the active phase of
# scripts/bench-daemon-curve.sh), two daemon binaries in interleaved
# rounds: A, B, A, B, ... The backend and the agent are this tree's
# release builds (examples/daemon_bench, examples/acp_bench_agent); only
# the daemon differs. Needs root. Output: CSV rows prefixed by the
# round and the binary's label.
#
#   scripts/bench-control-ab.sh /tmp/main/tuixiu-sandbox target/release/tuixiu-sandbox [ROUNDS] [TOTAL]
#   (NO_BUILD=1: use the release builds as they are)
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:?usage: $0 BINARY_A BINARY_B [ROUNDS] [TOTAL]}
B=${2:?usage: $0 BINARY_A BINARY_B [ROUNDS] [TOTAL]}
ROUNDS=${3:-3}
TOTAL=${4:-500000}
T=${CARGO_TARGET_DIR:-target}/release
[ -n "${NO_BUILD:-}" ] || cargo build --release --quiet --bins --example daemon_bench --example acp_bench_agent
echo "machine: $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), $(uname -r); $(uptime)" >&2
echo "round,daemon,phase,runs,rss_kib,cpu_us_per_msg,ctl_p50_ms,ctl_p99_ms,rate_per_s,ahead_p50_kib,ahead_p99_kib"
for r in $(seq 1 "$ROUNDS"); do
    for label in A B; do
        bin=$A
        [ "$label" = B ] && bin=$B
        scratch=$(mktemp -d /tmp/tuixiu-ab-XXXXXX)
        "$T/examples/daemon_bench" curve "$bin" "$scratch" "$T/examples/acp_bench_agent" "$TOTAL" active |
            grep '^active,' | sed "s/^/$r,$label,/"
        rm -rf "$scratch"
    done
done
echo "load after: $(uptime)" >&2
