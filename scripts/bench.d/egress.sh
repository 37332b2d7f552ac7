#!/usr/bin/env bash
# bench: egress proxy of `--network allow`: throughput, added latency, memory per connection (anchor: direct loopback; srt with SRT=)
# The egress proxy of `--network allow` against direct loopback: a 100 MB
# download's throughput (target >= 0.8x direct), the latency a request on a
# new connection gains (p50, p99), and the proxy's memory per open
# connection (scripts/bench.d/egress.py). Release binaries; run as root or
# any user. Results: docs/benchmarks.md.
#
#   scripts/bench egress
#   RUNS=9 REQUESTS=1000 scripts/bench egress
#   SRT=/path/to/node_modules/.bin/srt scripts/bench egress   # with the anchor
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || { echo "bench egress: curl not found" >&2; exit 1; }
bench_build
bin_dir=$(bench_scratch)
chmod 755 "$bin_dir"
cp "$REL/tuixiu-sandbox" "$REL/tuixiu-sandbox-full" "$bin_dir/"
echo "tuixiu-sandbox $("$bin_dir/tuixiu-sandbox" --version | cut -d' ' -f2), $(nproc) CPUs, $(uname -r)"
python3 scripts/bench.d/egress.py "$bin_dir" --runs "${RUNS:-5}" --requests "${REQUESTS:-500}" \
    --connections "${CONNECTIONS:-60}"
