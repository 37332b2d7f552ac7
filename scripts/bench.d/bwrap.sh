#!/usr/bin/env bash
# bench: our launcher called as `bwrap` on codex's and Flatpak's command lines (anchor: reference bubblewrap, target <= 0.8x)
# bwrap on the host (docs/benchmarks.md, "bwrap on the host"): codex's and
# Flatpak's typical command lines (COMMAND is /usr/bin/true) through our
# launcher called as `bwrap` and through a reference bubblewrap, alternating in
# one run (scripts/bench.d/abbench.py, which execs each directly: no shell in the
# measurement): start-to-exit wall time, median, ratio. Then the CPU time of
# each (perf stat), which a loaded machine disturbs less.
#
#   BWRAP_REF=/path/to/bubblewrap-0.11.1/bwrap scripts/bench bwrap
#   RUNS=300 AS_USER=nobody BWRAP_REF=... scripts/bench bwrap
#
# BWRAP_REF defaults to the host's bwrap (Debian 12: 0.8.0); the figures in
# docs/benchmarks.md are against 0.11.1 built from source with meson
# (-Dbuildtype=release). Target: ours <= 0.8x.
source "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-200}
ref=${BWRAP_REF:-$(command -v bwrap || true)}
[ -x "$ref" ] || { echo "bench bwrap: no reference bwrap (BWRAP_REF=...)" >&2; exit 1; }
bench_build --bin tuixiu-sandbox
dir=$(bench_scratch)
mkdir "$dir/ours" "$dir/ref" "$dir/cwd"
cp "$REL/tuixiu-sandbox" "$dir/ours/bwrap"
cp "$ref" "$dir/ref/bwrap"
printf 'user:x:1000:1000::/home/user:/bin/sh\n' >"$dir/passwd"
printf 'user:x:1000:\n' >"$dir/group"
touch "$dir/.ref"
chmod -R a+rX "$dir"
chmod 777 "$dir/cwd"

# codex-linux-sandbox's: read-only root, a writable working directory, no network.
codex=(--new-session --die-with-parent --ro-bind / / --dev /dev --bind "$dir/cwd" "$dir/cwd"
    --unshare-user --unshare-pid --unshare-net --proc /proc -- /usr/bin/true)
# Flatpak's shape: a composed /usr view, generated passwd/group, the lock on
# the runtime's .ref, the info descriptor (stdout: /dev/null), a new session.
flatpak=(--unshare-ipc --unshare-pid --unshare-net --unshare-user --unshare-uts --unshare-cgroup-try
    --die-with-parent --new-session --proc /proc --dev /dev --tmpfs /tmp --dir /run/user/1000 --dir /var/tmp
    --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64
    --symlink usr/sbin /sbin --ro-bind /etc/ssl /etc/ssl --ro-bind-try /etc/resolv.conf /etc/resolv.conf
    --ro-bind "$dir/passwd" /etc/passwd --ro-bind "$dir/group" /etc/group --perms 0700 --dir /home/user
    --setenv HOME /home/user --setenv XDG_RUNTIME_DIR /run/user/1000 --chdir /home/user
    --ro-bind "$dir/.ref" /.ref --lock-file /.ref --info-fd 1 -- /usr/bin/true)

as_user=()
perf_as=()
if [ -n "${AS_USER:-}" ]; then
    as_user=(--as-user "$AS_USER")
    perf_as=(setpriv --reuid "$(id -u "$AS_USER")" --regid "$(id -g "$AS_USER")" --clear-groups)
fi
echo "reference: $("$ref" --version)"
for line in codex flatpak; do
    declare -n args=$line
    echo "== $line"
    python3 scripts/bench.d/abbench.py -n "$RUNS" "${as_user[@]}" \
        --name "ours-$line" -- "$dir/ours/bwrap" "${args[@]}" \
        --name "bwrap-$line" -- "$dir/ref/bwrap" "${args[@]}"
    if command -v perf >/dev/null; then
        for who in ours ref; do
            printf '%s-%s CPU: ' "$who" "$line"
            "${perf_as[@]}" perf stat -x, -r 50 -e task-clock "$dir/$who/bwrap" "${args[@]}" 2>&1 >/dev/null \
                | awk -F, '/task-clock/ {printf "%.3f ms task-clock\n", $1}'
        done
    fi
done
