#!/usr/bin/env python3
# bench: skill jobs: per-job overhead, result-cache hits, 50 concurrent jobs (anchor: the stub engine as a plain subprocess)
"""Benchmark of skill jobs: per-job overhead, the result cache's hit
path, and 50 concurrent jobs.

Starts `tuixiu-sandbox skills serve` on a free port with the test skill
(tests/fixtures/skills/tuixiu-demo) and the stub engine
(tests/fixtures/stub-engine.sh) in a temporary directory, then:

1. Overhead (the cache's miss path): N jobs one after another, each with
   inputs no job had before (its own query), timed from `POST /v1/jobs`
   through the upload to the first `GET /v1/jobs/{id}` that says
   `succeeded` (polled every millisecond). The stub records its own start
   and end (report.json); overhead = job time - the stub's own time.
   Anchor, in the same run, alternating with the jobs: the same stub run
   as a plain host subprocess (no sandbox, no HTTP), which is what an
   unsandboxed runner costs at least.
2. The cache's hit path: N jobs with the inputs of one that succeeded
   (answered `cache_hit: true`, no engine), timed the same way, in the
   same loop.
3. Concurrency: 50 jobs created and uploaded at once from 50 threads;
   every one must end `succeeded` (none lost).

    scripts/bench skill-jobs [--bin target/release/tuixiu-sandbox] [-n 40]
                        [--base-bin OTHER/target/release/tuixiu-sandbox]

`--base-bin` starts a second server from another build (e.g. main) with
its own data directory and runs its jobs in the same loop, alternating
with this one's, so both see the same machine and load; its rows are
marked `base`, and the miss-path ratio new/base is printed. A build with
no result cache answers a repeat with `cache_hit: false`: its hit-path
row is left out.

Where the overhead goes, per job (`--phases`): the server runs with
`TUIXIU_LOG=tuixiu_sandbox=debug`, which logs when the launcher started
and was reaped in ns since the epoch; the client's own steps and the
stub's start and end (report.json, `date +%s%N`) are on the same clock,
so the job splits into: create, upload, upload answered -> launcher
started (queue, running record, prepare), sandbox in (launcher started
-> stub started), the stub, sandbox out (stub ended -> reaped), reaped ->
seen succeeded (finish, record, polling). KEEP_SERVER_LOG=FILE keeps the
server's log.

Prints a Markdown table for docs/benchmarks.md. Run as root (the server
maps the sandbox user onto the caller, any caller works).
"""
import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import urllib.error
import urllib.request
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TARGET = 0.025  # overhead median, seconds (docs/benchmarks.md, "Skill jobs")


def http(addr, method, path, body=None, content_type=None):
    req = urllib.request.Request(f"http://{addr}{path}", data=body, method=method)
    if content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def input_zip():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("input_file", "numbers: 2 3 5 7\n")
    return buf.getvalue()


def multipart(data):
    boundary = "----bench-boundary-42"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.zip\"\r\n"
            "Content-Type: application/zip\r\n\r\n").encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def one_job(addr, zbody, ctype, poll=0.001, marks=None, query=None):
    """One job, timed to the first status that says it ended: its id, that
    status, the seconds, and whether the upload said `cache_hit`."""
    t0 = time.perf_counter()
    marks = {} if marks is None else marks
    marks["create"] = time.time_ns()
    st, body = http(addr, "POST", "/v1/jobs", json.dumps({
        "skill_id": "tuixiu-demo", "engine": "command",
        "input": {"query": query or f"bench {uuid.uuid4()}"}, "parameter": {"mode": "ok"}}).encode(),
        "application/json")
    assert st == 200, body
    rid = json.loads(body)["request_id"]
    marks["upload"] = time.time_ns()
    st, body = http(addr, "POST", f"/v1/jobs/{rid}/upload", zbody, ctype)
    assert st == 200, body
    hit = bool(json.loads(body).get("cache_hit"))
    marks["uploaded"] = time.time_ns()
    while True:
        st, body = http(addr, "GET", f"/v1/jobs/{rid}")
        status = json.loads(body).get("status") if st == 200 else None
        if status in ("succeeded", "failed", "canceled"):
            break
        time.sleep(poll)
    t1 = time.perf_counter()
    marks["done"] = time.time_ns()
    return rid, status, t1 - t0, hit


def engine_ns(addr, rid):
    """The stub's own start and end, ns since the epoch."""
    st, body = http(addr, "GET", f"/v1/jobs/{rid}/artifacts/artifacts/report.json")
    assert st == 200, body
    r = json.loads(body)
    return r["engine_start_ns"], r["engine_end_ns"]


