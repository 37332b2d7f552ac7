#!/usr/bin/env bash
# bench: startup of `run -- /bin/true`, hardened and not (anchors: bwrap <= 0.8x, `unshare -Urmpf` <= 1.2x)
# Startup latency of `tuixiu-sandbox run -- /bin/true` (docs/benchmarks.md,
# "Startup"), hardened: with the default seccomp profile and Landlock (best
# effort, i.e. fully enforced on a kernel with Landlock ABI >= 6) and, for a
# root caller, the idmapped system view; against bubblewrap with the closest
# equivalent flags (bwrap has neither seccomp nor Landlock), alternating in one
# run. A third column runs tuixiu-sandbox with seccomp and Landlock off, to show
# what the hardening itself costs. The last column, the anchor, is the
# bare-namespace floor: `unshare -Urmpf --mount-proc /bin/true` (user, mount and
# pid namespaces and a fresh /proc, nothing else).
#
#   scripts/bench startup            # 300 runs each, as the current user
#   RUNS=500 scripts/bench startup
#   AS_USER=nobody scripts/bench startup   # unprivileged (needs root)
#
# Needs bubblewrap (apt-get install bubblewrap) and util-linux's unshare.
# Targets: the hardened median <= 0.8x bwrap's and <= 1.2x
# unshare's (docs/benchmarks.md, "against the bare namespaces").
source "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-300}

command -v bwrap >/dev/null || { echo "bench startup: bwrap not found (apt-get install bubblewrap)" >&2; exit 1; }
bench_build
bin_dir=$(bench_scratch)
chmod 755 "$bin_dir"
cp "$REL/tuixiu-sandbox" "$REL/tuixiu-sandbox-full" "$bin_dir/"
ws="$bin_dir/workspace"
mkdir -p "$ws"

bwrap_view=()
for d in /usr /bin /sbin /etc /opt /lib*; do
    if [ -L "$d" ]; then
        bwrap_view+=(--symlink "$(readlink "$d")" "$d")
    elif [ -d "$d" ]; then
        bwrap_view+=(--ro-bind "$d" "$d")
    fi
done

wrap=()
as_user=()
if [ -n "${AS_USER:-}" ]; then
    chown "$AS_USER" "$ws"
    # For the one-off probe below; the benchmark itself drops to the user
    # in-process (abbench.py --as-user), so no wrapper's start is timed.
    wrap=(setpriv --reuid "$(id -u "$AS_USER")" --regid "$(id -g "$AS_USER")" --clear-groups)
    as_user=(--as-user "$AS_USER")
fi

ours=("$bin_dir/tuixiu-sandbox" run --workspace "$ws")
echo "tuixiu-sandbox $("$bin_dir/tuixiu-sandbox" --version | cut -d' ' -f2), $(bwrap --version)"
echo "$("${wrap[@]}" "${ours[@]}" -v -- /bin/true 2>&1 | grep -o "landlock: .*" || echo "landlock: ?")"
echo "load average before: $(bench_load)"
python3 scripts/bench.d/abbench.py -n "$RUNS" "${as_user[@]}" --vs bwrap \
    --name hardened -- "${ours[@]}" -- /bin/true \
    --name no-seccomp-landlock -- "${ours[@]}" --seccomp unconfined --landlock off -- /bin/true \
    --name bwrap -- bwrap --unshare-user --uid 1000 --gid 1000 --unshare-pid --unshare-ipc --unshare-uts \
        "${bwrap_view[@]}" --proc /proc --dev /dev --tmpfs /tmp --bind "$ws" /workspace --tmpfs /home/agent \
        --chdir /workspace --die-with-parent --new-session /bin/true \
    --name unshare -- unshare -Urmpf --mount-proc /bin/true
echo "load average after: $(bench_load)"
