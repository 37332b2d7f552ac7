#!/usr/bin/env bash
# The daemon's peak RSS with terminal output at the cap (docs/benchmarks.md,
# "One run cannot hold up another"): one run,
# then four, each with 32 terminals at outputByteLimit 64 MiB printing
# 80 MiB each, their output read once all have exited
# (`daemon_bench terminal-rss`, examples/daemon_bench/; agent examples/acp_bench_agent.rs). Native
# provider, release build; needs root (sandboxes as the daemon's user,
# /proc/<pid>/clear_refs). Writes up to 2 GiB per run under the scratch
# directory's state (the output beyond the memory budget).
#
#   scripts/bench-terminal-rss.sh                # 1 and 4 runs
#   BIN=/other/target/release/tuixiu-sandbox RUNS="1" scripts/bench-terminal-rss.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-"1 4"}
BYTES=${BYTES:-83886080}
cargo build --release --quiet --bins --example daemon_bench --example acp_bench_agent
T=${CARGO_TARGET_DIR:-target}
BIN=${BIN:-$T/release/tuixiu-sandbox}
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
for runs in $RUNS; do
    "$T/release/examples/daemon_bench" terminal-rss "$BIN" "$(mktemp -d /var/tmp/tuixiu-term-rss-XXXXXX)" \
        "$T/release/examples/acp_bench_agent" "$runs" "$BYTES"
done
