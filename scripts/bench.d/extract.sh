#!/usr/bin/env bash
# bench: the safe zip extractor, 90 MB in 2 000 files (anchor: `unzip -q`, target <= 0.5x)
# Benchmark: the safe zip extractor of downloadExtract against Info-ZIP's
# `unzip -q`, on the same archive, alternating runs in one session.
#
#   scripts/bench extract [RUNS]          (default 15 runs of each)
#   BASE_BIN=/path/to/older/tuixiu-sandbox-full scripts/bench extract
#
# The archive: 2 000 files of 44 KiB of text-like data each (90 MB) in 40
# directories, deflated by Python's zipfile (level 6) into a ~50 MB zip,
# generated deterministically. Every tool extracts into a fresh directory
# on a tmpfs (/dev/shm), as skills land in the sandbox's private tmpfs
# home, so the numbers measure the extractors rather than the disk's
# writeback. Commands, alternating in each round: `__extract` with its
# default workers, `__extract --threads 1`, the build in BASE_BIN if given
# (an earlier commit, same archive), and `unzip -q` (the anchor). One
# warm-up round; the trees are compared with `diff -r` at the end.
# Prints the machine, a Markdown table (median, p10, p90, peak RSS from
# GNU time) and each median over unzip's (target: <= 0.5, twice its speed).
source "$(dirname "$0")/lib.sh"
runs="${1:-15}"

bench_install unzip:unzip /usr/bin/time:time
bench_build --bin tuixiu-sandbox-full
bin="$REL/tuixiu-sandbox-full"

work="$(bench_scratch /dev/shm)"

python3 scripts/make-zip.py "$work/bench.zip" --files 2000 --file-bytes 45056 --dirs 40

python3 - "$bin" "$work" "$runs" "${BASE_BIN:-}" <<'PY'
import os, shutil, statistics, subprocess, sys, time
bin, work, runs, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
archive = os.path.join(work, "bench.zip")
out = lambda name: os.path.join(work, name)
commands = [
    ("`__extract` (default workers)", lambda d: [bin, "__extract", archive, d], "ours"),
    ("`__extract --threads 1`", lambda d: [bin, "__extract", "--threads", "1", archive, d], "ours1"),
]
if base:
    commands.append((f"`__extract`, {os.path.basename(base)}", lambda d: [base, "__extract", archive, d], "base"))
commands.append(("`unzip -q` (anchor)", lambda d: ["unzip", "-q", archive, "-d", d], "unzip"))

def once(cmd, d):
    shutil.rmtree(d, ignore_errors=True)
    os.mkdir(d)
    subprocess.run(["sync"], check=True)
    # GNU time reports the command's peak RSS (a child forked from this
    # Python would carry Python's own into its ru_maxrss); it adds the
    # same small start to every command.
    rss = os.path.join(work, "rss")
    t = time.perf_counter()
    subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss] + cmd, check=True)
    elapsed = time.perf_counter() - t
    with open(rss) as f:
        return elapsed, int(f.read().split()[-1])

samples = {name: [] for name, _, _ in commands}
rss = {name: 0 for name, _, _ in commands}
for i in range(runs + 1):
    for name, cmd, d in commands:
        t, m = once(cmd(out(d)), out(d))
        if i:  # the first round warms the page cache
            samples[name].append(t)
            rss[name] = max(rss[name], m)
for _, _, d in commands[:-1]:
    diff = subprocess.run(["diff", "-r", out(d), out("unzip")], capture_output=True)
    assert diff.returncode == 0, diff.stdout[:500]
size = os.path.getsize(archive)
total = sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(out("ours")) for f in fs)
print(f"archive: {size / 1e6:.1f} MB, 2000 files, {total / 1e6:.1f} MB extracted; {runs} rounds after one warm-up; "
      f"load average {os.getloadavg()[0]:.1f}")
anchor = statistics.median(samples[commands[-1][0]])
print("| command | median ms | p10 | p90 | peak RSS | time / unzip |")
print("|---|---|---|---|---|---|")
for name, _, _ in commands:
    xs = sorted(samples[name])
    med = statistics.median(xs)
    print(f"| {name} | {med * 1000:.1f} | {xs[len(xs) // 10] * 1000:.1f} | {xs[(len(xs) * 9) // 10] * 1000:.1f} "
          f"| {rss[name] / 1024:.1f} MiB | **{med / anchor:.2f}** |")
PY
bench_machine "$(unzip -v | head -1 | cut -d' ' -f1-2)"
