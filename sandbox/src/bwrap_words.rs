//! bubblewrap's words for a failed setup step of a bwrap sandbox (on the
//! host and nested): `Can't mkdir /x: Read-only file system`, `Can't mount
//! tmpfs on /newroot/x: ...`, where one of its messages says what our step did.
//! Runs in the sandbox's PID 1: writes into the report, allocates nothing.

use std::ffi::CStr;
use std::fmt;

use nix::errno::Errno;

use crate::mounts::Fail;
use crate::prepare::{Action, Kind};
use crate::report::Lossy;

/// bubblewrap's message for `fail` during `action`, where one maps clearly;
/// `None` leaves the runtime's own words (which name the call).
pub(crate) fn setup_failure<'a>(action: &'a Action, fail: &Fail<'a>) -> Option<Words<'a>> {
    use What::*;
    // Finding or creating the destination (mounts.rs: resolve, target).
    let creating = matches!(fail.call, "openat2" | "mkdirat" | "create" | "openat" | "split");
    // What is on the way is no directory: a parent, as bubblewrap's
    // mkdir_with_parents finds (the walk marks it).
    let parent = fail.parent;
    let at = |what: What<'a>, dst: &'a CStr| Some(Words { what, dst, errno: fail.errno });
    let made = |kind: Kind, dst: &'a CStr| match (parent, kind) {
        (true, _) => at(MkdirParents, dst),
        (false, Kind::Dir) => at(Mkdir, dst),
        (false, Kind::File) => at(CreateFileAt, dst),
    };
    let mount_calls =
        matches!(fail.call, "fsopen" | "fsconfig" | "fsconfig(FSCONFIG_CMD_CREATE)" | "fsmount");
    match action {
        Action::Fs { dst, .. } | Action::Bind { dst, .. } | Action::AttachTree { dst, .. }
            if creating && fail.arg == Some(dst.as_c_str()) =>
        {
            let kind = match action {
                Action::Bind { kind, .. } | Action::AttachTree { kind, .. } => *kind,
                _ => Kind::Dir,
            };
            made(kind, dst)
        }
        Action::Fs { fstype, dst, .. } if mount_calls || fail.call == "move_mount" => at(Mount(fstype), dst),
        Action::Proc(p) if creating && fail.arg == Some(p.dst.as_c_str()) => made(Kind::Dir, &p.dst),
        Action::Proc(p)
            if mount_calls || (fail.call == "move_mount" && fail.arg == Some(p.dst.as_c_str())) =>
        {
            at(Mount(c"proc"), &p.dst)
        }
        Action::Dir { dst, .. } => made(Kind::Dir, dst),
        Action::Symlink { dst, .. } if parent => at(MkdirParents, dst),
        Action::Symlink { dst, .. } => at(Symlink, dst),
        Action::CreateFile { dst, .. } if parent => at(MkdirParents, dst),
        Action::CreateFile { dst, .. } if fail.call == "write" => at(WriteData, dst),
        Action::CreateFile { dst, .. } => at(CreateFile, dst),
        // The private file first (`openat`, `write`), then its destination.
        Action::BindData { dst, .. } if fail.call == "openat" => at(Tmpfile, dst),
        Action::BindData { dst, .. } if fail.call == "write" => at(WriteData, dst),
        Action::BindData { dst, .. } if creating => made(Kind::File, dst),
        Action::Chmod { dst, mode } => at(Chmod(*mode), dst),
        Action::Remount { dst, .. } if parent => at(MkdirParents, dst),
        // bubblewrap looks for the destination, then its mount.
        Action::Remount { dst, .. } if fail.call == "openat2" => at(RemountMissing, dst),
        Action::Remount { dst, .. } if fail.call == "statx(STATX_ATTR_MOUNT_ROOT)" => at(RemountNoMount, dst),
        _ => None,
    }
}

/// One of bubblewrap's messages, with its destination and error.
pub(crate) struct Words<'a> {
    what: What<'a>,
    dst: &'a CStr,
    errno: Errno,
}

enum What<'a> {
    MkdirParents,
    Mkdir,
    CreateFileAt,
    CreateFile,
    WriteData,
    Tmpfile,
    Symlink,
    Chmod(u32),
    Mount(&'a CStr),
    RemountMissing,
    RemountNoMount,
}

