#!/bin/sh
# Flatpak-like: composed /usr runtime view, data files, lock, info fd, new session.
exec "$BWRAP" --unshare-ipc --unshare-pid --unshare-net --unshare-user --unshare-uts --unshare-cgroup-try \
  --die-with-parent --new-session \
  --proc /proc --dev /dev --tmpfs /tmp --dir /run/user/1000 --dir /var/tmp \
  --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin \
  --ro-bind /etc/ssl /etc/ssl --ro-bind-try /etc/resolv.conf /etc/resolv.conf \
  --ro-bind-data 3 /etc/passwd --ro-bind-data 4 /etc/group --perms 0700 --dir /home/user \
  --setenv HOME /home/user --setenv XDG_RUNTIME_DIR /run/user/1000 --chdir /home/user \
  --ro-bind $BENCH_DIR/.ref /.ref --info-fd 5 --lock-file /.ref -- /usr/bin/true 3<$BENCH_DIR/passwd 4<$BENCH_DIR/group 5>/dev/null
