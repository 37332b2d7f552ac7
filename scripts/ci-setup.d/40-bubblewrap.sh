# bubblewrap: the nested-sandbox tests check that a host's /usr/bin/bwrap
# is covered by our front end inside a sandbox (tests/nested.rs), and
# scripts/bench nested measures against it.
if ! command -v bwrap >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
fi
command -v bwrap >/dev/null || { echo "scripts/ci-setup.d/40-bubblewrap.sh: no bwrap after installing bubblewrap" >&2; return 1; }
