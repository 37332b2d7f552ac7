#!/usr/bin/env bash
# bwrap on the host (issue 15): codex's and Flatpak's typical command lines
# (scripts/bench-bwrap/*.sh, COMMAND is /usr/bin/true) through our launcher
# called as `bwrap` and through a reference bubblewrap, alternating in one
# run (scripts/abbench.py): start-to-exit wall time, median, ratio.
#
#   BWRAP_REF=/path/to/bubblewrap-0.11.1/bwrap scripts/bench-bwrap.sh
#   RUNS=300 AS_USER=nobody BWRAP_REF=... scripts/bench-bwrap.sh
#
# BWRAP_REF defaults to the host's bwrap (Debian 12: 0.8.0); the figures in
# docs/benchmarks.md are against 0.11.1 built from source (meson/ninja,
# as scripts/bwrap-upstream-tests.sh builds it). Target: ours <= 0.8x.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-200}
ref=${BWRAP_REF:-$(command -v bwrap || true)}
[ -x "$ref" ] || { echo "bench-bwrap: no reference bwrap (BWRAP_REF=...)" >&2; exit 1; }
cargo build --release --quiet --bin tuixiu-sandbox
dir=$(mktemp -d /tmp/tuixiu-bench-bwrap-XXXXXX)
trap 'rm -rf "$dir"' EXIT
chmod 755 "$dir"
mkdir "$dir/ours" "$dir/ref"
cp target/release/tuixiu-sandbox "$dir/ours/bwrap"
cp "$ref" "$dir/ref/bwrap"
cp scripts/bench-bwrap/*.sh "$dir/"
printf 'user:x:1000:1000::/home/user:/bin/sh\n' >"$dir/passwd"
printf 'user:x:1000:\n' >"$dir/group"
touch "$dir/.ref"
chmod -R a+rX "$dir"
chmod 777 "$dir"
as_user=()
[ -n "${AS_USER:-}" ] && as_user=(--as-user "$AS_USER")
echo "reference: $("$ref" --version)"
for line in codex flatpak; do
    echo "== $line"
    python3 scripts/abbench.py -n "$RUNS" "${as_user[@]}" \
        --name "ours-$line" -- env BENCH_DIR="$dir" BWRAP="$dir/ours/bwrap" "$dir/$line.sh" \
        --name "bwrap-$line" -- env BENCH_DIR="$dir" BWRAP="$dir/ref/bwrap" "$dir/$line.sh"
done
