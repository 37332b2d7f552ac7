#!/usr/bin/env bash
# bench: the daemon's agent host: acp_open, 10 KB reads, update relay rate, RSS (anchor: Node acp-proxy, 50 ms / 42 500 updates/s)
# The daemon's agent host against its targets (docs/benchmarks.md, "The
# daemon's agent host"), native provider, release build, driven by a Rust
# fake backend on loopback (`daemon_bench acp`, examples/daemon_bench/) with the
# tests' compiled fake agent (tests/fake/agent.rs; AGENT=FILE.py runs a
# stdlib-only Python agent speaking the same commands, as `python3 -S`):
#   * acp_open -> acp_opened with a fresh run each time (target: median
#     <= 20 ms; Node acp-proxy on bwrap: 50 ms), next to the agent's own
#     start on the host, so the daemon's share shows;
#   * a 10 KB fs/read_text_file as the agent sees it (target < 1 ms; Node:
#     16.5 ms), and 8 concurrent reads against 8 sequential ones (target:
#     concurrent not slower);
#   * session/update relay, 200 B each, all in order, none lost (target
#     >= 1 000 000 per second: docs/benchmarks.md, "a million relayed
#     updates a second"; Node: 42 500), and the daemon's peak RSS over
#     it (target < 12 MB; Node: 63 MB idle, 84 MB peak);
#     then the agent alone into a pipe and the backend alone over
#     loopback, so neither end is what limits the rate.
# Needs root (the sandbox runs as the daemon's user; /proc/<pid>/clear_refs).
#
#   scripts/bench acp                     # 3 rounds, 30 opens, 1 000 000 updates
#   ROUNDS=5 OPENS=50 FLOOD=500000 scripts/bench acp
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-3}
OPENS=${OPENS:-30}
FLOOD=${FLOOD:-1000000}
AGENT=${AGENT:-"$REL/examples/fake_agent"}

bench_build --bins --example daemon_bench --example fake_agent
bench_machine
echo "tuixiu-sandbox $("$REL/tuixiu-sandbox" --version | cut -d' ' -f2), $(/usr/bin/python3 --version)"
echo "anchor (Node acp-proxy on bwrap, same kind of machine; docs/benchmarks.md): acp_open 50 ms; 10 KB read 16.5 ms; 42 500 updates/s; RSS 63 MB idle, 84 MB peak"
for i in $(seq 1 "$ROUNDS"); do
    echo "--- round $i (load $(bench_load))"
    "$REL/examples/daemon_bench" acp "$REL/tuixiu-sandbox" \
        "$(bench_scratch)" "$AGENT" "$OPENS" "$FLOOD"
done
