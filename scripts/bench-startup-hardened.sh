#!/usr/bin/env bash
# Startup benchmark with the hardening on: `tuixiu-sandbox run -- /bin/true`
# with the default seccomp profile and Landlock (best effort, which is full
# on a kernel with Landlock ABI >= 6), against bubblewrap with the closest
# equivalent flags (bwrap has neither seccomp nor Landlock here).
#
# Runs A B A B ... in one process so both see the same machine state, and
# prints each side's median, p90 and the ratio A/B (target: <= 0.8).
#
#   scripts/bench-startup-hardened.sh [ITERATIONS] [BINARY]
#
# ITERATIONS defaults to 300 per side; BINARY to target/release/tuixiu-sandbox
# (built if missing). Run as any user; root maps the sandbox user onto root
# in both tools.
set -euo pipefail
cd "$(dirname "$0")/.."

iterations="${1:-300}"
bin="${2:-target/release/tuixiu-sandbox}"
if [ ! -x "$bin" ]; then
    cargo build --release --locked
fi
command -v bwrap >/dev/null || { echo "bwrap not found: apt-get install bubblewrap" >&2; exit 1; }

ws="$(mktemp -d)"
trap 'rm -rf "$ws"' EXIT

# The same view as tuixiu-sandbox's system view: /usr /etc /opt and the
# host's top-level symlinks or directories for bin, sbin, lib*.
bwrap_args=(--unshare-user --uid 1000 --gid 1000 --unshare-pid --unshare-ipc --unshare-uts
    --die-with-parent --new-session)
for d in /usr /bin /sbin /etc /opt /lib*; do
    if [ -L "$d" ]; then
        bwrap_args+=(--symlink "$(readlink "$d")" "$d")
    elif [ -d "$d" ]; then
        bwrap_args+=(--ro-bind "$d" "$d")
    fi
done
bwrap_args+=(--proc /proc --dev /dev --tmpfs /tmp --bind "$ws" /workspace --tmpfs /home/agent
    --chdir /workspace -- /bin/true)

python3 - "$iterations" "$(realpath "$bin")" "$ws" "${bwrap_args[@]}" <<'EOF'
import os, statistics, sys, time

iterations = int(sys.argv[1])
ours = [sys.argv[2], "run", "--workspace", sys.argv[3], "--", "/bin/true"]
bwrap = ["bwrap"] + sys.argv[4:]
devnull = os.open(os.devnull, os.O_RDWR)

def once(argv):
    # posix_spawn (vfork-like) keeps the harness's own cost small and equal.
    start = time.perf_counter_ns()
    pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1)])
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter_ns() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{argv[0]} failed with {os.waitstatus_to_exitcode(status)}")
    return elapsed / 1e6

for argv in (ours, bwrap):  # warm caches
    for _ in range(10):
        once(argv)
a, b = [], []
for _ in range(iterations):
    a.append(once(ours))
    b.append(once(bwrap))

def p90(xs):
    return sorted(xs)[int(len(xs) * 0.9)]

ma, mb = statistics.median(a), statistics.median(b)
print(f"iterations per side: {iterations}, alternating")
print(f"tuixiu-sandbox (default seccomp + Landlock): median {ma:.3f} ms, p90 {p90(a):.3f} ms")
print(f"bwrap {os.popen('bwrap --version').read().split()[-1]} (no seccomp, no Landlock): median {mb:.3f} ms, p90 {p90(b):.3f} ms")
print(f"ratio (median): {ma / mb:.2f}  (target <= 0.80)")
EOF
