#!/usr/bin/env bash
# bench: startup of the docker provider (anchor: plain `docker run --rm`, target <= 1.1x)
# Startup overhead of the docker provider: `tuixiu-sandbox run --provider
# docker --image IMG -- true` against a plain `docker run --rm IMG true`,
# measured side by side (alternating) in one run by scripts/bench.d/abbench.py.
# Target: our median at most 1.1x the plain `docker run`'s.
#
#   scripts/bench docker-run          # 40 runs each
#   RUNS=100 scripts/bench docker-run
#
# Needs a running Docker Engine and the test image (scripts/ci-setup.d/20-docker.sh
# provides both; TUIXIU_TEST_DOCKER_IMAGE picks another image).
source "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-40}
image=${TUIXIU_TEST_DOCKER_IMAGE:-tuixiu-test/busybox:latest}

docker info >/dev/null 2>&1 || { echo "bench docker-run: no Docker Engine answers (source scripts/ci-setup.d/20-docker.sh)" >&2; exit 1; }
docker image inspect "$image" >/dev/null 2>&1 || { echo "bench docker-run: image $image is missing" >&2; exit 1; }
bench_build
work=$(bench_scratch)
mkdir -p "$work/workspace" "$work/state"

echo "tuixiu-sandbox $("$REL/tuixiu-sandbox" --version | cut -d' ' -f2)," \
    "Docker Engine $(docker version --format '{{.Server.Version}}') (CLI $(docker version --format '{{.Client.Version}}')), image $image"
python3 scripts/bench.d/abbench.py -n "$RUNS" --warmup 3 \
    --name tuixiu-sandbox -- env TUIXIU_STATE_DIR="$work/state" "$REL/tuixiu-sandbox" run \
        --provider docker --image "$image" --workspace "$work/workspace" -- true \
    --name "docker run --rm" -- docker run --rm "$image" true
