#!/usr/bin/env bash
# The Debian package in a fresh Debian 12: a minimal bookworm root made by
# debootstrap from Debian's mirror (systemd, bubblewrap, procps), booted
# with systemd as PID 1 in a container by deploy/systemd/check-hardening.sh
# (`boot-image`). tests/deploy_deb.rs drives it: install, start, a run's
# processes, remove.
#
#   scripts/deb-test.sh image
#       make the root once (/var/cache/tuixiu-ci/debian12-root.tar, about
#       a minute and 40 MB from the mirror on a new machine) and import it
#       as a docker image (tuixiu-test/debian12-systemd:<root's hash>); both
#       kept for later runs
#   scripts/deb-test.sh boot NAME [DOCKER_ARGS...]
#       start container NAME from that image, wait for systemd; prints the
#       image's name
#   scripts/deb-test.sh smoke DEB
#       the whole check without a backend: install, start (the daemon
#       retries its backend), remove, nothing left running
#
# TUIXIU_DEBIAN_MIRROR names another mirror (default: debootstrap's own).
set -euo pipefail

cache=${TUIXIU_CI_CACHE:-/var/cache/tuixiu-ci}
tarball="$cache/debian12-root.tar"
mirror=${TUIXIU_DEBIAN_MIRROR:-}
# What the root has besides minbase: systemd to boot, bubblewrap to check
# that its /usr/bin/bwrap is left alone, procps for the process checks.
include=systemd,systemd-sysv,dbus,bubblewrap,procps

make_root() {
    [ -s "$tarball" ] && return 0
    mkdir -p "$cache"
    local root
    root=$(mktemp -d "$cache/root.XXXXXX")
    echo "deb-test.sh: debootstrap bookworm into $root" >&2
    # shellcheck disable=SC2086 # no mirror: debootstrap's default
    if ! debootstrap --variant=minbase --include="$include" bookworm "$root" $mirror >"$cache/debootstrap.log" 2>&1; then
        tail -n 20 "$cache/debootstrap.log" >&2
        rm -rf "$root"
        echo "deb-test.sh: debootstrap failed (log: $cache/debootstrap.log)" >&2
        return 1
    fi
    # A container's systemd: no getty, no udev, no kernel settings written;
    # an empty machine-id for systemd to fill at boot.
    local unit
    for unit in systemd-sysctl.service systemd-remount-fs.service systemd-timesyncd.service getty@.service \
        systemd-udevd.service systemd-networkd.service systemd-resolved.service console-getty.service \
        systemd-logind.service; do
        ln -sf /dev/null "$root/etc/systemd/system/$unit"
    done
    : >"$root/etc/machine-id"
    # The .debs debootstrap fetched stay in /var/cache/apt/archives (a
    # test reinstalls bubblewrap from there, offline).
    tar -C "$root" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
}

image_name() {
    echo "tuixiu-test/debian12-systemd:$(sha256sum "$tarball" | cut -c1-12)"
}

make_image() {
    make_root
    local image
    image=$(image_name)
    docker image inspect "$image" >/dev/null 2>&1 || docker import - "$image" <"$tarball" >/dev/null
    echo "$image"
}

boot() {
    local name=$1
    shift
    local image
    image=$(make_image)
    "$(dirname "$0")/../deploy/systemd/check-hardening.sh" boot-image "$name" "$image" "$@"
    echo "$image"
}

smoke() {
    local deb=$1 name="tuixiu-deb-smoke-$$"
    boot "$name" --network=none >/dev/null
    trap 'docker rm -f '"$name"' >/dev/null 2>&1' EXIT
    docker cp "$deb" "$name:/var/tmp/tuixiu-sandbox.deb"
    docker exec "$name" dpkg -i /var/tmp/tuixiu-sandbox.deb
    docker exec "$name" sh -c 'mkdir -p /etc/tuixiu-sandbox &&
        printf "orchestrator_url = \"ws://127.0.0.1:9/ws/agent\"\n[sandbox]\nworkspaceHostRoot = \"/srv/tuixiu/workspaces\"\n" >/etc/tuixiu-sandbox/proxy.toml &&
        echo token >/etc/tuixiu-sandbox/auth_token && chmod 600 /etc/tuixiu-sandbox/auth_token'
    docker exec "$name" systemctl start tuixiu-sandbox
    docker exec "$name" systemctl is-active tuixiu-sandbox
    docker exec "$name" apt-get remove -y -q tuixiu-sandbox
    if docker exec "$name" pgrep -a -u tuixiu; then
        echo "deb-test.sh: processes left after apt remove" >&2
        return 1
    fi
    echo "deb-test.sh: installed, started, removed; nothing left running"
}

case "${1:-}" in
    image) make_image ;;
    boot) shift; boot "$@" ;;
    smoke) shift; smoke "$@" ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
esac
