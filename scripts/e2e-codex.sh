#!/usr/bin/env bash
# End to end with the real codex-acp (npm @zed-industries/codex-acp), not in
# CI: a turn in codex's default mode (workspace-write, approvals on request)
# whose shell command and apply_patch run through codex's own bwrap, inside
# `tuixiu-sandbox run --manifest m.json -- codex-acp`, with our default
# seccomp profile and Landlock on. The model is a loopback stand-in of the
# OpenAI Responses API (scripts/e2e-codex.py).
#
#   scripts/e2e-codex.sh                      # as the current user
#   CODEX_ACP_VERSION=0.16.0 AS_USER=nobody scripts/e2e-codex.sh
set -euo pipefail
cd "$(dirname "$0")/.."
version=${CODEX_ACP_VERSION:-0.16.0}
cache=${CODEX_ACP_CACHE:-$HOME/.cache/tuixiu-e2e/codex-acp-$version}
if [ ! -x "$cache/node_modules/@zed-industries/codex-acp-linux-x64/bin/codex-acp" ]; then
    mkdir -p "$cache"
    (cd "$cache" && npm install --no-audit --no-fund "@zed-industries/codex-acp@$version" >/dev/null)
fi
codex_bin="$cache/node_modules/@zed-industries/codex-acp-linux-x64/bin"

cargo build --release --quiet
work=$(mktemp -d /tmp/tuixiu-e2e-codex-XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
mkdir -p "$work/bin" "$work/codex" "$work/workspace" "$work/home"
cp target/release/tuixiu-sandbox target/release/tuixiu-sandbox-full "$work/bin/"
cp "$codex_bin/codex-acp" "$work/codex/"
git -C "$work/workspace" init -q && echo "# demo" > "$work/workspace/README.md"
port=${FAKE_OPENAI_PORT:-18765}
mkdir -p "$work/home/.codex"
cat > "$work/home/.codex/config.toml" <<TOML
model = "gpt-5.3-codex"
model_provider = "standin"
approval_policy = "on-request"
sandbox_mode = "workspace-write"

[model_providers.standin]
name = "stand-in"
base_url = "http://127.0.0.1:$port/v1"
env_key = "STANDIN_API_KEY"
wire_api = "responses"
supports_websockets = false
TOML
cat > "$work/m.json" <<JSON
{"agentInputs": {"version": 1, "items": [
  {"id": "workspace", "apply": "bindMount", "access": "rw",
   "source": {"type": "hostPath", "path": "$work/workspace"},
   "target": {"root": "WORKSPACE", "path": "."}}]}}
JSON
wrap=()
if [ -n "${AS_USER:-}" ]; then
    chown -R "$AS_USER" "$work/workspace" "$work/home"
    chmod 777 "$work"
    wrap=(setpriv --reuid "$(id -u "$AS_USER")" --regid "$(id -g "$AS_USER")" --clear-groups)
fi
status=0
"${wrap[@]}" /usr/bin/python3 scripts/e2e-codex.py "$work" -- "$work/bin/tuixiu-sandbox" run -v \
    --manifest "$work/m.json" --allow-host-path "$work" --home "$work/home" \
    --ro-bind "$work/codex" /codex \
    --env STANDIN_API_KEY=stand-in --env-allow STANDIN_API_KEY \
    --env CODEX_API_KEY=stand-in --env-allow CODEX_API_KEY \
    --env CODEX_HOME=/home/agent/.codex --env-allow CODEX_HOME \
    --env PATH=/codex:/usr/local/bin:/usr/bin:/bin --env-allow PATH \
    --env RUST_LOG=warn --env-allow RUST_LOG \
    -- codex-acp || status=$?
echo "--- codex-acp stderr (tail)"; tail -n 30 "$work/agent.stderr"
exit $status
