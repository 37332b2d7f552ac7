//! Thin, allocation-free wrappers over the raw syscalls the runtime uses.
//!
//! Every function takes C strings and raw descriptors prepared by the caller
//! and returns the kernel's `errno` on failure. This is the only module with
//! `unsafe` syscall invocations for the mount and namespace work, which keeps
//! the code that decides *what* to mount readable and the seam narrow.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;

use libc::{c_char, c_int, c_long, c_uint, c_ulong, c_void};
use nix::errno::Errno;

pub type SysResult<T> = Result<T, Errno>;

fn check(ret: c_int) -> SysResult<c_int> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

fn check_long(ret: c_long) -> SysResult<c_long> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

fn owned(ret: c_long) -> SysResult<OwnedFd> {
    let fd = check_long(ret)? as RawFd;
    // SAFETY: the kernel just returned this descriptor to us and nothing else
    // refers to it, so we are its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn opt_ptr(s: Option<&CStr>) -> *const c_char {
    s.map_or(ptr::null(), CStr::as_ptr)
}

/// `clone(flags | SIGCHLD)` with fork semantics: no new stack, the child
/// continues from this call with a copy of the address space.
///
/// Returns 0 in the child and the child's pid in the parent.
///
/// # Safety
/// The caller must be single-threaded: the child gets a copy of only the
/// calling thread, so a lock held by another thread (e.g. the allocator's)
/// would stay locked forever in the child. The child must leave with
/// `_exit` (or `execve`) and never return into code that assumes it is the
/// parent.
pub unsafe fn clone_fork(flags: c_ulong) -> SysResult<libc::pid_t> {
    let flags = flags | libc::SIGCHLD as c_ulong;
    // The raw syscall takes (flags, stack, parent_tid, child_tid, tls) on
    // x86_64 and (flags, stack, parent_tid, tls, child_tid) on aarch64; with
    // a null stack and no CLONE_*TID/SETTLS flags only `flags` matters. s390x
    // swaps the first two (CONFIG_CLONE_BACKWARDS2).
    #[cfg(target_arch = "s390x")]
    // SAFETY: see the function's contract; no pointers are passed.
    let ret = unsafe { libc::syscall(libc::SYS_clone, 0 as c_ulong, flags, 0, 0, 0) };
    #[cfg(not(target_arch = "s390x"))]
    // SAFETY: see the function's contract; no pointers are passed.
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0 as c_ulong, 0, 0, 0) };
    check_long(ret).map(|pid| pid as libc::pid_t)
}

/// Plain `fork()`; same contract as [`clone_fork`].
///
/// # Safety
/// See [`clone_fork`].
pub unsafe fn fork() -> SysResult<libc::pid_t> {
    // SAFETY: delegated to the caller (single-threaded, child `_exit`s).
    unsafe { clone_fork(0) }
}

/// A stack for [`spawn_vfork`]: anonymous memory with an inaccessible
/// guard page below it, so an overflow faults instead of writing into
/// whatever lies under it. Pages are only backed once touched.
pub struct ChildStack {
    base: *mut c_void,
    len: usize,
}

impl ChildStack {
    pub const SIZE: usize = 256 * 1024;

    pub fn new() -> SysResult<ChildStack> {
        let len = Self::SIZE + GUARD;
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the lowest page of the mapping we just made.
        check(unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) })?;
        Ok(stack)
    }

    /// Unmaps the stack in this process: PID 1, once PID 2 has executed
    /// (PID 1 never drops its copy of the plan; it leaves with `_exit`).
    ///
    /// # Safety
    /// Nothing may run on or read this stack any more, and the stack must
    /// not be dropped afterwards in this process.
    pub unsafe fn release(&self) {
        // SAFETY: exactly the mapping made in `new`; the caller guarantees
        // it is unused. munmap of an unmapped range is not an error.
        unsafe { libc::munmap(self.base, self.len) };
    }

    /// The initial stack pointer: the (16-byte aligned) top of the stack.
    fn top(&self) -> *mut c_void {
        (self.base as usize + self.len) as *mut c_void
    }
}

