# Base tools the integration tests call: setpriv/unshare (util-linux),
# python3 and node for user-view checks, iproute2 for `ip`, git.
need=()
command -v setpriv >/dev/null || need+=(util-linux)
command -v unshare >/dev/null || need+=(util-linux)
command -v python3 >/dev/null || need+=(python3)
command -v ip >/dev/null || need+=(iproute2)
command -v git >/dev/null || need+=(git)
if [ "${#need[@]}" -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
