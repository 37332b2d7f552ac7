#!/usr/bin/env bash
# Fault-matrix row "launcher SIGKILL at random points of setup, in a loop":
# tests/launcher_kill.rs with ITERATIONS kills per kind of caller (root,
# uid 65534, nested in `unshare -U -r`); CI runs the same test with 12.
# Each kill lands at a random point of a `run --manifest` (download,
# extraction into the workspace, git checkout, writeFile, sandbox setup);
# afterwards no process of it may run, no mount of it may be on the host,
# and the next run must remove every checkout directory, download and
# staging entry it left. The seed is printed; pass it again to repeat.
#
# Usage, as root: scripts/fault-launcher-kill.sh [ITERATIONS [SEED]]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "scripts/fault-launcher-kill.sh: run it as root (the test switches users)" >&2
    exit 1
fi
export TUIXIU_FAULT_ITERATIONS="${1:-500}"
if [ -n "${2:-}" ]; then
    export TUIXIU_FAULT_SEED="$2"
fi
exec cargo test --locked --test launcher_kill -- --nocapture