const GUARD: usize = 4096;

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Starts `child(arg)` in a new process that shares this one's memory, on
/// `stack`, and suspends this process until the child has called `execve`
/// or exited (`CLONE_VM | CLONE_VFORK`, as `posix_spawn` does). Nothing is
/// copied: no page tables, no copy-on-write faults afterwards, and the
/// child's `execve` has no copy of the address space to tear down.
///
/// # Safety
/// The child runs on this process's memory while this process is stopped:
/// `child` must end in `execve` or `_exit`, never return or unwind, and
/// leave memory this process uses afterwards as it was (it may allocate;
/// this process runs no other thread). `stack` must not be used by anything
/// else until this returns.
pub unsafe fn spawn_vfork(
    stack: &ChildStack,
    child: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
) -> SysResult<libc::pid_t> {
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    // SAFETY: per the contract; glibc's clone switches to `stack` in the
    // child and calls `child(arg)` there.
    check(unsafe { libc::clone(child, stack.top(), flags, arg) })
}

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

/// `fsmount`: a detached mount of the configured filesystem with `MOUNT_ATTR_*` flags.
pub fn fsmount(fd: BorrowedFd<'_>, attrs: u64) -> SysResult<OwnedFd> {
    // SAFETY: valid descriptor; flags are plain integers.
    owned(unsafe { libc::syscall(libc::SYS_fsmount, fd.as_raw_fd(), libc::FSMOUNT_CLOEXEC, attrs as c_uint) })
}

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

pub fn chdir(path: &CStr) -> SysResult<()> {
    // SAFETY: valid C string.
    check(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
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

pub fn fchdir(fd: BorrowedFd<'_>) -> SysResult<()> {
    // SAFETY: valid descriptor.
    check(unsafe { libc::fchdir(fd.as_raw_fd()) }).map(drop)
}

pub fn sethostname(name: &CStr) -> SysResult<()> {
    let bytes = name.to_bytes();
    // SAFETY: `bytes` is valid for its length.
    check(unsafe { libc::sethostname(bytes.as_ptr().cast(), bytes.len()) }).map(drop)
}

pub fn setresuid(uid: u32) -> SysResult<()> {
    // Raw syscall: glibc's wrapper would broadcast to other threads, and we
    // have none.
    // SAFETY: integer arguments only.
    check_long(unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) }).map(drop)
}

pub fn setresgid(gid: u32) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check_long(unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) }).map(drop)
}

pub fn prctl(option: c_int, arg2: c_ulong) -> SysResult<c_int> {
    // SAFETY: the options used here take integer arguments only.
    check(unsafe { libc::prctl(option, arg2, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong) })
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

pub fn setsid() -> SysResult<()> {
    // SAFETY: no arguments.
    check(unsafe { libc::setsid() }).map(drop)
}

/// `execve`; only returns on failure.
pub fn execve(path: &CStr, argv: &[*const c_char], envp: &[*const c_char]) -> Errno {
    // SAFETY: `argv` and `envp` are null-terminated arrays of pointers into
    // C strings owned by the prepared plan, which outlives this call.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Errno::last()
}

pub fn kill(pid: libc::pid_t, sig: c_int) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// `waitpid`, retrying on EINTR. Returns (pid, raw status).
pub fn waitpid(pid: libc::pid_t, flags: c_int) -> SysResult<(libc::pid_t, c_int)> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer.
        let ret = unsafe { libc::waitpid(pid, &mut status, flags) };
        if ret >= 0 {
            return Ok((ret, status));
        }
        let e = Errno::last();
        if e != Errno::EINTR {
            return Err(e);
        }
    }
}

/// Maps a raw wait status to a shell-style exit code: the code, or 128+signal.
pub fn exit_code_of(status: c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        128
    }
}

/// Sets `sig` to its default disposition.
pub fn reset_signal(sig: c_int) {
    // SAFETY: a zeroed sigaction with SIG_DFL is valid; errors (for SIGKILL,
    // SIGSTOP and the reserved realtime signals) are expected and ignored.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &sa, ptr::null_mut());
    }
}

