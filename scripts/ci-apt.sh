# ci_apt_install PKG...: installs the Debian packages named (none: does
# nothing), quietly and without recommends. Sourced by the scripts of
# scripts/ci-setup.d/, which name what they find missing.
ci_apt_install() {
    [ "$#" -gt 0 ] || return 0
    echo "installing $*"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
