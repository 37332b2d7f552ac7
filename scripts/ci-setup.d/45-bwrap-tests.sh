# bwrap on the host (tests/bwrap_host.rs): Python's libseccomp bindings
# export the BPF programs given to --seccomp; scripts/bwrap-upstream-tests.sh
# runs bubblewrap's own test-seccomp.py with them too.
if ! /usr/bin/python3 -c 'import seccomp' 2>/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-seccomp >/dev/null
fi
/usr/bin/python3 -c 'import seccomp' || { echo "scripts/ci-setup.d/45-bwrap-tests.sh: no python3 seccomp module after installing python3-seccomp" >&2; return 1; }