/// Installs `handler` for `sig` with `SA_RESTART`.
pub fn set_signal_handler(sig: c_int, handler: extern "C" fn(c_int)) -> SysResult<()> {
    // SAFETY: the handler is an `extern "C" fn(c_int)` that only performs
    // async-signal-safe work; the sigaction struct is fully initialized.
    check(unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, ptr::null_mut())
    })
    .map(drop)
}

/// Replaces the signal mask; returns the previous one.
pub fn set_sigmask(how: c_int, set: &libc::sigset_t) -> SysResult<libc::sigset_t> {
    // SAFETY: both pointers refer to valid sigset_t values.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        check(libc::sigprocmask(how, set, &mut old))?;
        Ok(old)
    }
}

pub fn sigset_of(signals: &[c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialize the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

pub fn empty_sigset() -> libc::sigset_t {
    sigset_of(&[])
}

/// A pipe with both ends close-on-exec: (read, write).
pub fn pipe() -> SysResult<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 returned two new descriptors that we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Brings the loopback interface up in the current network namespace. The
/// kernel adds 127.0.0.1/8 and ::1 itself when `lo` goes up.
pub fn loopback_up() -> SysResult<()> {
    // SAFETY: plain socket creation.
    let sock =
        owned(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) } as c_long)?;
    // SAFETY: ifreq is a plain C struct for which all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as c_char;
    }
    // SAFETY: `req` is a valid ifreq naming "lo" for both ioctls.
    unsafe {
        check(libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req))?;
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        check(libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req))?;
    }
    Ok(())
}

/// Immediately terminates the process without running destructors or
/// `atexit` handlers (which belong to the parent's copy of the program).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call.
    unsafe { libc::_exit(code) }
}

// ---- Hardening: Landlock, capabilities, seccomp, rlimits ----

/// `struct landlock_ruleset_attr` (ABI 6 layout; shorter sizes are passed
/// for older ABIs).
#[repr(C)]
pub struct LandlockRulesetAttr {
    pub handled_access_fs: u64,
    pub handled_access_net: u64,
    pub scoped: u64,
}

/// `struct landlock_path_beneath_attr`, which the kernel declares packed.
#[repr(C, packed)]
struct LandlockPathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

const LANDLOCK_CREATE_RULESET_VERSION: c_uint = 1;
const LANDLOCK_RULE_PATH_BENEATH: c_int = 1;

/// The kernel's Landlock ABI version.
pub fn landlock_abi_version() -> SysResult<i32> {
    // SAFETY: a null attr with size 0 and the VERSION flag only queries.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            ptr::null::<c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    })
    .map(|v| v as i32)
}

pub fn landlock_create_ruleset(attr: &LandlockRulesetAttr, size: usize) -> SysResult<OwnedFd> {
    debug_assert!(size <= std::mem::size_of::<LandlockRulesetAttr>());
    // SAFETY: `attr` is valid for at least `size` bytes.
    owned(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            attr as *const LandlockRulesetAttr,
            size,
            0 as c_uint,
        )
    })
}

pub fn landlock_add_path_rule(ruleset: &OwnedFd, parent: &OwnedFd, access: u64) -> SysResult<()> {
    let attr = LandlockPathBeneathAttr { allowed_access: access, parent_fd: parent.as_raw_fd() };
    // SAFETY: valid descriptors and a valid, packed attr struct.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const LandlockPathBeneathAttr,
            0 as c_uint,
        )
    })
    .map(drop)
}

pub fn landlock_restrict_self(ruleset: &OwnedFd) -> SysResult<()> {
    // SAFETY: valid descriptor, no flags.
    check_long(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0 as c_uint) })
        .map(drop)
}

/// The device a descriptor's file lives on.
pub fn dev_of(fd: &OwnedFd) -> Option<u64> {
    // SAFETY: `st` is a valid out-pointer for fstat.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd.as_raw_fd(), &mut st) == 0).then_some(st.st_dev)
    }
}

// ---- Unix sockets (the nested-sandbox portal) ----

