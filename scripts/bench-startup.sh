#!/usr/bin/env bash
# Startup latency of `tuixiu-sandbox run -- /bin/true` against bubblewrap with
# the closest equivalent flags, measured side by side (alternating) in one run.
#
#   scripts/bench-startup.sh            # 200 runs each, as the current user
#   RUNS=500 scripts/bench-startup.sh
#   AS_USER=nobody scripts/bench-startup.sh   # as an unprivileged user (needs root)
#
# Needs bubblewrap (apt-get install bubblewrap). Target: our median <= 0.8x bwrap's.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-200}

command -v bwrap >/dev/null || { echo "bench-startup: bwrap not found (apt-get install bubblewrap)" >&2; exit 1; }
cargo build --release --quiet
bin_dir=$(mktemp -d /tmp/tuixiu-bench-XXXXXX)
trap 'rm -rf "$bin_dir"' EXIT
chmod 755 "$bin_dir"
cp target/release/tuixiu-sandbox "$bin_dir/"
ws="$bin_dir/workspace"
mkdir -p "$ws"

# The same root view for both: the system dirs read-only (top-level symlinks
# as symlinks), fresh /proc, minimal /dev, private /tmp, the workspace.
bwrap_view=()
for d in /usr /bin /sbin /etc /opt /lib*; do
    if [ -L "$d" ]; then
        bwrap_view+=(--symlink "$(readlink "$d")" "$d")
    elif [ -d "$d" ]; then
        bwrap_view+=(--ro-bind "$d" "$d")
    fi
done

wrap=()
if [ -n "${AS_USER:-}" ]; then
    chown "$AS_USER" "$ws"
    wrap=(setpriv --reuid "$(id -u "$AS_USER")" --regid "$(id -g "$AS_USER")" --clear-groups)
fi

echo "tuixiu-sandbox $("$bin_dir/tuixiu-sandbox" --version | cut -d' ' -f2), $(bwrap --version)"
python3 scripts/abbench.py -n "$RUNS" \
    --name tuixiu-sandbox -- "${wrap[@]}" "$bin_dir/tuixiu-sandbox" run --workspace "$ws" -- /bin/true \
    --name bwrap -- "${wrap[@]}" bwrap --unshare-user --uid 1000 --gid 1000 --unshare-pid --unshare-ipc --unshare-uts \
        "${bwrap_view[@]}" --proc /proc --dev /dev --tmpfs /tmp --bind "$ws" /workspace --chdir /workspace \
        --die-with-parent --new-session /bin/true
