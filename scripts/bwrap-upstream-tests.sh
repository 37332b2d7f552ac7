#!/usr/bin/env bash
# bubblewrap's own test scripts (tests/test-run.sh, test-seccomp.py,
# test-specifying-userns.sh, test-specifying-pidns.sh), run first against
# bubblewrap itself, built from the given source, then against our launcher
# called as `bwrap` (their BWRAP variable), as root, as uid 65534 and nested
# in `unshare -U -r`. Ours must pass wherever bubblewrap passes, with the
# same `ok`/`# SKIP` lines.
#
#   scripts/bwrap-upstream-tests.sh [SOURCE]
#   MODE=inside scripts/bwrap-upstream-tests.sh [SOURCE]
#
# MODE=inside runs the same scripts INSIDE `tuixiu-sandbox run` instead
# (as root and as uid 65534; the sandbox user is its default, uid 1000),
# with BWRAP=bwrap, the sandbox's own (served by the nested-sandbox
# portal), and compares their `ok` lines with bubblewrap's on the host as
# the same caller. Differences the outer sandbox's policy makes by design
# are listed in docs/bwrap.md ("bubblewrap's own tests inside"); they are
# reported, not failed. A script that hangs (600 s) always fails.
# Inside, test-run.sh also runs a second time as "test-run.sh/by-design"
# with the cases that cannot pass there by design (listed in docs/bwrap.md)
# turned into `# SKIP` lines, so that every case after them is run too.
# MODE=both does both.
#
# SOURCE is a bubblewrap v0.11.1 source tree or git directory (default:
# $BWRAP_SRC, else the local mirror /work/.mirror/containers+bubblewrap/repo).
# The source is not fetched: without one the script says so and exits 2.
# Needs meson, ninja-build, gcc, pkg-config, libcap-dev and python3-seccomp
# (scripts/ci-setup.d/45-bwrap-tests.sh installs the last; the build tools
# with INSTALL_BUILD_DEPS=1). USERS="root nobody nested" picks the callers;
# TUIXIU_BWRAP=path tests that launcher instead of building the debug one.
# Results of the last run on the development machine: docs/bwrap.md.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-${BWRAP_SRC:-/work/.mirror/containers+bubblewrap/repo}}
mode=${MODE:-host}
case $mode in host | inside | both) ;; *) echo "bwrap-upstream-tests: MODE is host, inside or both" >&2; exit 1 ;; esac
users=${USERS:-root nobody nested}
[ "$mode" = inside ] && users=${USERS:-root nobody}

if [ ! -e "$src" ]; then
    echo "bwrap-upstream-tests: no bubblewrap source at $src (give a v0.11.1 tree or git dir)" >&2
    exit 2
fi
if [ "$(id -u)" != 0 ]; then
    echo "bwrap-upstream-tests: run as root (the callers are switched from root)" >&2
    exit 1
fi
if [ "${INSTALL_BUILD_DEPS:-}" = 1 ]; then
    apt-get install -y -qq --no-install-recommends meson ninja-build gcc pkg-config libcap-dev >/dev/null
