# Anthropic's sandbox runtime (npm @anthropic-ai/sandbox-runtime, the `srt`
# CLI Claude Code's sandbox uses) for tests/nested.rs, which runs it in its
# default settings inside `tuixiu-sandbox run`: it wraps every command in
# bwrap (ours, nested) and runs its helper `apply-seccomp` there, which
# makes its own user, mount and pid namespaces (docs/security.md, "Nested
# sandboxes"). It needs socat and ripgrep on the host. Installed at a pinned
# version, outside the checkout, once. Should the npm registry be
# unreachable, the marker file says so and that test skips saying why;
# any other failure fails the setup.
#
# Sourced by scripts/test.sh.

srt_need=()
command -v socat >/dev/null || srt_need+=(socat)
command -v rg >/dev/null || srt_need+=(ripgrep)
command -v npm >/dev/null || srt_need+=(npm)
source "$(dirname "${BASH_SOURCE[0]}")/../ci-apt.sh"
ci_apt_install "${srt_need[@]}"
srt_version=0.0.83
srt_dir=/opt/tuixiu-ci/sandbox-runtime-$srt_version
if [ ! -x "$srt_dir/node_modules/.bin/srt" ]; then
    echo "installing @anthropic-ai/sandbox-runtime $srt_version into $srt_dir"
    mkdir -p "$srt_dir"
    rm -f "$srt_dir/npm-unreachable"
    if ! (cd "$srt_dir" && npm install --silent --no-audit --no-fund --no-save \
        "@anthropic-ai/sandbox-runtime@$srt_version" >/dev/null); then
        if npm ping >/dev/null 2>&1; then
            echo "scripts/ci-setup.d/47-sandbox-runtime.sh: npm install of @anthropic-ai/sandbox-runtime $srt_version failed" >&2
            return 1
        fi
        echo "the npm registry is unreachable ($(date -u +%FT%TZ))" >"$srt_dir/npm-unreachable"
        echo "scripts/ci-setup.d/47-sandbox-runtime.sh: npm registry unreachable; the srt test will skip" >&2
    fi
fi
chmod -R a+rX "$srt_dir"
export TUIXIU_TEST_SRT_DIR="$srt_dir"
