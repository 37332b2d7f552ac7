//! Processes: clone/fork and the stacks they run on, credentials, ids,
//! signals to processes, waiting, namespaces, exit.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr;

use libc::{c_char, c_int, c_uint, c_ulong, c_void};
use nix::errno::Errno;

use super::{SysResult, check, check_long, owned};

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

/// Starts `child(arg)` in a new task that shares this process's memory
/// (`CLONE_VM | SIGCHLD | flags`) on `stack` (its top, 16-byte aligned),
/// and returns at once: the two run side by side (no `CLONE_VFORK`).
///
/// # Safety
/// `child` shares this process's memory and thread-local storage (its
/// `errno` too) while this process goes on: it may touch nothing but its
/// stack and its argument, call only the functions of [`shared_task`], and
/// never return. `stack` must stay borrowed until the task has been reaped.
pub unsafe fn spawn_shared(
    stack: &mut [u8],
    flags: c_int,
    child: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
) -> SysResult<libc::pid_t> {
    let top = (stack.as_mut_ptr().wrapping_add(stack.len()) as usize & !15) as *mut c_void;
    let flags = flags | libc::CLONE_VM | libc::SIGCHLD;
    // SAFETY: per the contract; glibc's clone switches to `top` in the
    // child and calls `child(arg)` there.
    check(unsafe { libc::clone(child, top, flags, arg) })
}

/// The calls a task started by [`spawn_shared`] may make: raw syscalls
/// that cannot fail as made here, so that none writes the `errno` the task
/// shares with this process's thread (the C library's wrappers would on
/// failure).
pub mod shared_task {
    use libc::{c_int, c_long};

    /// `PR_SET_PDEATHSIG(SIGKILL)`: the task dies with its parent.
    pub fn die_with_parent() {
        // SAFETY: integer arguments only; valid for any task.
        unsafe { libc::syscall(libc::SYS_prctl, libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    }

    /// The parent's pid (`getppid`, which cannot fail).
    pub fn parent_pid() -> c_long {
        // SAFETY: no arguments.
        unsafe { libc::syscall(libc::SYS_getppid) }
    }

    /// Blocks until a signal ends the task (`ppoll` with nothing to wait
    /// for and no timeout): only SIGKILL is ever sent to it.
    pub fn block_forever() -> ! {
        loop {
            // SAFETY: no descriptors, no timeout, no mask: nothing is read
            // or written.
            unsafe { libc::syscall(libc::SYS_ppoll, 0usize, 0usize, 0usize, 0usize, 0usize) };
        }
    }

    /// Ends the calling task alone (`exit`, not `exit_group`).
    ///
    /// # Safety
    /// Only in a task started by [`super::spawn_shared`]: its destructors
    /// never run, and the process's other tasks go on.
    pub unsafe fn exit(code: c_int) -> ! {
        // SAFETY: per the contract; `exit` does not return.
        unsafe { libc::syscall(libc::SYS_exit, code) };
        block_forever()
    }
}

/// Sets the file mode creation mask; returns the previous one (nix's
/// wrapper, which allocates nothing; bits beyond `0o7777` are dropped, as
/// the kernel keeps only `0o777`).
pub fn umask(mask: libc::mode_t) -> libc::mode_t {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask)).bits()
}

pub fn chdir(path: &CStr) -> SysResult<()> {
    // SAFETY: valid C string.
    check(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
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

/// Sends `sig` to this process (`raise`).
pub fn raise(sig: c_int) -> SysResult<()> {
    // SAFETY: integer argument only.
    check(unsafe { libc::raise(sig) }).map(drop)
}

/// `pidfd_open(pid, 0)`: a descriptor that pins the process `pid`.
pub fn pidfd_open(pid: libc::pid_t) -> SysResult<OwnedFd> {
    // SAFETY: integer arguments only; the result is a new descriptor.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as c_uint) })
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`; `sig` 0 only checks that the
/// process is alive and may be signalled.
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: c_int) -> SysResult<()> {
    // SAFETY: a valid descriptor, a null siginfo (as `kill` sends), no flags.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            ptr::null::<libc::siginfo_t>(),
            0 as c_uint,
        )
    })
    .map(drop)
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

/// Immediately terminates the process without running destructors or
/// `atexit` handlers (which belong to the parent's copy of the program).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call.
    unsafe { libc::_exit(code) }
}

/// Returns the allocator's free pages to the kernel (glibc's
/// `malloc_trim`; nothing elsewhere). Best effort.
pub fn malloc_trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: glibc's own trimming of its free lists, under its own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

pub fn setns(fd: RawFd, nstype: c_int) -> SysResult<()> {
    // SAFETY: setns with a descriptor number and flags; no memory involved.
    check(unsafe { libc::setns(fd, nstype) }).map(drop)
}

pub fn unshare(flags: c_int) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

/// `prctl` with all five arguments.
pub fn prctl5(option: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> SysResult<c_int> {
    // SAFETY: the options used here take integer arguments only.
    check(unsafe { libc::prctl(option, a2, a3, a4, a5) })
}