def launcher_ns(log):
    """request id -> (launcher started, reaped), from the server's debug log."""
    found = {}
    with open(log) as f:
        for line in f:
            if ": launcher started at " in line:
                words = line.split()
                rid = words[words.index("job") + 1].rstrip(":")
                found[rid] = (int(words[words.index("started") + 2]), int(words[words.index("reaped") + 2]))
    return found


PHASES = [("create (`POST /v1/jobs`)", "create", "upload"), ("upload (`POST …/upload`)", "upload", "uploaded"),
          ("answered → launcher started (queue, running record, prepare)", "uploaded", "spawn"),
          ("sandbox in (launcher started → stub started)", "spawn", "start"),
          ("sandbox out (stub ended → launcher reaped)", "end", "reaped"),
          ("reaped → seen succeeded (finish, record, polling)", "reaped", "done")]


def plain_stub(workdir, stub):
    """The stub as a plain host subprocess: no sandbox, no HTTP."""
    shutil.rmtree(os.path.join(workdir, "artifacts"), ignore_errors=True)
    prompt = f"mode=ok\ninput_file={workdir}/input_file\nquery=bench\n"
    t0 = time.perf_counter()
    subprocess.run(["sh", stub, prompt], cwd=workdir, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def record_write(directory):
    """What the server pays per job record: write, fdatasync, rename."""
    tmp, final = os.path.join(directory, ".probe.tmp"), os.path.join(directory, "probe.json")
    t0 = time.perf_counter()
    with open(tmp, "w") as f:
        f.write("x" * 900)
        f.flush()
        os.fdatasync(f.fileno())
    os.rename(tmp, final)
    return time.perf_counter() - t0


def stats(xs):
    xs = sorted(xs)
    return {"median": statistics.median(xs), "p10": xs[len(xs) // 10], "p90": xs[(len(xs) * 9) // 10],
            "mean": statistics.fmean(xs)}


def start_server(binary, tmp, name, skills, engines, phases):
    """`skills serve` from `binary` with its own data directory: the
    process, its address and its data directory."""
    data = os.path.join(tmp, f"data-{name}")
    env = {k: v for k, v in os.environ.items() if k == "PATH"}
    env |= {"TUIXIU_LOG": "tuixiu_sandbox=debug"} if phases else \
        {k: v for k, v in os.environ.items() if k == "TUIXIU_LOG"}
    server = subprocess.Popen(
        [binary, "skills", "serve", "--skills-dir", skills, "--data-dir", data,
         "--listen", "127.0.0.1:0", "--engines", engines, "--max-concurrent", "8", "--max-queue", "128"],
        stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, f"server-{name}.log"), "w"), env=env)
    line = server.stdout.readline().decode()
    assert line.startswith("listening on "), line
    return server, line.split()[-1], data


