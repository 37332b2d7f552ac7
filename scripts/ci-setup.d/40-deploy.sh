# What the deployment tests need (tests/deploy.rs, deploy/):
# * systemd: `systemd-analyze verify` on the unit, systemd-sysusers and
#   systemd-tmpfiles on its files, and /lib/systemd/systemd booted in a
#   container for the unit's run (deploy/systemd/check-hardening.sh). The
#   package installs and works without systemd running as PID 1.
# * kubernetes-validate (PyPI), in a venv of its own: it carries the
#   Kubernetes schemas, so the manifests are validated offline (the test
#   runs it without a network). Its interpreter is exported for the test.
# * binutils (strip, readelf) for deploy/container/build.sh.
#
# Sourced by scripts/test.sh.

deploy_need=()
command -v systemd-analyze >/dev/null && [ -x /lib/systemd/systemd ] || deploy_need+=(systemd)
command -v strip >/dev/null && command -v readelf >/dev/null || deploy_need+=(binutils)
command -v nsenter >/dev/null || deploy_need+=(util-linux)
source "$(dirname "${BASH_SOURCE[0]}")/../ci-apt.sh"
ci_apt_install "${deploy_need[@]}"

kubernetes_validate_version=1.37.0
kubernetes_validate_venv=/opt/tuixiu-ci/kubernetes-validate-$kubernetes_validate_version
if ! "$kubernetes_validate_venv/bin/python" -c 'import kubernetes_validate' 2>/dev/null; then
    echo "installing kubernetes-validate $kubernetes_validate_version into $kubernetes_validate_venv"
    /usr/bin/python3 -m venv "$kubernetes_validate_venv"
    "$kubernetes_validate_venv/bin/pip" install --quiet --disable-pip-version-check \
        "kubernetes-validate==$kubernetes_validate_version"
fi
export TUIXIU_TEST_KUBERNETES_VALIDATE_PYTHON="$kubernetes_validate_venv/bin/python"
