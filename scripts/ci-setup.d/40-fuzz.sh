# The fuzz targets (fuzz/, run briefly by scripts/test.sh through
# scripts/fuzz.sh) need cargo-fuzz, installed from crates.io at the version
# its lock file pins when missing (about a minute on two cores). No nightly
# toolchain: none can be fetched on a clean machine, so scripts/fuzz.sh
# builds with the machine's stable one and RUSTC_BOOTSTRAP=1.
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    if ! timeout 900 cargo install cargo-fuzz --version 0.13.2 --locked; then
        echo "scripts/ci-setup.d/40-fuzz.sh: cargo install cargo-fuzz --version 0.13.2 --locked failed" >&2
        return 1
    fi
fi
echo "$(cargo fuzz --version), $(cargo --version)"