fi
for tool in meson ninja gcc; do
    command -v "$tool" >/dev/null || { echo "bwrap-upstream-tests: $tool is missing (INSTALL_BUILD_DEPS=1)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/bwrap-upstream-XXXXXX)
# test-run.sh leaves a mktemp file in /tmp per run ("bind-mount of / exposes
# real /tmp"): those made during this run go with the work directory.
trap 'find /tmp -maxdepth 1 -name "bwrap-test-*" -type f -newer "$work" -delete; rm -rf "$work"' EXIT
chmod 755 "$work"
if [ -d "$src/tests" ]; then
    cp -a "$src/." "$work/src"
else
    mkdir "$work/src"
    git -C "$src" archive "${BWRAP_REF:-v0.11.1}" | tar -x -C "$work/src"
fi
echo "==> building bubblewrap ${BWRAP_REF:-v0.11.1} from $src"
meson setup "$work/build" "$work/src" -Dselinux=disabled -Dman=disabled \
    -Dbash_completion=disabled -Dzsh_completion=disabled >"$work/meson.log" 2>&1 \
    || { cat "$work/meson.log"; exit 1; }
ninja -C "$work/build" >"$work/ninja.log" 2>&1 || { cat "$work/ninja.log"; exit 1; }

ours=${TUIXIU_BWRAP:-}
if [ -z "$ours" ]; then
    cargo build --quiet --bin tuixiu-sandbox
    ours=$PWD/target/debug/tuixiu-sandbox
fi
mkdir "$work/ours"
cp "$ours" "$work/ours/bwrap"
cp "$ours" "$work/ours/tuixiu-sandbox"
chmod -R a+rX "$work"

# One caller's run of the four scripts against one binary; one line each.
run_scripts() {
    local bwrap=$1 log=$2
    cat >"$work/run.sh" <<EOF
#!/bin/bash
cd "$work/src"
export BWRAP=$bwrap G_TEST_BUILDDIR=$work/build G_TEST_SRCDIR=$work/src PATH=/usr/bin:/usr/sbin:/bin:/sbin
for t in test-run.sh test-specifying-pidns.sh test-specifying-userns.sh; do
    timeout 600 bash tests/\$t >"$log-\$t.log" 2>&1; echo "\$t \$?"
done
timeout 600 python3 tests/test-seccomp.py >"$log-test-seccomp.py.log" 2>&1; echo "test-seccomp.py \$?"
EOF
    chmod 755 "$work/run.sh"
    chmod 777 "$work"
    case $3 in
        root) "$work/run.sh" ;;
        nobody) setpriv --reuid 65534 --regid 65534 --clear-groups "$work/run.sh" ;;
        nested) setpriv --reuid 65534 --regid 65534 --clear-groups unshare -U -r "$work/run.sh" ;;
    esac
}

# One caller's run of the four scripts inside `tuixiu-sandbox run`, with
# the sandbox's bwrap; one line each.
run_inside() {
    local log=$1 who=$2 t pre=()
    # test-run.sh with the recursion cases (/proc/self/exe as a nested
    # sandbox's bwrap) skipped: docs/bwrap.md says why they cannot pass.
    if [ ! -e "$work/src/tests/test-run-by-design.sh" ]; then
        python3 - "$work/src/tests" <<'PY'
import re, sys
tests = sys.argv[1]
text = open(f"{tests}/test-run.sh").read()
case = re.compile(r'    \$BWRAP_RECURSE -- /proc/self/exe .*?\n(    assert_.*?\n)*    ok "(.*?)"\n')
patched, n = case.subn(lambda m: f'    ok_skip "by design inside tuixiu-sandbox: {m.group(2)}"\n', text)
if n != 2:
    sys.exit(f"bwrap-upstream-tests: expected the 2 recursion cases in test-run.sh, found {n}")
open(f"{tests}/test-run-by-design.sh", "w").write(patched)
PY
    fi
    cat >"$work/in.sh" <<EOF
#!/bin/bash
cd "$work/src"
export BWRAP=bwrap G_TEST_BUILDDIR=$work/build G_TEST_SRCDIR=$work/src PATH=/run/tuixiu/bin:/usr/bin:/usr/sbin:/bin:/sbin
case \$1 in
    *.py) exec python3 tests/\$1 ;;
    test-run.sh/by-design) exec bash tests/test-run-by-design.sh ;;
    *) exec bash tests/\$1 ;;
