# The fuzz targets (fuzz/, run briefly by scripts/test.sh through
# scripts/fuzz.sh) need the nightly toolchain and cargo-fuzz. cargo-fuzz is
# installed from crates.io at the version its lock file pins when missing
# (about a minute on two cores); a missing nightly toolchain is installed
# with rustup's minimal profile.
fuzz_setup_fail() {
    echo "scripts/ci-setup.d/40-fuzz.sh: $*" >&2
    return 1
}

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "installing the nightly toolchain"
    timeout 600 rustup toolchain install nightly --profile minimal ||
        fuzz_setup_fail "the nightly toolchain could not be installed (rustup toolchain install nightly)"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    timeout 900 cargo install cargo-fuzz --version 0.13.2 --locked ||
        fuzz_setup_fail "cargo install cargo-fuzz failed"
fi
echo "$(cargo fuzz --version), $(cargo +nightly --version)"
