#!/usr/bin/env bash
# Runs the whole test suite: formatting, clippy, unit and integration tests,
# then every fuzz target briefly (FUZZ_SECONDS each, default 15; 0 skips).
#
# `scripts/test.sh --quick` is the everyday tier instead (docs/testing.md):
# the unit tests and the integration test binaries that need no root, no
# Docker Engine and nothing scripts/ci-setup.d/ installs; any user, about a
# minute once built. Arguments after --quick go to cargo test.
#
# The integration tests run the real binary in real namespaces (as root, as
# uid 65534, and nested in `unshare -U -r`), so run this as root. Before the
# tests, every script in scripts/ci-setup.d/ is sourced: each installs and
# starts what its tests need (Debian packages, dockerd, ...) and may add a
# function name to `cleanup_hooks` to stop it afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

# The integration test binaries of the quick tier: each passes as an
# ordinary user on a machine with only a Rust toolchain and git (checked
# by running every binary as uid 65534 without the ci-setup.d scripts; see
# docs/testing.md). Selected by binary, not skipped at run time.
quick_tests=(launch zip_extract proxy_link proxy_ops metrics)

layering() {
    echo "==> no import cycles between modules or files (scripts/filecycles.py)"
    python3 scripts/filecycles.py src
    python3 scripts/filecycles.py sandbox/src
}

if [ "${1:-}" = --quick ]; then
    shift
    layering
    # The fake agent (an example) is built by `cargo test` only when no
    # test target is named; `metrics` runs it.
    cargo build --workspace --locked --example fake_agent
    echo "==> cargo test: unit tests of every crate (the main binary is #![no_main]: none) and the root-free integration tests (${quick_tests[*]})"
    exec cargo test --workspace --locked --lib --bin=tuixiu-sandbox-full "${quick_tests[@]/#/--test=}" "$@"
fi

if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh: run it as root (the tests switch users and nest namespaces), e.g. sudo $0; $0 --quick runs the root-free tier" >&2
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
layering
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
