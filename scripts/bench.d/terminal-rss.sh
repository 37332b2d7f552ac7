#!/usr/bin/env bash
# bench: daemon peak RSS with 32 terminals per run at the output cap, 1 and 4 runs (anchor: the memory budget)
# The daemon's peak RSS with terminal output at the cap (docs/benchmarks.md,
# "One run cannot hold up another"): one run,
# then four, each with 32 terminals at outputByteLimit 64 MiB printing
# 80 MiB each, their output read once all have exited
# (`daemon_bench terminal-rss`, examples/daemon_bench/; agent tests/fake/agent.rs). Native
# provider, release build; needs root (sandboxes as the daemon's user,
# /proc/<pid>/clear_refs). Writes up to 2 GiB per run under the scratch
# directory's state (the output beyond the memory budget).
#
#   scripts/bench terminal-rss                # 1 and 4 runs
#   BIN=/other/target/release/tuixiu-sandbox RUNS="1" scripts/bench terminal-rss
source "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-"1 4"}
BYTES=${BYTES:-83886080}
bench_build --bins --example daemon_bench --example fake_agent
BIN=${BIN:-"$REL/tuixiu-sandbox"}
bench_machine
for runs in $RUNS; do
    "$REL/examples/daemon_bench" terminal-rss "$BIN" "$(bench_scratch /var/tmp)" \
        "$REL/examples/fake_agent" "$runs" "$BYTES"
done
