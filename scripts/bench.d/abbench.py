#!/usr/bin/env python3
# bench: side-by-side wall-clock timing of any commands, interleaved (the A/B helper the others use; anchor: the last command)
"""Side-by-side wall-clock benchmark of two or more commands.

Runs the commands alternately (A B A B ...) so that machine drift affects
all of them alike, after a few warm-up rounds, and prints the median, p10,
p90 and mean of each plus the ratio of each median to the last command's
(the anchor).

    abbench.py [-n RUNS] [--warmup K] [--as-user USER] --name A -- cmd a... --name B -- cmd b...

A command may run somewhere else, e.g. inside a sandbox, and still be
timed the same way and alternated with the others: `--name A --via DIR --
cmd...` hands it to `abbench.py --serve DIR` running there, which times
each run with the same code and answers with the elapsed time (over two
FIFOs in DIR, `req` and `rep`, that the caller creates).

With --as-user (as root) the benchmark drops to that user's uid and gid,
without supplementary groups, before running anything, so every command
runs unprivileged without a privilege-dropping wrapper (setpriv, su) whose
own start would be added to each measurement.

Every command must exit 0 (a failing run aborts the benchmark: a fast
failure is not a fast start). stdout/stderr go to /dev/null.
"""
import argparse
import json
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
    ap.add_argument("--vs", metavar="NAME", action="append", default=[],
                    help="also print each median's ratio to command NAME's (repeatable)")
    ap.add_argument("--serve", metavar="DIR", help="time the commands sent to DIR/req, answer on DIR/rep")
    opts, rest = ap.parse_known_args(argv)
    if opts.serve:
        return opts, []
    commands = []
    while rest:
        via = None
        if len(rest) >= 5 and rest[0] == "--name" and rest[2] == "--via":
            via = Remote(rest[3])
            rest = rest[:2] + rest[4:]
        if rest[0] != "--name" or len(rest) < 3 or rest[2] != "--":
            ap.error("expected: --name NAME [--via DIR] -- COMMAND... [--name NAME -- COMMAND...]")
        name = rest[1]
        rest = rest[3:]
        end = rest.index("--name") if "--name" in rest else len(rest)
        commands.append((name, via.bind(rest[:end]) if via else rest[:end]))
        rest = rest[end:]
    if len(commands) < 2:
        ap.error("need at least two commands")
    names = [name for name, _ in commands]
    for name in opts.vs:
        if name not in names:
            ap.error(f"--vs {name}: no command of that name")
    return opts, commands


class Remote:
    """A command timed by `abbench.py --serve DIR` elsewhere."""

    def __init__(self, directory):
        self.req = open(os.path.join(directory, "req"), "w")
        self.rep = open(os.path.join(directory, "rep"))

    def bind(self, cmd):
        self.cmd = cmd
        return self

    def run(self):
        self.req.write(json.dumps(self.cmd) + "\n")
        self.req.flush()
        answer = self.rep.readline().strip()
        if not answer.replace(".", "", 1).isdigit():
            sys.exit(f"abbench: remote {' '.join(self.cmd)}: {answer or 'no answer'}")
        return float(answer)


def serve(directory):
    with open(os.path.join(directory, "req")) as req, open(os.path.join(directory, "rep"), "w") as rep:
        for line in req:
            elapsed, code = time_once(json.loads(line))
            rep.write(f"{elapsed}\n" if code == 0 else f"exited {code}\n")
            rep.flush()


def time_once(cmd):
    start = time.perf_counter_ns()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter_ns() - start) / 1e6, proc.returncode


def run_once(cmd):
    if isinstance(cmd, Remote):
        return cmd.run()
    elapsed, code = time_once(cmd)
    if code != 0:
        sys.exit(f"abbench: {' '.join(cmd)} exited {code}")
    return elapsed


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
    if opts.serve:
        serve(opts.serve)
        return
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
    others = [(name, statistics.median(samples[name])) for name in opts.vs if name != anchor]
    print(f"machine: {machine()}")
    print(f"runs: {opts.runs} each, alternating, after {opts.warmup} warm-up rounds")
    print(f"{'command':<22} {'median ms':>10} {'p10':>8} {'p90':>8} {'mean':>8} {'vs ' + anchor:>14}"
          + "".join(f" {'vs ' + name:>14}" for name, _ in others))
    result = {}
    for name, _ in commands:
        xs = sorted(samples[name])
        med = statistics.median(xs)
        p10 = xs[len(xs) // 10]
        p90 = xs[(len(xs) * 9) // 10]
        mean = statistics.fmean(xs)
        ratio = med / anchor_median
        result[name] = {"median_ms": med, "p10_ms": p10, "p90_ms": p90, "mean_ms": mean, "ratio": ratio}
        for other, other_median in others:
            result[name][f"ratio_{other}"] = med / other_median
        print(f"{name:<22} {med:>10.3f} {p10:>8.3f} {p90:>8.3f} {mean:>8.3f} {ratio:>13.2f}x"
              + "".join(f" {med / m:>13.2f}x" for _, m in others))
    if opts.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
