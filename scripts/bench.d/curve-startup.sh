#!/usr/bin/env bash
# bench: startup against bind mounts and seccomp profile size (anchor: `run -- /bin/true`; writes docs/plots/startup-*)
# Scaling curve (d) (docs/benchmarks.md, "Startup against bind mounts"): startup
# time of `run -- /bin/true` against the number of bind mounts (0 ... 110: a
# sandbox takes at most 128 host sources, MAX_HOST_SOURCES in
# sandbox/src/prepare.rs, of which the system view and /dev use about ten) and
# against the size of the seccomp profile (0 ... 1 000 rules).
#
#   scripts/bench curve-startup              (a few minutes on 2 cores)
#   ROUNDS=100 scripts/bench curve-startup   (more rounds per point)
#   PLOT_ONLY=1 scripts/bench curve-startup  (redraw the SVGs from the CSV)
#
# Binds: N `--ro-bind` of N distinct host directories (one small file each)
# onto /mnt/bNNN, on top of the default hardened sandbox. Seccomp: a JSON
# profile (`--seccomp FILE`) with `defaultAction: SCMP_ACT_ALLOW` and N
# rules, each denying `ioctl` with one request number (an argument
# comparison, so no two rules merge); parsed, compiled and installed on
# every start, as a user's own profile is. At every point the sandbox
# alternates ROUNDS times (default 60, after five warm-up pairs) with the
# anchor `run -- /bin/true` (the default sandbox: no extra bind, the
# built-in `default` profile); the added time is the difference of the
# medians. Writes docs/plots/startup.csv and the SVGs beside it
# (scripts/plot.py).
source "$(dirname "$0")/lib.sh"
rounds="${ROUNDS:-60}"

csv=docs/plots/startup.csv
if [ -z "${PLOT_ONLY:-}" ]; then
bench_build --bin tuixiu-sandbox
bin="$REL/tuixiu-sandbox"
work="$(bench_scratch)"
mkdir -p docs/plots "$work/ws"

python3 - "$bin" "$work" "$rounds" "$csv" <<'PY'
import csv, json, os, statistics, sys
sys.path.insert(0, "scripts")
from abbench import run_once  # times one run; a failing run ends the sweep

bin, work, rounds, out_csv = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
base = [bin, "run", "--workspace", os.path.join(work, "ws")]
anchor = base + ["--", "/bin/true"]
WARMUP = 5

def point(sweep, n, cmd):
    pairs = [(run_once(anchor), run_once(cmd)) for _ in range(rounds + WARMUP)][WARMUP:]
    a, b = statistics.median(x for x, _ in pairs), statistics.median(y for _, y in pairs)
    row = {"sweep": sweep, "n": n, "run_ms": round(b, 3), "anchor_ms": round(a, 3),
           "added_ms": round(b - a, 3), "load": round(os.getloadavg()[0], 1)}
    print(row, flush=True)
    return row

rows = []
binds = os.path.join(work, "binds")
for i in range(110):
    d = os.path.join(binds, f"b{i:03d}")
    os.makedirs(d)
    with open(os.path.join(d, "f"), "w") as f:
        f.write("x\n")
for n in (0, 1, 5, 10, 25, 50, 75, 100, 110):
    args = []
    for i in range(n):
        args += ["--ro-bind", os.path.join(binds, f"b{i:03d}"), f"/mnt/b{i:03d}"]
    rows.append(point("binds", n, base + args + ["--", "/bin/true"]))

profile = os.path.join(work, "seccomp.json")
for n in (0, 10, 50, 100, 200, 400, 700, 1000):
    rules = [{"names": ["ioctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
              "args": [{"index": 1, "value": 0x7000 + i, "op": "SCMP_CMP_EQ"}]} for i in range(n)]
    with open(profile, "w") as f:
        json.dump({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}, f)
    rows.append(point("seccomp", n, base + ["--seccomp", profile, "--", "/bin/true"]))

with open(out_csv, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
PY
fi

plot() { python3 scripts/plot.py "$csv" --label run_ms="run with N" --label anchor_ms="run -- /bin/true (anchor)" \
    --label added_ms="added by the N" "$@"; }
plot --where sweep=binds --x n --y run_ms,anchor_ms,added_ms --xlabel "extra --ro-bind mounts" \
    --ylabel "wall time, ms" --title "run -- /bin/true against bind mounts" --out docs/plots/startup-binds.svg
plot --where sweep=seccomp --x n --y run_ms,anchor_ms,added_ms --xlabel "seccomp profile rules (ioctl argument matches)" \
    --ylabel "wall time, ms" --title "run -- /bin/true against seccomp profile size" --out docs/plots/startup-seccomp.svg
bench_machine; echo "wrote $csv and docs/plots/startup-*.svg"
