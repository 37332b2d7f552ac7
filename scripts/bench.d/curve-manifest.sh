#!/usr/bin/env bash
# bench: what a manifest adds to `run` against its item count and input size (anchor: `run -- true`; writes docs/plots/manifest-*)
# Scaling curve (b) (docs/benchmarks.md, "Manifest apply against"): what a
# manifest adds to `run`, against its item count (1 ... 1 000) and against the
# bytes it lands (1 ... 256 MB).
#
#   scripts/bench curve-manifest            (a few minutes on 2 cores)
#   ROUNDS=20 scripts/bench curve-manifest  (more rounds per point)
#   PLOT_ONLY=1 scripts/bench curve-manifest  (redraw the SVGs from the CSV)
#
# Items: N `writeFile` items of 1 KiB each into the sandbox's tmpfs home
# (`notes/dK/fNNNN.md`, 10 directories). Bytes: one `copy` of a host
# directory of 16 files totalling 1, 4, 16, 64 or 256 MB into the home.
# At every point `run --manifest m.json -- true` alternates ROUNDS times
# (default 10, after one warm-up pair) with the anchor `run -- true` (the
# same sandbox without a manifest); the apply time is the difference of
# the medians. Writes docs/plots/manifest.csv and the SVGs beside it
# (scripts/plot.py).
source "$(dirname "$0")/lib.sh"
rounds="${ROUNDS:-10}"

csv=docs/plots/manifest.csv
if [ -z "${PLOT_ONLY:-}" ]; then
bench_build
bin="$REL/tuixiu-sandbox"
work="$(bench_scratch)"
mkdir -p docs/plots "$work/ws"

python3 - "$bin" "$work" "$rounds" "$csv" <<'PY'
import csv, json, os, shutil, statistics, subprocess, sys, time
bin, work, rounds, out_csv = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ws, manifest = os.path.join(work, "ws"), os.path.join(work, "m.json")
plain = [bin, "run", "--workspace", ws, "--", "true"]
with_manifest = [bin, "run", "--workspace", ws, "--manifest", manifest, "--allow-host-path", work, "--", "true"]

def once(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t) * 1000

def point(sweep, items, total_bytes):
    a, b = [], []
    for i in range(rounds + 1):
        x, y = once(plain), once(with_manifest)
        if i:
            a.append(x); b.append(y)
    row = {"sweep": sweep, "items": items, "mb": round(total_bytes / 1e6, 3),
           "run_ms": round(statistics.median(a), 2), "manifest_run_ms": round(statistics.median(b), 2),
           "apply_ms": round(statistics.median(b) - statistics.median(a), 2), "load": round(os.getloadavg()[0], 1)}
    print(row, flush=True)
    return row

def write(items):
    with open(manifest, "w") as f:
        json.dump({"agentInputs": {"version": 1, "items": items}}, f)

rows = []
text = ("0123456789abcdef" * 64)[:1023] + "\n"
for n in (1, 3, 10, 30, 100, 300, 1000):
    write([{"id": f"note-{i}", "apply": "writeFile", "source": {"type": "inlineText", "text": text},
            "target": {"root": "USER_HOME", "path": f"notes/d{i % 10}/f{i:04d}.md"}} for i in range(n)])
    rows.append(point("items", n, n * len(text)))
src = os.path.join(work, "src")
for mb in (1, 4, 16, 64, 256):
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    size = mb * 10**6 // 16
    for i in range(16):
        with open(os.path.join(src, f"blob{i:02d}.bin"), "wb") as f:
            f.write(os.urandom(size))
    write([{"id": "data", "apply": "copy", "source": {"type": "hostPath", "path": src},
            "target": {"root": "USER_HOME", "path": "data"}}])
    rows.append(point("bytes", 1, 16 * size))
with open(out_csv, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
PY
fi

plot() { python3 scripts/plot.py "$csv" --label apply_ms="added by the manifest" \
    --label run_ms="run -- true (anchor)" --label manifest_run_ms="run --manifest" "$@"; }
plot --where sweep=items --x items --y manifest_run_ms,run_ms,apply_ms --logx --logy --xlabel "writeFile items (1 KiB each)" \
    --ylabel "wall time, ms" --title "run --manifest against item count" --out docs/plots/manifest-items.svg
plot --where sweep=bytes --x mb --y manifest_run_ms,run_ms,apply_ms --logx --logy --xlabel "bytes copied, MB (16 files)" \
    --ylabel "wall time, ms" --title "run --manifest against bytes landed" --out docs/plots/manifest-bytes.svg
bench_machine; echo "wrote $csv and docs/plots/manifest-*.svg"
