# What the packaging tests need (tests/deploy_deb.rs, tests/cli_outputs.rs):
# * cargo-deb, pinned, to build the Debian package (scripts/build-deb.sh);
#   installed from crates.io with its lock file when missing (a few
#   minutes on two cores, once per machine);
# * debootstrap, for the fresh Debian 12 root the package is installed in
#   (scripts/deb-test.sh builds it once into /var/cache/tuixiu-ci and
#   keeps it there);
# * man-db, for `man -l` on every generated page.
#
# Sourced by scripts/test.sh.

package_need=()
command -v debootstrap >/dev/null || package_need+=(debootstrap)
command -v man >/dev/null || package_need+=(man-db)
source "$(dirname "${BASH_SOURCE[0]}")/../ci-apt.sh"
ci_apt_install "${package_need[@]}"

cargo_deb_version=3.8.0
if [ "$(cargo deb --version 2>/dev/null | awk '{print $NF}')" != "$cargo_deb_version" ]; then
    echo "installing cargo-deb $cargo_deb_version"
    if ! timeout 1200 cargo install cargo-deb --version "$cargo_deb_version" --locked; then
        echo "scripts/ci-setup.d/50-package.sh: cargo install cargo-deb --version $cargo_deb_version --locked failed" >&2
        return 1
    fi
fi
echo "$(cargo deb --version)"
