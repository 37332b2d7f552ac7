#!/usr/bin/env bash
# Runs sandboxes under real systemd hardening: boots systemd as PID 1 in a
# throwaway container (the machine's own /usr read-only, a minimal /etc),
# with the tuixiu user and the workspace root set up from this directory.
# tests/deploy_systemd.rs uses `boot` to run the unit itself; `survey`
# tries directives one at a time, which is how the unit's list was made.
#
#   deploy/systemd/check-hardening.sh boot NAME BINDIR [DOCKER_ARGS...]
#       start container NAME, the binaries of BINDIR at /opt/tuixiu/bin
#   deploy/systemd/check-hardening.sh boot-image NAME IMAGE [DOCKER_ARGS...]
#       start container NAME from IMAGE (a root with systemd) the same way
#       (scripts/deb-test.sh: a fresh Debian root)
#   deploy/systemd/check-hardening.sh probe NAME [DIRECTIVE...]
#       in NAME, run `tuixiu-sandbox run -- ...` as a oneshot service with
#       only these directives (plus User=tuixiu); prints one line
#   deploy/systemd/check-hardening.sh survey BINDIR
#       boot, probe every directive of tuixiu-sandbox.service alone, then
#       the ones it leaves out, then all of the unit's together; remove
#
# Needs docker and systemd installed on this machine (it is the container's
# /usr). The container is not privileged, but it has every capability but
# CAP_SYS_RESOURCE, no seccomp/AppArmor confinement, an unmasked /proc
# (so that what blocks a fresh /proc in a sandbox is the directive under
# test, not the container) and the cgroup tree writable, as systemd needs;
# systemd-sysctl is masked so nothing is written to the kernel's settings.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
image=tuixiu-test/systemd-host:latest

build_image() {
    docker image inspect "$image" >/dev/null 2>&1 && return 0
    local root
    root=$(mktemp -d)
    mkdir -p "$root"/{var/lib,var/log,var/tmp,run,tmp,root,opt,srv,home,proc,sys,dev,usr}
    mkdir -p "$root"/etc/{systemd/system,sysusers.d,tmpfiles.d,tuixiu-sandbox}
    for link in bin sbin lib lib64; do
        [ -L "/$link" ] && ln -s "$(readlink "/$link")" "$root/$link"
    done
    for f in passwd group shadow gshadow nsswitch.conf ld.so.cache ld.so.conf ld.so.conf.d login.defs; do
        [ -e "/etc/$f" ] && cp -a "/etc/$f" "$root/etc/"
    done
    ln -s ../usr/lib/os-release "$root/etc/os-release"
    : >"$root/etc/machine-id"
    for unit in systemd-sysctl.service systemd-remount-fs.service systemd-timesyncd.service getty@.service \
        systemd-udevd.service systemd-networkd.service systemd-resolved.service; do
        ln -s /dev/null "$root/etc/systemd/system/$unit"
    done
    cp "$here/tuixiu-sandbox.sysusers" "$root/etc/sysusers.d/tuixiu-sandbox.conf"
    cp "$here/tuixiu-sandbox.tmpfiles" "$root/etc/tmpfiles.d/tuixiu-sandbox.conf"
    tar -C "$root" -c . | docker import - "$image" >/dev/null
    rm -rf "$root"
}

boot() {
    local name=$1 bindir=$2
    shift 2
    build_image
    boot_image "$name" "$image" -v /usr:/usr:ro -v "$bindir:/opt/tuixiu/bin:ro" "$@"
    # The user and the workspace root, as the packaged files make them.
    docker exec "$name" sh -c 'systemd-sysusers && systemd-tmpfiles --create' >/dev/null
}

# Container NAME from IMAGE with systemd as PID 1, once it is up.
boot_image() {
    local name=$1 image=$2
    shift 2
    docker rm -f "$name" >/dev/null 2>&1 || true
    docker run -d --name "$name" \
        --cap-add=ALL --cap-drop=SYS_RESOURCE \
        --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
        --security-opt systempaths=unconfined \
        -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
        --tmpfs /run --tmpfs /run/lock --tmpfs /tmp \
        -e container=docker "$@" "$image" /lib/systemd/systemd >/dev/null
    local state=""
    for _ in $(seq 1 100); do
        state=$(docker exec "$name" systemctl is-system-running 2>/dev/null || true)
        case "$state" in running | degraded) break ;; esac
        sleep 0.2
    done
    case "$state" in
        running | degraded) ;;
        *)
            docker logs "$name" 2>&1 | tail -n 20 >&2
            echo "check-hardening.sh: systemd did not come up in $name ($state)" >&2
            return 1
            ;;
    esac
    # systemd leaves / private inside a container; LoadCredential='s files,
    # written on a ramfs in a child mount namespace, reach the service only
    # through a shared / (as on a host, where systemd makes it shared).
    docker exec "$name" mount --make-rshared /
}

probe() {
    local name=$1
    shift
    local unit
    unit=$(printf '[Service]\nType=oneshot\nUser=tuixiu\nGroup=tuixiu\n')
    unit+=$'\nReadWritePaths=/srv/tuixiu/workspaces'
    unit+=$'\nExecStart=/opt/tuixiu/bin/tuixiu-sandbox run --workspace /srv/tuixiu/workspaces -- /bin/sh -c '
    unit+="'id -un; echo pid1=\$(cat /proc/1/comm)'"
    local d
    for d in "$@"; do unit+=$'\n'"$d"; done
    docker exec -i "$name" sh -c 'cat >/etc/systemd/system/probe.service && systemctl daemon-reload && systemctl reset-failed probe.service 2>/dev/null; true' <<<"$unit"
    local since rc=0
    since=$(docker exec "$name" date +%s.%N)
    docker exec "$name" systemctl start probe.service >/dev/null 2>&1 || rc=$?
    local out
    out=$(docker exec "$name" journalctl -u probe.service --since "@$since" -o cat --no-pager |
        grep -v '^Starting \|^Finished \|^probe.service: \|Deactivated\|^Failed to start\|Consumed' | tr '\n' '|' || true)
    # A fresh /proc: PID 1 in /proc is the sandbox's own.
    local verdict=broken
    if [ "$rc" = 0 ]; then
        case "$out" in *pid1=tuixiu-sandbox*) verdict="works (fresh /proc)" ;; *) verdict="works (/proc bound)" ;; esac
    fi
    printf '%-70s %s :: %s\n' "${*:-(none)}" "$verdict" "${out:0:200}"
}

survey() {
    local bindir=$1 name=tuixiu-check-hardening
    boot "$name" "$bindir"
    trap 'docker rm -f '"$name"' >/dev/null 2>&1' EXIT
    local unit="$here/tuixiu-sandbox.service" kept=() d
    mapfile -t kept < <(sed -n '/^# --- Hardening that leaves/,/^# --- Left out/p' "$unit" | grep -v '^#' | grep .)
    probe "$name"
    for d in "${kept[@]}"; do probe "$name" "$d"; done
    for d in ProtectHostname=yes RestrictSUIDSGID=yes DynamicUser=yes RestrictNamespaces=yes \
        SystemCallFilter=@system-service MemoryDenyWriteExecute=yes ProcSubset=pid PrivateNetwork=yes; do
        probe "$name" "$d"
    done
    probe "$name" "${kept[@]}"
}

case "${1:-}" in
    boot) shift; boot "$@" ;;
    boot-image) shift; boot_image "$@" ;;
    probe) shift; probe "$@" ;;
    survey) shift; survey "$@" ;;
    *) sed -n '2,25p' "$0"; exit 2 ;;
esac
