#!/usr/bin/env bash
# The egress proxy of `--network allow` against direct loopback: a 100 MB
# download's throughput (target >= 0.8x direct), the latency a request on a
# new connection gains (p50, p99), and the proxy's memory per open
# connection (scripts/bench-egress.py). Release binaries; run as root or
# any user. Results: docs/benchmarks.md.
#
#   scripts/bench-egress.sh
#   RUNS=9 REQUESTS=1000 scripts/bench-egress.sh
#   SRT=/path/to/node_modules/.bin/srt scripts/bench-egress.sh   # with the anchor
set -euo pipefail
cd "$(dirname "$0")/.."
command -v curl >/dev/null || { echo "bench-egress: curl not found" >&2; exit 1; }
cargo build --release --quiet
bin_dir=$(mktemp -d /tmp/tuixiu-bench-XXXXXX)
trap 'rm -rf "$bin_dir"' EXIT
chmod 755 "$bin_dir"
cp target/release/tuixiu-sandbox target/release/tuixiu-sandbox-full "$bin_dir/"
echo "tuixiu-sandbox $("$bin_dir/tuixiu-sandbox" --version | cut -d' ' -f2), $(nproc) CPUs, $(uname -r)"
python3 scripts/bench-egress.py "$bin_dir" --runs "${RUNS:-5}" --requests "${REQUESTS:-500}" \
    --connections "${CONNECTIONS:-60}"
