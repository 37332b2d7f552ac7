# A real Docker Engine for the docker provider's tests (tests/docker_*.rs),
# and the test image `tuixiu-test/busybox:latest`, built locally (no
# registry is reachable in CI).
#
# Sourced by scripts/test.sh. Installs docker.io and busybox-static when
# missing, starts dockerd in the background when no engine answers (and
# registers a cleanup hook that stops only a daemon started here), then
# imports the image from a rootfs tarball: a static busybox plus its applet
# links. Fails the whole run when no engine can be had: the docker tests must
# never pass by skipping.

docker_test_image="tuixiu-test/busybox:latest"

docker_setup_fail() {
    echo "scripts/ci-setup.d/20-docker.sh: $*" >&2
    return 1
}

docker_need=()
command -v dockerd >/dev/null || docker_need+=(docker.io)
[ -x /bin/busybox ] || docker_need+=(busybox-static)
source "$(dirname "${BASH_SOURCE[0]}")/../ci-apt.sh"
ci_apt_install "${docker_need[@]}"
command -v docker >/dev/null || docker_setup_fail "no docker CLI after installing docker.io"

docker_started_pid=""
stop_test_dockerd() {
    [ -n "$docker_started_pid" ] || return 0
    echo "==> stopping the dockerd started for the tests (pid $docker_started_pid)"
    kill "$docker_started_pid" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do
        kill -0 "$docker_started_pid" 2>/dev/null || break
        sleep 0.1
    done
    docker_started_pid=""
}

if ! docker info >/dev/null 2>&1; then
    echo "no Docker Engine answers: starting dockerd (log: /tmp/tuixiu-ci-dockerd.log)"
    # setsid: the daemon must not get the terminal's signals; its own
    # containerd is started and stopped by dockerd itself.
    setsid dockerd >/tmp/tuixiu-ci-dockerd.log 2>&1 </dev/null &
    docker_started_pid=$!
    cleanup_hooks+=(stop_test_dockerd)
    for _ in $(seq 1 300); do
        docker info >/dev/null 2>&1 && break
        kill -0 "$docker_started_pid" 2>/dev/null || break
        sleep 0.2
    done
    if ! docker info >/dev/null 2>&1; then
        tail -n 20 /tmp/tuixiu-ci-dockerd.log >&2 || true
        docker_setup_fail "dockerd did not come up within 60 s (see /tmp/tuixiu-ci-dockerd.log)"
    fi
fi
echo "Docker Engine $(docker version --format '{{.Server.Version}}' 2>/dev/null)"

if ! docker image inspect "$docker_test_image" >/dev/null 2>&1; then
    echo "building $docker_test_image from /bin/busybox"
    docker_rootfs=$(mktemp -d)
    mkdir -p "$docker_rootfs"/{bin,etc,tmp,workspace,home}
    chmod 1777 "$docker_rootfs/tmp"
    cp /bin/busybox "$docker_rootfs/bin/busybox"
    for applet in $("$docker_rootfs/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -s busybox "$docker_rootfs/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$docker_rootfs/etc/passwd"
    printf 'root:x:0:\n' >"$docker_rootfs/etc/group"
    tar -C "$docker_rootfs" -c . | docker import \
        --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' - "$docker_test_image" >/dev/null
    rm -rf "$docker_rootfs"
fi
docker image inspect "$docker_test_image" >/dev/null 2>&1 ||
    docker_setup_fail "the test image $docker_test_image could not be built"
export TUIXIU_TEST_DOCKER_IMAGE="$docker_test_image"
export TUIXIU_TEST_REQUIRE_DOCKER=1
