#!/bin/sh
# codex-linux-sandbox's: read-only root, writable cwd, no network.
exec "$BWRAP" --new-session --die-with-parent --ro-bind / / --dev /dev --bind $BENCH_DIR $BENCH_DIR \
  --unshare-user --unshare-pid --unshare-net --proc /proc -- /usr/bin/true
