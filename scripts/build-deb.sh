#!/usr/bin/env bash
# Builds the Debian package (docs/deploy.md, "Debian package") with
# cargo-deb (scripts/ci-setup.d/50-package.sh installs the pinned version):
#   1. the binaries: `cargo build --release`, or the ones in --binaries DIR;
#   2. what the package ships besides them, made by that full tool under
#      <target>/release/deb/: the man pages (`__man`), the bash, zsh and
#      fish completions (`completions SHELL`), and the systemd unit with
#      /usr/bin instead of /usr/local/bin;
#   3. `cargo deb --no-build` with the assets of Cargo.toml's
#      [package.metadata.deb] ("target/release/" there is <target>/release).
#
#   scripts/build-deb.sh                      # release build; the package in target/debian/
#   scripts/build-deb.sh --binaries DIR --output OUT [--fast]
#       package the three binaries in DIR as they are (tests/deploy_deb.rs
#       packages the ones `cargo test` built: no second build), staged in
#       a target directory of their own
#
# Prints the package's path on the last line.
set -euo pipefail
cd "$(dirname "$0")/.."

binaries=""
output=""
fast=()
while [ $# -gt 0 ]; do
    case "$1" in
        --binaries) binaries=$2; shift 2 ;;
        --output) output=$2; shift 2 ;;
        --fast) fast=(--fast); shift ;;
        *) sed -n '2,18p' "$0" >&2; exit 2 ;;
    esac
done
bins=(tuixiu-sandbox tuixiu-sandbox-full tuixiu-sandbox-proxy)

if [ -n "$binaries" ]; then
    staged=$(mktemp -d "${TMPDIR:-/tmp}/tuixiu-deb-XXXXXX")
    trap 'rm -rf "$staged"' EXIT
    mkdir "$staged/release"
    for bin in "${bins[@]}"; do
        [ -x "$binaries/$bin" ] || { echo "build-deb.sh: $binaries/$bin is missing" >&2; exit 1; }
        cp "$binaries/$bin" "$staged/release/"
    done
    export CARGO_TARGET_DIR="$staged"
    out_dir="$staged/release"
else
    cargo build --locked --release --bins
    target_dir=$(cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    out_dir="$target_dir/release"
fi

extra="$out_dir/deb"
rm -rf "$extra"
mkdir -p "$extra/man" "$extra/completions"
full="$out_dir/tuixiu-sandbox-full"
"$full" __man "$extra/man"
gzip -9n "$extra"/man/*.1
"$full" completions bash >"$extra/completions/tuixiu-sandbox"
"$full" completions zsh >"$extra/completions/_tuixiu-sandbox"
"$full" completions fish >"$extra/completions/tuixiu-sandbox.fish"
sed 's|/usr/local/bin/|/usr/bin/|g' deploy/systemd/tuixiu-sandbox.service >"$extra/tuixiu-sandbox.service"

args=(deb --no-build "${fast[@]}")
if [ -n "$output" ]; then
    mkdir -p "$output"
    args+=(--output "$output")
fi
cargo "${args[@]}" | tail -n 1
