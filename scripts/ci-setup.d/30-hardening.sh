# The hardening tests (tests/hardening.rs) run python3 *inside* sandboxes,
# where only the system view exists: they need Debian's /usr/bin/python3
# (not a pyenv shim under /root) with venv/ensurepip, and git.
need=()
[ -x /usr/bin/python3 ] || need+=(python3)
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
[ -x /usr/bin/git ] || [ -x /usr/local/bin/git ] || need+=(git)
if [ "${#need[@]}" -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
