#!/usr/bin/env bash
# Runs the tests of the fault matrix (docs/reliability.md) ROUNDS times
# (default 3), to catch faults that are handled only most of the time.
# As root, like scripts/test.sh (the tests switch users, mount tmpfs and
# start a private dockerd); source scripts/ci-setup.d/*.sh first on a fresh
# machine (scripts/test.sh does). Exit status 1 if any round failed.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${1:-3}"
if [ "$(id -u)" != 0 ]; then
    echo "scripts/faults.sh: run as root (the fault tests mount, switch users and start dockerd)" >&2
    exit 1
fi

# test binary -> tests of the matrix in it (empty: all of them)
tests=(
    "proxy_faults:"
    "docker_engine_loss:"
    "proxy_link:reconnect_delivers_queued_replies_in_order backoff_is_reset_only_by_a_registered_connection second_daemon_with_the_same_state_refuses_to_start"
    "proxy_runs:malformed_controls_are_refused_and_touch_nothing idle_runs_expire_only_when_configured keepalive_expiry_removes_the_native_instance"
    "proxy_acp:native_agent_end_to_end"
)

cargo build --tests --locked -q
failed=0
for round in $(seq 1 "$rounds"); do
    for entry in "${tests[@]}"; do
        binary="${entry%%:*}"
        names="${entry#*:}"
        # shellcheck disable=SC2086 # the names are separate filters
        if cargo test -q --locked --test "$binary" -- $names >"/tmp/tuixiu-faults-$binary.log" 2>&1; then
            echo "round $round: $binary ok"
        else
            echo "round $round: $binary FAILED (log: /tmp/tuixiu-faults-$binary.log)"
            failed=1
        fi
    done
done
exit "$failed"
