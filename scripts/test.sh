#!/usr/bin/env bash
# Runs the whole test suite: formatting, clippy, unit and integration tests,
# then every fuzz target briefly (FUZZ_SECONDS each, default 15; 0 skips).
#
# The integration tests run the real binary in real namespaces (as root, as
# uid 65534, and nested in `unshare -U -r`), so run this as root. Before the
# tests, every script in scripts/ci-setup.d/ is sourced: each installs and
# starts what its tests need (Debian packages, dockerd, ...) and may add a
# function name to `cleanup_hooks` to stop it afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh: run it as root (the tests switch users and nest namespaces), e.g. sudo $0" >&2
    exit 1
fi

cleanup_hooks=()
run_cleanup() {
    local hook
    for hook in "${cleanup_hooks[@]}"; do "$hook" || true; done
}
trap run_cleanup EXIT

for setup in scripts/ci-setup.d/*.sh; do
    [ -e "$setup" ] || continue
    echo "==> $setup"
    # shellcheck source=/dev/null
    source "$setup"
done

echo "==> lock files up to date (the fuzz workspace has its own)"
(cd fuzz && cargo metadata --locked --format-version 1 >/dev/null)
echo "==> comments cite only docs/ (scripts/check-citations.sh)"
scripts/check-citations.sh
echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> cargo test"
cargo test --workspace --locked "$@"
fuzz_seconds=${FUZZ_SECONDS:-15}
if [ "$fuzz_seconds" != 0 ]; then
    echo "==> fuzz targets, ${fuzz_seconds}s each"
    scripts/fuzz.sh "$fuzz_seconds"
fi
