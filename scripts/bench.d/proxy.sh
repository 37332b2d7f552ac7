#!/usr/bin/env bash
# bench: daemon footprint and control latency: idle RSS, RSS per idle run, inspect bursts (anchor: bare node idle RSS)
# Footprint and control latency of the execution-plane daemon
# (`tuixiu-sandbox proxy`, native provider, release build), driven by a
# Rust fake backend on loopback (`daemon_bench proxy`, examples/daemon_bench/):
#   * idle RSS once registered (target <= 8 MB; the Node acp-proxy idles at
#     about 63 MB: docs/benchmarks.md, "Execution-plane daemon");
#   * RSS added by 100 idle runs (target <= 2 MB each, no agents);
#   * bursts of 1 000 `sandbox_control inspect` sent back to back: all
#     answered, in order; per-message latency and the daemon's CPU per
#     message (10 bursts, the median over them reported; target: median
#     < 5 ms); then 1 000 sequential round trips.
# As an anchor run in the same session, the idle RSS of a bare Node.js
# process (`node -e 'setInterval(...)'`): a floor under any Node proxy.
#
#   scripts/bench proxy           # 3 rounds
#   ROUNDS=5 scripts/bench proxy
#   PROXY_ARGS="--log-format json -v" scripts/bench proxy   # daemon options
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-3}

bench_build --bins --example daemon_bench
bench_machine
echo "tuixiu-sandbox $("$REL/tuixiu-sandbox" --version | cut -d' ' -f2)"
for i in $(seq 1 "$ROUNDS"); do
    echo "--- round $i"
    "$REL/examples/daemon_bench" proxy "$REL/tuixiu-sandbox" "$(bench_scratch)"
done

if command -v node >/dev/null; then
    echo "--- anchor: bare node $(node --version), idle"
    node -e 'setInterval(() => {}, 1e6)' &
    pid=$!
    sleep 2
    grep VmRSS "/proc/$pid/status"
    kill "$pid"
fi
