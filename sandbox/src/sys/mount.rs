//! Mounts: the old and the new mount API, `pivot_root`, idmapped trees.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr;

use libc::{c_char, c_int, c_uint, c_ulong, c_void};

use super::{SysResult, check, check_long, opt_ptr, owned};

pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: c_ulong,
    data: Option<&CStr>,
) -> SysResult<()> {
    // SAFETY: all pointers are NUL-terminated strings or null, valid for
    // the duration of the call.
    check(unsafe {
        libc::mount(opt_ptr(source), target.as_ptr(), opt_ptr(fstype), flags, opt_ptr(data) as *const c_void)
    })
    .map(drop)
}

pub fn umount2(target: &CStr, flags: c_int) -> SysResult<()> {
    // SAFETY: `target` is a valid C string.
    check(unsafe { libc::umount2(target.as_ptr(), flags) }).map(drop)
}

pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> SysResult<()> {
    // SAFETY: both arguments are valid C strings; pivot_root has no libc wrapper.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) }).map(drop)
}

/// `open_tree(dirfd, path, flags)`: with `OPEN_TREE_CLONE` a detached copy of
/// the mount tree at `path`.
pub fn open_tree(dirfd: BorrowedFd<'_>, path: &CStr, flags: c_uint) -> SysResult<OwnedFd> {
    // SAFETY: valid descriptor and C string.
    owned(unsafe { libc::syscall(libc::SYS_open_tree, dirfd.as_raw_fd(), path.as_ptr(), flags) })
}

/// Attach the detached mount `from` onto the object `to` refers to.
pub fn move_mount_fd(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> SysResult<()> {
    let empty = c"";
    let flags = libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH;
    // SAFETY: valid descriptors and an empty C string for both paths.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from.as_raw_fd(),
            empty.as_ptr(),
            to.as_raw_fd(),
            empty.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `mount_setattr` on the mount `fd` refers to; `recursive` covers every
/// submount. Flags already set (including ones the kernel locked) are kept:
/// only the bits in `set` are added.
pub fn mount_setattr(fd: BorrowedFd<'_>, set: u64, recursive: bool) -> SysResult<()> {
    mount_setattr_both(fd, set, 0, recursive)
}

/// `mount_setattr` clearing the bits in `clear` on the single mount `fd`
/// refers to (the kernel refuses to clear a flag it locked).
pub fn mount_clearattr(fd: BorrowedFd<'_>, clear: u64) -> SysResult<()> {
    mount_setattr_both(fd, 0, clear, false)
}

fn mount_setattr_both(fd: BorrowedFd<'_>, set: u64, clear: u64, recursive: bool) -> SysResult<()> {
    let attr = libc::mount_attr { attr_set: set, attr_clr: clear, propagation: 0, userns_fd: 0 };
    mount_setattr_raw(fd, attr, recursive)
}

/// The one raw `mount_setattr` (`AT_EMPTY_PATH`, `AT_RECURSIVE` with `recursive`).
fn mount_setattr_raw(fd: BorrowedFd<'_>, mut attr: libc::mount_attr, recursive: bool) -> SysResult<()> {
    let mut flags = libc::AT_EMPTY_PATH as c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as c_uint;
    }
    // SAFETY: `attr` is a valid, initialized mount_attr and its size is passed.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &mut attr as *mut libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    })
    .map(drop)
}

pub fn fsopen(fstype: &CStr) -> SysResult<OwnedFd> {
    // SAFETY: valid C string.
    owned(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), libc::FSOPEN_CLOEXEC) })
}

/// `fsconfig(FSCONFIG_SET_STRING)`, or `FSCONFIG_SET_FLAG` when `value` is `None`.
pub fn fsconfig_set(fd: BorrowedFd<'_>, key: &CStr, value: Option<&CStr>) -> SysResult<()> {
    let cmd = if value.is_some() { libc::FSCONFIG_SET_STRING } else { libc::FSCONFIG_SET_FLAG };
    // SAFETY: valid descriptor, key, and value (or null for a flag).
    check_long(unsafe {
        libc::syscall(libc::SYS_fsconfig, fd.as_raw_fd(), cmd, key.as_ptr(), opt_ptr(value), 0)
    })
    .map(drop)
}

pub fn fsconfig_create(fd: BorrowedFd<'_>) -> SysResult<()> {
    // SAFETY: FSCONFIG_CMD_CREATE takes no key or value.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fd.as_raw_fd(),
            libc::FSCONFIG_CMD_CREATE,
            ptr::null::<c_char>(),
            ptr::null::<c_void>(),
            0,
        )
    })
    .map(drop)
}

/// `fspick(path)`: a context to reconfigure the filesystem mounted there.
pub fn fspick(path: &CStr) -> SysResult<OwnedFd> {
    // SAFETY: valid C string; flags are plain integers.
    owned(unsafe { libc::syscall(libc::SYS_fspick, libc::AT_FDCWD, path.as_ptr(), libc::FSPICK_CLOEXEC) })
}

/// `fsconfig(FSCONFIG_CMD_RECONFIGURE)`: applies what was set on an
/// [`fspick`] context.
pub fn fsconfig_reconfigure(fd: BorrowedFd<'_>) -> SysResult<()> {
    // SAFETY: FSCONFIG_CMD_RECONFIGURE takes no key or value.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fd.as_raw_fd(),
            libc::FSCONFIG_CMD_RECONFIGURE,
            ptr::null::<c_char>(),
            ptr::null::<c_void>(),
            0,
        )
    })
    .map(drop)
}

/// `fsmount`: a detached mount of the configured filesystem with `MOUNT_ATTR_*` flags.
pub fn fsmount(fd: BorrowedFd<'_>, attrs: u64) -> SysResult<OwnedFd> {
    // SAFETY: valid descriptor; flags are plain integers.
    owned(unsafe { libc::syscall(libc::SYS_fsmount, fd.as_raw_fd(), libc::FSMOUNT_CLOEXEC, attrs as c_uint) })
}

/// Recursive `mount_setattr` that adds `attrs` and an idmap (the user
/// namespace `userns_fd`) to every mount of the detached tree `fd`.
pub fn mount_setattr_idmap(fd: BorrowedFd<'_>, attrs: u64, userns_fd: RawFd) -> SysResult<()> {
    let attr = libc::mount_attr {
        attr_set: attrs | libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns_fd as u64,
    };
    mount_setattr_raw(fd, attr, true)
}
