# The egress proxy's tests (tests/egress_*.rs) drive real clients through
# it: curl, Python, git (00-base.sh) and Node's fetch. Node before 22.21
# and 24 does not read the proxy variables itself; the tests then use
# undici's EnvHttpProxyAgent (the fetch Node ships is undici), installed
# here at a pinned version, outside the checkout, once.
egress_need=()
command -v curl >/dev/null || egress_need+=(curl)
command -v node >/dev/null || egress_need+=(nodejs)
command -v npm >/dev/null || egress_need+=(npm)
if [ "${#egress_need[@]}" -gt 0 ]; then
    echo "installing ${egress_need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${egress_need[@]}" >/dev/null
fi
undici_version=6.29.1
undici_dir=/opt/tuixiu-ci/undici-$undici_version
if [ ! -f "$undici_dir/node_modules/undici/package.json" ]; then
    echo "installing undici $undici_version into $undici_dir"
    mkdir -p "$undici_dir"
    (cd "$undici_dir" && npm install --silent --no-audit --no-fund --no-save "undici@$undici_version" >/dev/null)
fi
chmod -R a+rX "$undici_dir"
export TUIXIU_TEST_UNDICI_DIR="$undici_dir/node_modules"