def table(rows):
    ms = lambda s: f"{s * 1000:.1f}"
    print("| measure | median ms | p10 | p90 | mean |")
    print("|---|---|---|---|---|")
    for name, xs in rows:
        if xs:
            s = stats(xs)
            print(f"| {name} | {ms(s['median'])} | {ms(s['p10'])} | {ms(s['p90'])} | {ms(s['mean'])} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(
        os.path.abspath(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))), "release", "tuixiu-sandbox"))
    ap.add_argument("--base-bin", help="another build to run side by side (e.g. main's)")
    ap.add_argument("-n", "--runs", type=int, default=40)
    ap.add_argument("--concurrent", type=int, default=50)
    ap.add_argument("--dir", help="where the server's skills and data go (default: the system's temporary "
                    "directory); /dev/shm shows what the synced record writes cost")
    ap.add_argument("--phases", action="store_true", help="split the overhead (server at debug level)")
    opts = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench-skill-jobs-", dir=opts.dir)
    os.chmod(tmp, 0o755)
    servers = []
    try:
        skills = os.path.join(tmp, "skills")
        shutil.copytree(os.path.join(FIXTURES, "skills"), skills)
        engine_dir = os.path.join(tmp, "engine")
        os.makedirs(engine_dir)
        stub = os.path.join(engine_dir, "stub-engine.sh")
        shutil.copy(os.path.join(FIXTURES, "stub-engine.sh"), stub)
        engines = os.path.join(tmp, "engines.json")
        with open(engines, "w") as f:
            json.dump({"engines": {"command": {
                "argv": ["sh", "/engine/stub-engine.sh", "{prompt}"],
                "ro_binds": [{"src": engine_dir, "dst": "/engine"}], "network": "off"}}}, f)
        plain = os.path.join(tmp, "plain")
        os.makedirs(plain)
        with open(os.path.join(plain, "input_file"), "w") as f:
            f.write("numbers: 2 3 5 7\n")
        server, addr, data = start_server(opts.bin, tmp, "new", skills, engines, opts.phases)
        servers.append(server)
        base = None
        if opts.base_bin:
            b_server, b_addr, _ = start_server(opts.base_bin, tmp, "base", skills, engines, False)
            servers.append(b_server)
            base = b_addr
        zbody, ctype = multipart(input_zip())

        for _ in range(5):  # warm-up
            one_job(addr, zbody, ctype)
            if base:
                one_job(base, zbody, ctype)
            plain_stub(plain, stub)
        # The job the hit path repeats.
        _, status, _, _ = one_job(addr, zbody, ctype, query="bench cached")
        assert status == "succeeded", status
        overhead, total, engine, anchor, synced, marks = [], [], [], [], [], {}
        hits, base_total, base_overhead = [], [], []
        for _ in range(opts.runs):
            m = {}
            rid, status, secs, hit = one_job(addr, zbody, ctype, marks=m)
            assert status == "succeeded" and not hit, (status, hit)
            m["start"], m["end"] = engine_ns(addr, rid)
            marks[rid] = m
            e = (m["end"] - m["start"]) / 1e9
            total.append(secs)
            engine.append(e)
            overhead.append(secs - e)
            if base:
                b_rid, status, secs, _ = one_job(base, zbody, ctype)
                assert status == "succeeded", status
                b_start, b_end = engine_ns(base, b_rid)
                base_total.append(secs)
                base_overhead.append(secs - (b_end - b_start) / 1e9)
            _, status, secs, hit = one_job(addr, zbody, ctype, query="bench cached")
            assert status == "succeeded", status
            if hit:
                hits.append(secs)
            anchor.append(plain_stub(plain, stub))
            synced.append(record_write(data))

        results = {}
        threads = []
        t0 = time.perf_counter()
        for i in range(opts.concurrent):
            def run(i=i):
                results[i] = one_job(addr, zbody, ctype, poll=0.02)
            th = threading.Thread(target=run)
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        succeeded = sum(1 for r in results.values() if r[1] == "succeeded")

        ms = lambda s: f"{s * 1000:.1f}"
        o, t, a = stats(overhead), stats(total), stats(anchor)
        print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
              f"kernel {platform.release()}; {opts.runs} sequential jobs after 5 warm-up; "
              f"load average {os.getloadavg()[0]:.1f}\n")
        table([("job total, cache miss (create → upload → succeeded)", total),
               ("stub's own time (inside the sandbox)", engine),
               ("**job overhead**, cache miss (total − stub)", overhead),
               ("**cache hit**: job total (create → upload → succeeded, no engine)", hits),
               ("base: job total (create → upload → succeeded)", base_total),
               ("base: **job overhead** (total − stub)", base_overhead),
               ("anchor: the stub as a plain host subprocess", anchor),
               ("one synced record write in the data directory (Python)", synced)])
        print(f"\nratio job total / anchor (medians): {t['median'] / a['median']:.2f}")
        if hits:
            print(f"ratio cache hit / cache miss, job totals (medians): "
                  f"{stats(hits)['median'] / t['median']:.3f} ({len(hits)}/{opts.runs} repeats were hits)")
        if base_overhead:
            print(f"ratio overhead new / base (medians): {o['median'] / stats(base_overhead)['median']:.2f}; "
                  f"job totals: {t['median'] / stats(base_total)['median']:.2f}")
        print(f"overhead median {ms(o['median'])} ms: {'PASS' if o['median'] < TARGET else 'FAIL'} "
              f"(target < {TARGET * 1000:.0f} ms)")
        print(f"\n{opts.concurrent} concurrent jobs (8 engines at a time): {succeeded}/{opts.concurrent} succeeded, "
              f"none lost: {'PASS' if succeeded == opts.concurrent else 'FAIL'}; wall {wall:.2f} s")
        if opts.phases:
            for rid, (spawn, reaped) in launcher_ns(os.path.join(tmp, "server-new.log")).items():
                if rid in marks:
                    marks[rid].update(spawn=spawn, reaped=reaped)
            ms_ = [m for m in marks.values() if "spawn" in m]
            print(f"\nwhere the overhead goes ({len(ms_)} jobs; medians of each phase, which need not add up):\n")
            print("| phase | median ms | p10 | p90 |")
            print("|---|---|---|---|")
            for name, a_, b_ in PHASES:
                s_ = stats([(m[b_] - m[a_]) / 1e9 for m in ms_])
                print(f"| {name} | {ms(s_['median'])} | {ms(s_['p10'])} | {ms(s_['p90'])} |")
        return 0 if o["median"] < TARGET and succeeded == opts.concurrent else 1
    finally:
        for server in servers:
            server.terminate()
            server.wait()
        if os.environ.get("KEEP_SERVER_LOG"):
            shutil.copy(os.path.join(tmp, "server-new.log"), os.environ["KEEP_SERVER_LOG"])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
