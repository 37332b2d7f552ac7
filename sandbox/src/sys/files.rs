//! Files and descriptors: opening in a root, directories, links, reads
//! and writes, closing, duplicating, polling, pipes, `fstat`.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use libc::{c_int, c_long, c_uint};
use nix::errno::Errno;

use super::{SysResult, check, check_long, owned};

/// `openat2` with a `resolve` policy (e.g. `RESOLVE_IN_ROOT`).
pub fn openat2(
    dirfd: BorrowedFd<'_>,
    path: &CStr,
    flags: c_int,
    mode: u32,
    resolve: u64,
) -> SysResult<OwnedFd> {
    let mut how: libc::open_how = unsafe {
        // SAFETY: open_how is a plain C struct for which all-zero is valid.
        std::mem::zeroed()
    };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 { mode as u64 } else { 0 };
    how.resolve = resolve;
    // SAFETY: `how` is initialized and its size is passed; path is a C string.
    owned(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd.as_raw_fd(),
            path.as_ptr(),
            &mut how as *mut libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    })
}

pub fn open(path: &CStr, flags: c_int, mode: u32) -> SysResult<OwnedFd> {
    // SAFETY: valid C string.
    owned(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode as c_uint) } as c_long)
}

pub fn openat(dirfd: BorrowedFd<'_>, path: &CStr, flags: c_int, mode: u32) -> SysResult<OwnedFd> {
    // SAFETY: valid descriptor and C string.
    owned(unsafe { libc::openat(dirfd.as_raw_fd(), path.as_ptr(), flags | libc::O_CLOEXEC, mode as c_uint) }
        as c_long)
}

/// `fchmodat2(fd, "", mode, AT_EMPTY_PATH)`: the mode of what an `O_PATH`
/// descriptor names (Linux 6.6).
pub fn fchmod_path(fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
    const SYS_FCHMODAT2: libc::c_long = 452;
    // SAFETY: a valid descriptor, an empty C string, plain integers.
    check_long(unsafe {
        libc::syscall(SYS_FCHMODAT2, fd.as_raw_fd(), c"".as_ptr(), mode as libc::c_uint, libc::AT_EMPTY_PATH)
    })
    .map(drop)
}

/// A whole-file read lock (`fcntl(F_SETLK, F_RDLCK)`), as bubblewrap's
/// `--lock-file` takes; held until this process closes the file or exits.
pub fn read_lock(fd: RawFd) -> SysResult<()> {
    // SAFETY: flock is plain data; zeroed means from offset 0 to the end.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_RDLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: a valid flock for F_SETLK.
    check(unsafe { libc::fcntl(fd, libc::F_SETLK, &lock) }).map(drop)
}

pub fn mkdirat(dirfd: BorrowedFd<'_>, name: &CStr, mode: u32) -> SysResult<()> {
    // SAFETY: valid descriptor and C string.
    check(unsafe { libc::mkdirat(dirfd.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) }).map(drop)
}

