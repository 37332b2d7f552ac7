#!/usr/bin/env bash
# bench: extraction time and peak RSS against archive size and entry count (anchor: `unzip -q`; writes docs/plots/extract-*)
# Scaling curve (c) (docs/benchmarks.md, "Extraction against"): zip extraction
# time and peak memory against archive size (1 MB ... 1 GB) and entry count (10
# ... 100 000), ours (`__extract`, default workers) next to `unzip -q` at every
# point.
#
#   scripts/bench curve-extract            (about 10 minutes on 2 cores)
#   ROUNDS=3 MAX_MB=256 scripts/bench curve-extract   (more rounds, smaller top)
#   PLOT_ONLY=1 scripts/bench curve-extract        (redraw the SVGs from the CSV)
#
# Size sweep: 64 files of text-like data (scripts/make-zip.py, level 6)
# sized so the archive is about 1, 4, 16, 64, 256, 1024 MB. Count sweep:
# 10 ... 100 000 files of 4 KiB. Each point: ours and unzip alternate
# ROUNDS times (default 2) into fresh directories on /dev/shm; the median
# time and the largest peak RSS (GNU time) are kept. The limits are raised
# for `__extract` (the defaults refuse 100 MiB and 5 000 entries).
# Writes docs/plots/extract.csv and the SVGs beside it (scripts/plot.py).
source "$(dirname "$0")/lib.sh"
rounds="${ROUNDS:-2}"
max_mb="${MAX_MB:-1024}"

csv=docs/plots/extract.csv
if [ -z "${PLOT_ONLY:-}" ]; then
bench_install unzip:unzip /usr/bin/time:time
bench_build --bin tuixiu-sandbox-full
bin="$REL/tuixiu-sandbox-full"
work="$(bench_scratch /dev/shm)"
mkdir -p docs/plots

python3 - "$bin" "$work" "$rounds" "$max_mb" "$csv" <<'PY'
import csv, os, shutil, statistics, subprocess, sys, time
bin, work, rounds, max_mb, out_csv = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
archive = os.path.join(work, "a.zip")
RATIO = 0.535  # archive bytes / extracted bytes of make-zip.py's text at level 6

def timed(cmd, d):
    shutil.rmtree(d, ignore_errors=True)
    os.mkdir(d)
    rss = os.path.join(work, "rss")
    t = time.perf_counter()
    subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss] + cmd, check=True)
    elapsed = time.perf_counter() - t
    with open(rss) as f:
        kib = int(f.read().split()[-1])
    return elapsed * 1000, kib / 1024

def point(sweep, files, file_bytes):
    size = int(subprocess.run([sys.executable, "scripts/make-zip.py", archive, "--files", str(files),
                               "--file-bytes", str(file_bytes), "--dirs", str(min(40, files))],
                              check=True, capture_output=True, text=True).stdout)
    ours_d, unzip_d = os.path.join(work, "ours"), os.path.join(work, "unzip")
    ours = [bin, "__extract", archive, ours_d, "--zip-max-entries", "1000000",
            "--zip-max-file-bytes", "64G", "--zip-max-total-bytes", "64G"]
    anchor = ["unzip", "-q", archive, "-d", unzip_d]
    samples = {"ours": [], "unzip": []}
    peak = {"ours": 0.0, "unzip": 0.0}
    for _ in range(rounds):
        for name, cmd, d in (("ours", ours, ours_d), ("unzip", anchor, unzip_d)):
            ms, mib = timed(cmd, d)
            samples[name].append(ms)
            peak[name] = max(peak[name], mib)
    assert subprocess.run(["diff", "-rq", ours_d, unzip_d], capture_output=True).returncode == 0, "trees differ"
    shutil.rmtree(ours_d)
    shutil.rmtree(unzip_d)
    row = {"sweep": sweep, "archive_mb": round(size / 1e6, 3), "entries": files,
           "extracted_mb": round(files * file_bytes / 1e6, 3),
           "ours_ms": round(statistics.median(samples["ours"]), 1),
           "unzip_ms": round(statistics.median(samples["unzip"]), 1),
           "ours_rss_mib": round(peak["ours"], 1), "unzip_rss_mib": round(peak["unzip"], 1),
           "load": round(os.getloadavg()[0], 1)}
    print(row, flush=True)
    return row

rows = []
for mb in (1, 4, 16, 64, 256, 1024):
    if mb <= max_mb:
        rows.append(point("size", 64, int(mb * 1e6 / RATIO / 64)))
for n in (10, 100, 1000, 10000, 100000):
    rows.append(point("count", n, 4096))
with open(out_csv, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
PY
fi

plot() { python3 scripts/plot.py "$csv" --label ours_ms=tuixiu-sandbox --label unzip_ms="unzip -q" \
    --label ours_rss_mib=tuixiu-sandbox --label unzip_rss_mib="unzip -q" "$@"; }
plot --where sweep=size --x archive_mb --y ours_ms,unzip_ms --logx --logy --xlabel "archive size, MB (64 entries)" \
    --ylabel "wall time, ms" --title "Extraction time against archive size" --out docs/plots/extract-time-size.svg
plot --where sweep=size --x archive_mb --y ours_rss_mib,unzip_rss_mib --logx --xlabel "archive size, MB (64 entries)" \
    --ylabel "peak RSS, MiB" --title "Extraction peak memory against archive size" --out docs/plots/extract-rss-size.svg
plot --where sweep=count --x entries --y ours_ms,unzip_ms --logx --logy --xlabel "entries (4 KiB each)" \
    --ylabel "wall time, ms" --title "Extraction time against entry count" --out docs/plots/extract-time-count.svg
plot --where sweep=count --x entries --y ours_rss_mib,unzip_rss_mib --logx --xlabel "entries (4 KiB each)" \
    --ylabel "peak RSS, MiB" --title "Extraction peak memory against entry count" --out docs/plots/extract-rss-count.svg
bench_machine; echo "wrote $csv and docs/plots/extract-*.svg"
