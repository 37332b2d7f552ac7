#!/usr/bin/env bash
# Builds the daemon's image (deploy/container/Dockerfile) from this
# repository alone: the three binaries linked statically (TUIXIU_STATIC=1,
# see build.rs), staged with a few files into a build context, then
# `docker build` from `FROM scratch`. No base image, no registry.
#
#   deploy/container/build.sh                       # tuixiu-sandbox:latest, release build
#   deploy/container/build.sh --tag reg.example/tuixiu-sandbox:1.2 --profile release
#
# Options:
#   --tag NAME         image name (default tuixiu-sandbox:latest)
#   --profile NAME     cargo profile: release (default) or dev (faster to
#                      build; the binaries are stripped either way)
#   --target-dir DIR   cargo target directory for the static build
#                      (default target/static: static and dynamic builds
#                      of the same binaries must not overwrite each other)
#   --cli NAME         docker, or podman (default docker)
#
# The image gets the build machine's CA bundle
# (/etc/ssl/certs/ca-certificates.crt) when it has one, for wss:// to a
# backend with a public certificate; otherwise set tls.ca_file.
set -euo pipefail
cd "$(dirname "$0")/../.."

tag=tuixiu-sandbox:latest
profile=release
target_dir=target/static
cli=docker
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) tag=$2; shift 2 ;;
        --profile) profile=$2; shift 2 ;;
        --target-dir) target_dir=$2; shift 2 ;;
        --cli) cli=$2; shift 2 ;;
        -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "deploy/container/build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$profile" in
    release) out=release ;;
    dev) out=debug ;;
    *) echo "deploy/container/build.sh: --profile must be release or dev" >&2; exit 2 ;;
esac

echo "==> cargo build --profile $profile (static, into $target_dir)"
TUIXIU_STATIC=1 CARGO_TARGET_DIR=$target_dir cargo build --locked --profile "$profile" --bins

bins=(tuixiu-sandbox tuixiu-sandbox-full tuixiu-sandbox-proxy)
for bin in "${bins[@]}"; do
    # A dynamic binary would not start in an image without a C library.
    if readelf -l "$target_dir/$out/$bin" | grep -q 'program interpreter'; then
        echo "deploy/container/build.sh: $target_dir/$out/$bin is not statically linked (see build.rs)" >&2
        exit 1
    fi
done

context=$(mktemp -d "${TMPDIR:-/tmp}/tuixiu-image-XXXXXX")
trap 'rm -rf "$context"' EXIT
root=$context/rootfs
owned=$context/owned
install -d -m 0755 "$root/usr/local/bin" "$root/etc/tuixiu-sandbox" "$root/etc/ssl/certs"
install -d -m 1777 "$root/tmp"
for bin in "${bins[@]}"; do
    strip -o "$root/usr/local/bin/$bin" "$target_dir/$out/$bin"
    chmod 0755 "$root/usr/local/bin/$bin"
done
# root for what the runtime needs to name; the daemon's own user; nobody
# (what ids without a mapping show as).
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
    'tuixiu:x:10001:10001:tuixiu-sandbox:/var/lib/tuixiu-sandbox:/sbin/nologin' \
    'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' >"$root/etc/passwd"
printf '%s\n' 'root:x:0:' 'tuixiu:x:10001:' 'nogroup:x:65534:' >"$root/etc/group"
chmod 0644 "$root/etc/passwd" "$root/etc/group"
if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
    install -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
else
    echo "note: no /etc/ssl/certs/ca-certificates.crt here: the image trusts only tls.ca_file"
fi
# Owned by the daemon's user (COPY --chown): its state and the default
# workspace root.
install -d -m 0700 "$owned/var/lib/tuixiu-sandbox"
install -d -m 0750 "$owned/srv/tuixiu/workspaces"
cp deploy/container/Dockerfile "$context/Dockerfile"

echo "==> $cli build -t $tag"
DOCKER_BUILDKIT=0 "$cli" build --quiet -t "$tag" "$context" >/dev/null
echo "built $tag"