pub fn unlinkat(dirfd: BorrowedFd<'_>, name: &CStr, flags: c_int) -> SysResult<()> {
    // SAFETY: valid descriptor and C string.
    check(unsafe { libc::unlinkat(dirfd.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

pub fn symlinkat(target: &CStr, dirfd: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    // SAFETY: valid C strings and descriptor.
    check(unsafe { libc::symlinkat(target.as_ptr(), dirfd.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// Reads the target of the symlink `name` in `dirfd` into `buf`; returns its length.
pub fn readlinkat(dirfd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes.
    let n = unsafe { libc::readlinkat(dirfd.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 { Err(Errno::last()) } else { Ok(n as usize) }
}

/// Writes all of `buf`, retrying on EINTR and short writes.
pub fn write_all(fd: RawFd, mut buf: &[u8]) -> SysResult<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for `buf.len()` bytes.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = Errno::last();
            if e == Errno::EINTR {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// `read`, retrying on EINTR.
pub fn read(fd: RawFd, buf: &mut [u8]) -> SysResult<usize> {
    loop {
        // SAFETY: `buf` is valid for `buf.len()` bytes.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = Errno::last();
        if e != Errno::EINTR {
            return Err(e);
        }
    }
}

/// Marks every descriptor from `first` on close-on-exec, so nothing the
/// launcher had open leaks into the command.
pub fn close_range_cloexec(first: c_uint) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check_long(unsafe { libc::syscall(libc::SYS_close_range, first, c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) })
        .map(drop)
}

/// Most descriptors [`close_all_except`] can keep.
pub const MAX_KEPT_FDS: usize = 32;

/// Closes every descriptor from 3 up to (not including) `below` except
/// those in `keep` (at most [`MAX_KEPT_FDS`]).
pub fn close_all_except(keep: &[RawFd], below: c_uint) -> SysResult<()> {
    let mut sorted = [0 as RawFd; MAX_KEPT_FDS];
    if keep.len() > sorted.len() {
        // Never close what the caller needs; refuse instead.
        return Err(Errno::E2BIG);
    }
    let n = keep.len();
    sorted[..n].copy_from_slice(&keep[..n]);
    let sorted = &mut sorted[..n];
    sorted.sort_unstable();
    let mut first: c_uint = 3;
    for &fd in sorted.iter() {
        if fd < 0 || (fd as c_uint) < first || fd as c_uint >= below {
            continue;
        }
        if fd as c_uint > first {
            // SAFETY: integer arguments only; closes descriptors we own.
            check_long(unsafe { libc::syscall(libc::SYS_close_range, first, fd as c_uint - 1, 0) })?;
        }
        first = fd as c_uint + 1;
    }
    if first >= below {
        return Ok(());
    }
    // SAFETY: as above.
    check_long(unsafe { libc::syscall(libc::SYS_close_range, first, below - 1, 0) }).map(drop)
}

pub fn dup2(old: RawFd, new: RawFd) -> SysResult<()> {
    // SAFETY: integer arguments only; closing `new` is what we want.
    check(unsafe { libc::dup2(old, new) }).map(drop)
}

/// Closes the raw descriptor `fd`.
///
/// # Safety
/// The caller owns `fd` and gives it up: nothing (no `OwnedFd`, no other
/// copy of the number) closes or uses it afterwards.
pub unsafe fn close(fd: RawFd) -> SysResult<()> {
    // SAFETY: the caller owns `fd` and gives it up.
    check(unsafe { libc::close(fd) }).map(drop)
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, min)`: a close-on-exec copy of `fd` at the
/// lowest free number from `min` on.
pub fn dup_cloexec(fd: RawFd, min: RawFd) -> SysResult<OwnedFd> {
    // SAFETY: integer arguments only; the copy is a new descriptor.
    owned(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) } as c_long)
}

/// `poll` over `fds` (an entry with a negative `fd` is ignored); returns
/// how many entries have events. No retry on EINTR: the callers decide.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: c_int) -> SysResult<c_int> {
    // SAFETY: `fds` is valid for `fds.len()` entries.
    check(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) })
}

/// Whether `fd` has any of `events` (or a hang-up or error) right now: a
/// `poll` of one entry with a zero timeout; `None` if the poll failed.
pub fn poll_now(fd: RawFd, events: libc::c_short) -> Option<libc::c_short> {
    let mut pfd = [libc::pollfd { fd, events, revents: 0 }];
    poll(&mut pfd, 0).ok().map(|_| pfd[0].revents)
}

/// A pipe with both ends close-on-exec: (read, write).
pub fn pipe() -> SysResult<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 returned two new descriptors that we now own.
    let read = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    // SAFETY: as above.
    let write = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    Ok((read, write))
}

/// The device a descriptor's file lives on.
pub fn dev_of(fd: &OwnedFd) -> Option<u64> {
    fstat(fd.as_fd()).map(|st| st.st_dev)
}

/// Whether `fd` is on a procfs (`fstatfs`).
pub fn is_procfs(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: statfs is plain data, for which all-zero is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for fstatfs.
    (unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) }) == 0 && st.f_type == libc::PROC_SUPER_MAGIC
}

/// `faccessat(dirfd, path, mode, 0)`: checked with the real ids, as
/// `access(2)`.
pub fn faccessat(dirfd: BorrowedFd<'_>, path: &CStr, mode: c_int) -> SysResult<()> {
    // SAFETY: `path` is a valid C string and `dirfd` an open descriptor.
    check(unsafe { libc::faccessat(dirfd.as_raw_fd(), path.as_ptr(), mode, 0) }).map(drop)
}

/// Whether `fd` names the root of a mount (`statx`'s `STATX_ATTR_MOUNT_ROOT`).
pub fn is_mount_root(fd: BorrowedFd<'_>) -> SysResult<bool> {
    // SAFETY: statx is plain data, for which all-zero is valid.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: an empty path with AT_EMPTY_PATH names `fd`; `st` is a valid out-pointer.
    check(unsafe { libc::statx(fd.as_raw_fd(), c"".as_ptr(), flags, 0, &mut st) })?;
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if st.stx_attributes_mask & root == 0 {
        return Err(Errno::ENOSYS);
    }
    Ok(st.stx_attributes & root != 0)
}

pub fn is_dir(fd: &OwnedFd) -> bool {
    fstat(fd.as_fd()).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// `fstat`; `None` on failure.
fn fstat(fd: BorrowedFd<'_>) -> Option<libc::stat> {
    // SAFETY: stat is plain data, for which all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for fstat.
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0).then_some(st)
}
