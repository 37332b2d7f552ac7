# The egress proxy's tests (tests/egress_run.rs, proxy_egress.rs,
# proxy_codex_egress.rs, skills_egress.rs) drive real clients through it:
# curl, Python, git (00-base.sh), Node's fetch and codex-acp. Node before
# 22.21 and 24 does not read the proxy variables itself; the tests then use
# undici's EnvHttpProxyAgent (the fetch Node ships is undici). undici and
# codex-acp are installed here at pinned versions, outside the checkout,
# once.
egress_need=()
command -v curl >/dev/null || egress_need+=(curl)
command -v node >/dev/null || egress_need+=(nodejs)
command -v npm >/dev/null || egress_need+=(npm)
source "$(dirname "${BASH_SOURCE[0]}")/../ci-apt.sh"
ci_apt_install "${egress_need[@]}"
undici_version=6.29.1
undici_dir=/opt/tuixiu-ci/undici-$undici_version
if [ ! -f "$undici_dir/node_modules/undici/package.json" ]; then
    echo "installing undici $undici_version into $undici_dir"
    mkdir -p "$undici_dir"
    (cd "$undici_dir" && npm install --silent --no-audit --no-fund --no-save "undici@$undici_version" >/dev/null)
fi
chmod -R a+rX "$undici_dir"
export TUIXIU_TEST_UNDICI_DIR="$undici_dir/node_modules"
codex_acp_version=0.16.0
codex_acp_dir=/opt/tuixiu-ci/codex-acp-$codex_acp_version
codex_acp_bin=$codex_acp_dir/node_modules/@zed-industries/codex-acp-linux-x64/bin
if [ "$(uname -m)" = x86_64 ] && [ ! -x "$codex_acp_bin/codex-acp" ]; then
    echo "installing @zed-industries/codex-acp $codex_acp_version into $codex_acp_dir"
    mkdir -p "$codex_acp_dir"
    (cd "$codex_acp_dir" && npm install --silent --no-audit --no-fund --no-save "@zed-industries/codex-acp@$codex_acp_version" >/dev/null)
fi
[ -d "$codex_acp_dir" ] && chmod -R a+rX "$codex_acp_dir"
export TUIXIU_TEST_CODEX_ACP_DIR="$codex_acp_bin"