esac
EOF
    chmod 755 "$work/in.sh"
    mkdir -p "$work/ws-$who"
    case $who in
        root) ;;
        nobody) pre=(setpriv --reuid 65534 --regid 65534 --clear-groups); chown 65534:65534 "$work/ws-$who" ;;
        *) echo "bwrap-upstream-tests: MODE=inside runs as root or nobody, not $who" >&2; return 1 ;;
    esac
    # test-run.sh binds over /mnt when it exists, as on the host.
    local view=(--ro-bind "$work" "$work" --tmpfs /var/tmp)
    [ -d /mnt ] && [ ! -L /mnt ] && view+=(--ro-bind /mnt /mnt)
    for t in test-run.sh test-run.sh/by-design test-specifying-pidns.sh test-specifying-userns.sh test-seccomp.py; do
        local rc=0
        timeout 600 "${pre[@]}" "$work/ours/tuixiu-sandbox" run --workspace "$work/ws-$who" \
            "${view[@]}" -- "$work/in.sh" "$t" >"$log-${t/\//-}.log" 2>&1 || rc=$?
        echo "$t $rc"
    done
}

failed=0
if [ "$mode" != host ]; then
    printf '%-8s %-26s %-22s %-22s\n' caller script "bubblewrap, host" "ours, inside"
    for who in $users; do
        run_scripts "$work/build/bwrap" "$work/real-$who" "$who" >"$work/real-$who.rc"
        run_inside "$work/inside-$who" "$who" >"$work/inside-$who.rc"
        while read -r script rc; do
            inside=$script
            [ "$script" = test-run.sh ] && inside="$script $script/by-design"
            for t in $inside; do
                in_rc=$(awk -v s="$t" '$1 == s {print $2}' "$work/inside-$who.rc")
                real_log=$work/real-$who-$script.log in_log=$work/inside-$who-${t/\//-}.log
                summary() { echo "rc=$2 $(grep -cE '^ok' "$1")/$(grep -cE '^ok.*# ?SKIP|^1\.\.0 # SKIP' "$1")"; }
                printf '%-8s %-26s %-22s %-22s\n' "$who" "$t" "$(summary "$real_log" "$rc")" \
                    "$(summary "$in_log" "$in_rc")"
                if [ "$in_rc" = 124 ]; then
                    echo "   ours HUNG (600 s)"
                    failed=1
                fi
                diff <(grep -E '^(ok|not ok)' "$real_log") <(grep -E '^(ok|not ok)' "$in_log") \
                    | grep '^[<>]' | sed 's/^/   /' || true
                if [ "$in_rc" != 0 ]; then
                    echo "   where ours stopped:"
                    grep -vE '^(\+|#|/proc/self/ns/)' "$in_log" | tail -4 | sed 's/^/   | /'
                fi
            done
        done <"$work/real-$who.rc"
    done
    [ "$mode" = inside ] && exit $failed
    users=${USERS:-root nobody nested}
fi
printf '%-8s %-26s %-22s %-22s\n' caller script "bubblewrap (ok/skip)" "ours (ok/skip)"
for who in $users; do
    run_scripts "$work/build/bwrap" "$work/real-$who" "$who" >"$work/real-$who.rc"
    run_scripts "$work/ours/bwrap" "$work/ours-$who" "$who" >"$work/ours-$who.rc"
    while read -r script rc; do
        ours_rc=$(awk -v s="$script" '$1 == s {print $2}' "$work/ours-$who.rc")
        summary() {
            local log=$1-$script.log
            echo "rc=$2 $(grep -cE '^ok' "$log")/$(grep -cE '^ok.*# ?SKIP|^1\.\.0 # SKIP' "$log")"
        }
        real_sum=$(summary "$work/real-$who" "$rc")
        ours_sum=$(summary "$work/ours-$who" "$ours_rc")
        printf '%-8s %-26s %-22s %-22s\n' "$who" "$script" "$real_sum" "$ours_sum"
        if [ "$rc" = 0 ] && { [ "$ours_rc" != 0 ] || ! diff -q \
            <(grep -E '^(ok|not ok)' "$work/real-$who-$script.log") \
            <(grep -E '^(ok|not ok)' "$work/ours-$who-$script.log") >/dev/null; }; then
            echo "   ours differs; the end of its log:"
            tail -15 "$work/ours-$who-$script.log" | sed 's/^/   | /'
            failed=1
        fi
    done <"$work/real-$who.rc"
done
exit $failed
