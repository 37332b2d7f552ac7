#!/usr/bin/env bash
# Benchmark: the safe zip extractor of downloadExtract against Info-ZIP's
# `unzip -q`, on the same archive, alternating runs in one session.
#
# The archive: 2 000 files of 44 KiB of text-like data each (90 MB) in 40
# directories, deflated by Python's zipfile (level 6) into a ~50 MB zip,
# generated deterministically. Both tools extract into a tmpfs (/dev/shm),
# as skills land in the sandbox's private tmpfs home, so the numbers
# measure the extractors rather than the disk's writeback.
#
# Usage: scripts/bench-extract.sh [RUNS]   (default 15 runs of each)
# Prints the machine, each median, and ours/unzip (target: <= 1.0).
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-15}"

command -v unzip >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq unzip; }
cargo build --release --quiet
bin="$PWD/target/release/tuixiu-sandbox-full"

work="$(mktemp -d /dev/shm/tuixiu-bench-extract.XXXXXX)"
trap 'rm -rf "$work"' EXIT

python3 - "$work/bench.zip" <<'PY'
import random, sys, zipfile
rng = random.Random(42)
words = [''.join(rng.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(rng.randint(2, 9))) for _ in range(5000)]
with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED, compresslevel=6) as z:
    for i in range(2000):
        out, size = [], 0
        while size < 44 * 1024:
            w = rng.choice(words) + (' ' if rng.random() > 0.1 else '\n')
            out.append(w); size += len(w)
        z.writestr(f"dir{i % 40:02d}/file{i:04d}.txt", ''.join(out)[:44 * 1024])
PY

python3 - "$bin" "$work" "$runs" <<'PY'
import os, shutil, statistics, subprocess, sys, time
bin, work, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
archive = os.path.join(work, "bench.zip")
def once(cmd, out):
    shutil.rmtree(out, ignore_errors=True)
    os.mkdir(out)
    subprocess.run(["sync"], check=True)
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t
ours, theirs = [], []
for i in range(runs + 1):
    a = once([bin, "__extract", archive, os.path.join(work, "ours")], os.path.join(work, "ours"))
    b = once(["unzip", "-q", archive, "-d", os.path.join(work, "unzip")], os.path.join(work, "unzip"))
    if i:  # the first pair warms the page cache
        ours.append(a); theirs.append(b)
# Same tree?
diff = subprocess.run(["diff", "-r", os.path.join(work, "ours"), os.path.join(work, "unzip")], capture_output=True)
assert diff.returncode == 0, diff.stdout[:500]
mo, mt = statistics.median(ours), statistics.median(theirs)
size = os.path.getsize(archive)
total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(work, "ours")) for f in fs)
print(f"archive: {size / 1e6:.1f} MB, 2000 files, {total / 1e6:.1f} MB extracted")
print(f"tuixiu-sandbox __extract: median {mo * 1000:.1f} ms (min {min(ours) * 1000:.1f}, max {max(ours) * 1000:.1f}) over {runs} runs")
print(f"unzip -q:                 median {mt * 1000:.1f} ms (min {min(theirs) * 1000:.1f}, max {max(theirs) * 1000:.1f}) over {runs} runs")
print(f"ratio ours/unzip: {mo / mt:.2f} (target <= 1.00)")
PY
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1), kernel $(uname -r), $(unzip -v | head -1 | cut -d' ' -f1-2)"