impl fmt::Display for Words<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dst = Lossy(self.dst.to_bytes());
        let why = self.errno.desc();
        match &self.what {
            What::MkdirParents => write!(f, "Can't mkdir parents for /{dst}: {why}"),
            What::Mkdir => write!(f, "Can't mkdir /{dst}: {why}"),
            What::CreateFileAt => write!(f, "Can't create file at /{dst}: {why}"),
            What::CreateFile => write!(f, "Can't create file /{dst}: {why}"),
            What::WriteData => write!(f, "Can't write data to file /{dst}: {why}"),
            What::Tmpfile => write!(f, "Can't create tmpfile for /{dst}: {why}"),
            What::Symlink => write!(f, "Can't make symlink at /{dst}: {why}"),
            // C's `%#o`: a leading 0, none for 0 itself.
            What::Chmod(0) => write!(f, "Can't chmod 0 /{dst}: {why}"),
            What::Chmod(mode) => write!(f, "Can't chmod 0{mode:o} /{dst}: {why}"),
            What::RemountMissing => {
                write!(f, "Can't remount readonly on /newroot/{dst}: realpath(destination): {why}")
            }
            What::RemountNoMount => write!(
                f,
                "Can't remount readonly on /newroot/{dst}: Unable to find \"/newroot/{dst}\" in mount table"
            ),
            What::Mount(fstype) => {
                // bubblewrap names the mount point by its own path for the new root.
                write!(f, "Can't mount {} on /newroot/{dst}: ", Lossy(fstype.to_bytes()))?;
                // bubblewrap's mount_strerror.
                match self.errno {
                    Errno::ENOSPC => f.write_str(
                        "Limit exceeded (ENOSPC). (Hint: Check that /proc/sys/fs/mount-max is sufficient, typically 100000)",
                    ),
                    errno => f.write_str(errno.desc()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(action: &Action, fail: &Fail<'_>) -> Option<String> {
        setup_failure(action, fail).map(|w| w.to_string())
    }

    #[test]
    fn destinations_and_mounts_in_bubblewraps_words() {
        let tmpfs = Action::Fs {
            fstype: c"tmpfs".into(),
            options: Vec::new(),
            attrs: 0,
            dst: c"x/y".into(),
            pooled: false,
        };
        let fail = Fail::rooted("create", c"x/y", Errno::EROFS);
        assert_eq!(words(&tmpfs, &fail).unwrap(), "Can't mkdir /x/y: Read-only file system");
        let fail = Fail { parent: true, ..Fail::rooted("mkdirat", c"x/y", Errno::ENOTDIR) };
        assert_eq!(words(&tmpfs, &fail).unwrap(), "Can't mkdir parents for /x/y: Not a directory");
        let fail = Fail::new("fsconfig(FSCONFIG_CMD_CREATE)", c"tmpfs", Errno::EPERM);
        assert_eq!(
            words(&tmpfs, &fail).unwrap(),
            "Can't mount tmpfs on /newroot/x/y: Operation not permitted"
        );
        let fail = Fail::rooted("move_mount", c"x/y", Errno::ENOSPC);
        assert!(words(&tmpfs, &fail).unwrap().ends_with("on /newroot/x/y: Limit exceeded (ENOSPC). (Hint: Check that /proc/sys/fs/mount-max is sufficient, typically 100000)"));
        let bind =
            Action::Bind { source: crate::prepare::Source::Host(0), dst: c"etc/x".into(), kind: Kind::File };
        let fail = Fail::rooted("create", c"etc/x", Errno::EROFS);
        assert_eq!(words(&bind, &fail).unwrap(), "Can't create file at /etc/x: Read-only file system");
        // A bind's own mount failing keeps our words (bubblewrap's name its
        // internal /oldroot and /newroot paths).
        assert!(words(&bind, &Fail::rooted("move_mount", c"etc/x", Errno::EPERM)).is_none());
        let chmod = Action::Chmod { dst: c"x".into(), mode: 0o755 };
        let fail = Fail::rooted("openat2", c"x", Errno::ENOENT);
        assert_eq!(words(&chmod, &fail).unwrap(), "Can't chmod 0755 /x: No such file or directory");
    }
}
