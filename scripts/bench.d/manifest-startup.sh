#!/usr/bin/env bash
# bench: what a manifest adds to `run` startup (anchor: `run -- true` alone, target <= +20 ms)
# Benchmark: what a manifest adds to `tuixiu-sandbox run` startup.
#
# Baseline: `run --workspace WS -- true`. With the manifest: the same run
# with `--manifest` holding a WORKSPACE "." bind (of WS), a writeFile, and
# a downloadExtract of a 1 MB skill zip already in the input cache (so no
# network: the cached archive is re-hashed and extracted). Runs alternate
# in one session; the medians and their difference are printed (target:
# the manifest adds at most 20 ms).
#
# Usage: scripts/bench manifest-startup [RUNS]   (default 40 of each)
source "$(dirname "$0")/lib.sh"
runs="${1:-40}"

bench_build
bin="$REL/tuixiu-sandbox"
work="$(bench_scratch)"
mkdir -p "$work/ws" "$work/cache/zips"
chmod 700 "$work/cache" "$work/cache/zips"

python3 - "$work" <<'PY'
import hashlib, json, os, random, sys, zipfile
work = sys.argv[1]
rng = random.Random(7)
path = os.path.join(work, "skill.zip")
with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("SKILL.md", "# bench skill\nRun scripts/run.sh.\n")
    for i in range(20):  # incompressible: the zip is ~1 MB
        z.writestr(f"assets/blob{i:02d}.bin", rng.randbytes(50 * 1024))
data = open(path, "rb").read()
sha = hashlib.sha256(data).hexdigest()
os.rename(path, os.path.join(work, "cache", "zips", sha + ".zip"))
manifest = {"agentInputs": {"version": 1, "items": [
    {"id": "workspace", "apply": "bindMount", "source": {"type": "hostPath", "path": os.path.join(work, "ws")},
     "target": {"root": "WORKSPACE", "path": "."}},
    {"id": "agents-md", "apply": "writeFile", "source": {"type": "inlineText", "text": "# instructions\n" * 20},
     "target": {"root": "USER_HOME", "path": ".codex/AGENTS.md"}},
    {"id": "skill:bench", "apply": "downloadExtract",
     "source": {"type": "httpZip", "uri": "/api/acp-proxy/skills/packages/bench.zip", "contentHash": sha},
     "target": {"root": "USER_HOME", "path": ".codex/skills/bench"}},
]}}
json.dump(manifest, open(os.path.join(work, "m.json"), "w"))
print(f"skill zip: {len(data) / 1e6:.2f} MB, sha256 {sha}")
PY

python3 - "$bin" "$work" "$runs" <<'PY'
import os, statistics, subprocess, sys, time
bin, work, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
ws = os.path.join(work, "ws")
plain = [bin, "run", "--workspace", ws, "--", "true"]
manifest = [bin, "run", "--workspace", ws, "--manifest", os.path.join(work, "m.json"),
            "--inputs-cache", os.path.join(work, "cache"),
            "--inputs-base-url", "http://127.0.0.1:9", "--", "true"]
def once(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t
a, b = [], []
for i in range(runs + 2):
    x, y = once(plain), once(manifest)
    if i >= 2:
        a.append(x); b.append(y)
ma, mb = statistics.median(a), statistics.median(b)
print(f"run -- true:            median {ma * 1000:.1f} ms over {runs} runs")
print(f"run --manifest -- true: median {mb * 1000:.1f} ms over {runs} runs")
print(f"added by the manifest: {(mb - ma) * 1000:.1f} ms (target <= 20 ms)")
PY
bench_machine
