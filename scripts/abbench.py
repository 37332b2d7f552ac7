#!/usr/bin/env python3
"""Side-by-side wall-clock benchmark of two or more commands.

Runs the commands alternately (A B A B ...) so that machine drift affects
all of them alike, after a few warm-up rounds, and prints the median, p10,
p90 and mean of each plus the ratio of each median to the last command's
(the anchor).

    abbench.py [-n RUNS] [--warmup K] [--as-user USER] --name A -- cmd a... --name B -- cmd b...

With --as-user (as root) the benchmark drops to that user's uid and gid,
without supplementary groups, before running anything, so every command
runs unprivileged without a privilege-dropping wrapper (setpriv, su) whose
own start would be added to each measurement.

Every command must exit 0 (a failing run aborts the benchmark: a fast
failure is not a fast start). stdout/stderr go to /dev/null.
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import time


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--runs", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="print results as JSON too")
    ap.add_argument("--as-user", metavar="USER", help="run every command as USER (needs root)")
    opts, rest = ap.parse_known_args(argv)
    commands = []
    while rest:
        if rest[0] != "--name" or len(rest) < 3 or rest[2] != "--":
            ap.error("expected: --name NAME -- COMMAND... [--name NAME -- COMMAND...]")
        name = rest[1]
        rest = rest[3:]
        end = rest.index("--name") if "--name" in rest else len(rest)
        commands.append((name, rest[:end]))
        rest = rest[end:]
    if len(commands) < 2:
        ap.error("need at least two commands")
    return opts, commands


def run_once(cmd):
    start = time.perf_counter_ns()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter_ns() - start
    if proc.returncode != 0:
        sys.exit(f"abbench: {' '.join(cmd)} exited {proc.returncode}")
    return elapsed / 1e6


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), kernel {platform.release()}, uid {os.geteuid()}"


def drop_to(user):
    import pwd

    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)


def main():
    opts, commands = parse(sys.argv[1:])
    if opts.as_user:
        drop_to(opts.as_user)
    for _ in range(opts.warmup):
        for _, cmd in commands:
            run_once(cmd)
    samples = {name: [] for name, _ in commands}
    for _ in range(opts.runs):
        for name, cmd in commands:
            samples[name].append(run_once(cmd))
    anchor = commands[-1][0]
    anchor_median = statistics.median(samples[anchor])
    print(f"machine: {machine()}")
    print(f"runs: {opts.runs} each, alternating, after {opts.warmup} warm-up rounds")
    print(f"{'command':<22} {'median ms':>10} {'p10':>8} {'p90':>8} {'mean':>8} {'vs ' + anchor:>14}")
    result = {}
    for name, _ in commands:
        xs = sorted(samples[name])
        med = statistics.median(xs)
        p10 = xs[len(xs) // 10]
        p90 = xs[(len(xs) * 9) // 10]
        mean = statistics.fmean(xs)
        ratio = med / anchor_median
        result[name] = {"median_ms": med, "p10_ms": p10, "p90_ms": p90, "mean_ms": mean, "ratio": ratio}
        print(f"{name:<22} {med:>10.3f} {p10:>8.3f} {p90:>8.3f} {mean:>8.3f} {ratio:>13.2f}x")
    if opts.json:
        import json
        print(json.dumps(result))


if __name__ == "__main__":
    main()
