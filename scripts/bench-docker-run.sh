#!/usr/bin/env bash
# Startup overhead of the docker provider: `tuixiu-sandbox run --provider
# docker --image IMG -- true` against a plain `docker run --rm IMG true`,
# alternating in one run, so both see the same engine and machine state.
# Prints the medians and the ratio (target: at most 1.1).
#
# Needs a running Docker Engine and the test image (scripts/ci-setup.d/20-docker.sh
# provides both). Usage: scripts/bench-docker-run.sh [ROUNDS] (default 40).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${1:-40}"
image="${TUIXIU_TEST_DOCKER_IMAGE:-tuixiu-test/busybox:latest}"
docker info >/dev/null 2>&1 || { echo "no Docker Engine answers: source scripts/ci-setup.d/20-docker.sh" >&2; exit 1; }
docker image inspect "$image" >/dev/null 2>&1 || { echo "image $image missing" >&2; exit 1; }

cargo build --release --quiet
bin="$PWD/target/release/tuixiu-sandbox"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ws" "$work/state"

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)," \
     "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "engine:  Docker $(docker version --format '{{.Server.Version}}') (CLI $(docker version --format '{{.Client.Version}}')), image $image"

python3 - "$rounds" "$bin" "$image" "$work" <<'PY'
import os, statistics, subprocess, sys, time
rounds, binary, image, work = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
env = {"PATH": os.environ["PATH"], "TUIXIU_STATE_DIR": f"{work}/state", "HOME": os.environ.get("HOME", "/root")}
ours = [binary, "run", "--provider", "docker", "--image", image, "--workspace", f"{work}/ws", "--", "true"]
plain = ["docker", "run", "--rm", image, "true"]

def once(argv):
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - start) * 1000

for argv in (ours, plain):  # warm-up: page cache, engine
    once(argv)
a, b = [], []
for i in range(rounds):
    pair = [(ours, a), (plain, b)] if i % 2 == 0 else [(plain, b), (ours, a)]
    for argv, out in pair:
        out.append(once(argv))
ma, mb = statistics.median(a), statistics.median(b)
print(f"rounds:  {rounds} each, alternating")
print(f"tuixiu-sandbox run --provider docker -- true  median {ma:7.1f} ms  (min {min(a):.1f}, max {max(a):.1f})")
print(f"docker run --rm IMAGE true                    median {mb:7.1f} ms  (min {min(b):.1f}, max {max(b):.1f})")
print(f"ratio:   {ma / mb:.3f} (target <= 1.1)")
PY
