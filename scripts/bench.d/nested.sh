#!/usr/bin/env bash
# bench: codex-acp's bwrap probe inside our sandbox (anchor: host bwrap outside, target <= 1.5x)
# Nested sandboxes (docs/benchmarks.md, "Nested sandboxes"):
# codex-acp's bwrap probe,
#
#   bwrap --ro-bind / / --dev /dev --unshare-user --unshare-pid --unshare-net --proc /proc -- /usr/bin/true
#
# run inside a `tuixiu-sandbox run` sandbox (our front end, the nested
# sandbox built by the launcher outside), against the same call to the
# host's bubblewrap outside any sandbox, alternating in one run. Both are
# timed by scripts/bench.d/abbench.py the same way: the inside one by
# `abbench.py --serve` running in the sandbox (default seccomp profile and
# Landlock on), which the outside one drives.
#
#   scripts/bench nested                  # 300 runs each, as the current user
#   RUNS=500 scripts/bench nested
#   AS_USER=nobody scripts/bench nested   # unprivileged (needs root)
#
# Needs bubblewrap (apt-get install bubblewrap). Target: our median <= 1.5x bwrap's.
source "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-300}

command -v bwrap >/dev/null || { echo "bench nested: bwrap not found (apt-get install bubblewrap)" >&2; exit 1; }
bench_build
bin_dir=$(bench_scratch)
server=""
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null
    bench_cleanup
}
trap cleanup EXIT
chmod 755 "$bin_dir"
cp "$REL/tuixiu-sandbox" "$REL/tuixiu-sandbox-full" "$bin_dir/"
ws="$bin_dir/workspace"
mkdir -p "$ws"
cp scripts/bench.d/abbench.py "$ws/"
mkfifo "$ws/req" "$ws/rep"

wrap=()
as_user=()
if [ -n "${AS_USER:-}" ]; then
    chown -R "$AS_USER" "$ws"
    wrap=(setpriv --reuid "$(id -u "$AS_USER")" --regid "$(id -g "$AS_USER")" --clear-groups)
    as_user=(--as-user "$AS_USER")
fi

probe=(bwrap --ro-bind / / --dev /dev --unshare-user --unshare-pid --unshare-net --proc /proc -- /usr/bin/true)
echo "ours: $("$bin_dir/tuixiu-sandbox" bwrap --version); host: $(bwrap --version)"
"${wrap[@]}" "$bin_dir/tuixiu-sandbox" run -v --workspace "$ws" -- sh -c "${probe[*]}" 2>&1 | grep -o "nested sandboxes: .*\|landlock: .*" || true
"${wrap[@]}" "$bin_dir/tuixiu-sandbox" run --workspace "$ws" -- python3 /workspace/abbench.py --serve /workspace &
server=$!
echo "load average before: $(bench_load)"
python3 scripts/bench.d/abbench.py -n "$RUNS" "${as_user[@]}" \
    --name nested-ours --via "$ws" -- "${probe[@]}" \
    --name host-bwrap -- "${probe[@]}"
echo "load average after: $(bench_load)"
wait "$server"
server=""
