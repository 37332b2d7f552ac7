#!/usr/bin/env bash
# bench: daemon scaling curves: RSS, CPU per message, inspect p50/p99 against idle and relaying runs (writes docs/plots/daemon-*)
# Scaling curves of the execution-plane daemon (docs/benchmarks.md, "Curve
# (a)"): one daemon with 1, 10, 100, 1 000 idle runs and one with 1, 10, 50 runs
# relaying at once; RSS, the daemon's CPU per message, and the latency p50/p99
# of `sandbox_control inspect` round trips (during the relay they queue behind
# the updates in the daemon's one outbound FIFO). `daemon_bench curve` (examples/daemon_bench/) is the
# backend, tests/fake/agent.rs the agent; release build, native
# provider. Needs root (sandboxes as the daemon's user, /proc/<pid>/clear_refs).
#
#   scripts/bench daemon-curve                   # docs/plots/daemon.csv + SVGs
#   TOTAL=1000000 OUT=/tmp/curve scripts/bench daemon-curve
source "$(dirname "$0")/lib.sh"
TOTAL=${TOTAL:-500000}
OUT=${OUT:-docs/plots}

bench_build --bins --example daemon_bench --example fake_agent
mkdir -p "$OUT"
bench_machine >&2
"$REL/examples/daemon_bench" curve "$REL/tuixiu-sandbox" \
    "$(bench_scratch)" "$REL/examples/fake_agent" "$TOTAL" | tee "$OUT/daemon.csv"
echo "load after: $(bench_load)" >&2

plot() { python3 scripts/plot.py "$OUT/daemon.csv" --x runs "$@"; }
plot --where phase=idle --y rss_kib --logx --out "$OUT/daemon-idle-rss.svg" \
    --title "Daemon RSS against idle runs" --xlabel "idle runs" --ylabel "RSS (KiB)" \
    --label rss_kib="RSS"
plot --where phase=idle --y ctl_p50_ms,ctl_p99_ms --logx --out "$OUT/daemon-idle-latency.svg" \
    --title "inspect round trip against idle runs" --xlabel "idle runs" --ylabel "ms" \
    --label ctl_p50_ms=p50 --label ctl_p99_ms=p99
plot --where phase=active --y rss_kib --out "$OUT/daemon-active-rss.svg" \
    --title "Daemon peak RSS against relaying runs" --xlabel "runs relaying at once" --ylabel "peak RSS (KiB)" \
    --label rss_kib="peak RSS"
plot --where phase=active --y cpu_us_per_msg --out "$OUT/daemon-active-cpu.svg" \
    --title "Daemon CPU per relayed update" --xlabel "runs relaying at once" --ylabel "µs per update" \
    --label cpu_us_per_msg="CPU per update"
plot --where phase=active --y ctl_p50_ms,ctl_p99_ms --out "$OUT/daemon-active-latency.svg" \
    --title "inspect round trip during the relay" --xlabel "runs relaying at once" --ylabel "ms" \
    --label ctl_p50_ms=p50 --label ctl_p99_ms=p99