/// A `sockaddr_un` for `path` and its length, or ENAMETOOLONG.
fn unix_addr(path: &CStr) -> SysResult<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data for which all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.to_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(Errno::ENAMETOOLONG);
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// A new unix stream socket (close-on-exec, non-blocking).
pub fn unix_stream_socket() -> SysResult<OwnedFd> {
    let kind = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: plain socket creation.
    owned(unsafe { libc::socket(libc::AF_UNIX, kind, 0) } as c_long)
}

/// `bind` a unix socket to `path` (a relative one from the working directory).
pub fn bind_unix(fd: RawFd, path: &CStr) -> SysResult<()> {
    let (addr, len) = unix_addr(path)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    check(unsafe { libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len) }).map(drop)
}

pub fn listen(fd: RawFd) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::listen(fd, 64) }).map(drop)
}

/// `connect` a new (blocking, close-on-exec) unix stream socket to `path`.
pub fn connect_unix(path: &CStr) -> SysResult<OwnedFd> {
    let (addr, len) = unix_addr(path)?;
    // SAFETY: plain socket creation.
    let fd =
        owned(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) } as c_long)?;
    loop {
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        match check(unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })
        {
            Ok(_) => return Ok(fd),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `accept4` a connection (close-on-exec, blocking).
pub fn accept(fd: RawFd) -> SysResult<OwnedFd> {
    // SAFETY: null address pointers are allowed; the flags are valid.
    owned(unsafe { libc::accept4(fd, ptr::null_mut(), ptr::null_mut(), libc::SOCK_CLOEXEC) } as c_long)
}

pub fn setns(fd: RawFd, nstype: c_int) -> SysResult<()> {
    // SAFETY: setns with a descriptor number and flags; no memory involved.
    check(unsafe { libc::setns(fd, nstype) }).map(drop)
}

pub fn unshare(flags: c_int) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

/// Whether `fd` is on a procfs (`fstatfs`).
pub fn is_procfs(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: `st` is a valid out-pointer for fstatfs.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::fstatfs(fd.as_raw_fd(), &mut st) == 0 && st.f_type == libc::PROC_SUPER_MAGIC
    }
}

pub fn is_dir(fd: &OwnedFd) -> bool {
    // SAFETY: `st` is a valid out-pointer for fstat.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd.as_raw_fd(), &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR
    }
}

/// `prctl` with all five arguments.
pub fn prctl5(option: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> SysResult<c_int> {
    // SAFETY: the options used here take integer arguments only.
    check(unsafe { libc::prctl(option, a2, a3, a4, a5) })
}

/// Sets the effective, permitted and inheritable capability sets to `caps`
/// (a bit mask of capability numbers).
pub fn capset_to(caps: u64) -> SysResult<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: c_int,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let (low, high) = (caps as u32, (caps >> 32) as u32);
    let data = [
        Data { effective: low, permitted: low, inheritable: low },
        Data { effective: high, permitted: high, inheritable: high },
    ];
    // SAFETY: a v3 header and two data structs, as capset(2) requires.
    check_long(unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) }).map(drop)
}

/// Installs a seccomp filter (no_new_privs must be set).
/// As [`seccomp_set_filter`], through `prctl(PR_SET_SECCOMP)`, as
/// bubblewrap installs its callers' programs (a program installed before
/// may allow `prctl` and not `seccomp`).
pub fn seccomp_prctl_filter(filter: &[libc::sock_filter]) -> SysResult<()> {
    let prog =
        libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `prog` points at `filter`, which outlives the call; the kernel copies it.
    check(unsafe {
        libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog)
    })
    .map(drop)
}

pub fn seccomp_set_filter(filter: &[libc::sock_filter]) -> SysResult<()> {
    let prog =
        libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `prog` points at `filter`, which outlives the call; the kernel copies it.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as c_uint,
            &prog as *const libc::sock_fprog,
        )
    })
    .map(drop)
}

pub fn setrlimit(resource: c_int, value: u64) -> SysResult<()> {
    let lim = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: `lim` is a valid rlimit.
    check(unsafe { libc::setrlimit(resource as _, &lim) }).map(drop)
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
