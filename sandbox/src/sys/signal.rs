//! Signal dispositions, masks and sets, waiting for signals, signalfd.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr;

use libc::{c_int, c_long};
use nix::errno::Errno;

use super::{SysResult, check, owned};

/// Sets `sig` to its default disposition.
pub fn reset_signal(sig: c_int) {
    // SAFETY: sigaction is plain data; all-zero is SIG_DFL with no flags
    // and an empty mask.
    let sa: libc::sigaction = unsafe { std::mem::zeroed() };
    debug_assert_eq!(sa.sa_sigaction, libc::SIG_DFL);
    // SAFETY: a valid sigaction; errors (for SIGKILL, SIGSTOP and the
    // reserved realtime signals) are expected and ignored.
    unsafe { libc::sigaction(sig, &sa, ptr::null_mut()) };
}

/// Installs `handler` for `sig` with `SA_RESTART`.
pub fn set_signal_handler(sig: c_int, handler: extern "C" fn(c_int)) -> SysResult<()> {
    // SAFETY: sigaction is plain data, for which all-zero is valid; the
    // fields that matter are set below.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler as usize;
    sa.sa_flags = libc::SA_RESTART;
    sa.sa_mask = empty_sigset();
    // SAFETY: the handler is an `extern "C" fn(c_int)` that only performs
    // async-signal-safe work; the sigaction struct is fully initialized.
    check(unsafe { libc::sigaction(sig, &sa, ptr::null_mut()) }).map(drop)
}

/// Replaces the signal mask; returns the previous one.
pub fn set_sigmask(how: c_int, set: &libc::sigset_t) -> SysResult<libc::sigset_t> {
    let mut old = empty_sigset();
    // SAFETY: both pointers refer to valid sigset_t values.
    check(unsafe { libc::sigprocmask(how, set, &mut old) })?;
    Ok(old)
}

pub fn sigset_of(signals: &[c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initializes it below.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    for &s in signals {
        // SAFETY: as above; an invalid number is refused (EINVAL), not written.
        unsafe { libc::sigaddset(&mut set, s) };
    }
    set
}

pub fn empty_sigset() -> libc::sigset_t {
    sigset_of(&[])
}

/// `sigwaitinfo(set, NULL)`: waits for one of the signals in `set` (which
/// the caller blocks) and returns its number.
pub fn sigwait(set: &libc::sigset_t) -> SysResult<c_int> {
    // SAFETY: a valid sigset; a null siginfo pointer is allowed.
    check(unsafe { libc::sigwaitinfo(set, ptr::null_mut()) })
}

/// A signalfd for the signals in `mask` (which the caller blocks), with
/// `flags` (`SFD_*`; close-on-exec always).
pub fn signalfd(mask: &libc::sigset_t, flags: c_int) -> SysResult<OwnedFd> {
    // SAFETY: a valid sigset; -1 asks for a new descriptor.
    owned(unsafe { libc::signalfd(-1, mask, flags | libc::SFD_CLOEXEC) } as c_long)
}

/// Reads one signal from a signalfd; `None` on a short read.
pub fn read_signal(sfd: BorrowedFd<'_>) -> SysResult<Option<libc::signalfd_siginfo>> {
    // SAFETY: signalfd_siginfo is plain data, for which all-zero is valid.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: `info` is valid for `size` bytes.
    let n = unsafe { libc::read(sfd.as_raw_fd(), (&mut info as *mut libc::signalfd_siginfo).cast(), size) };
    if n < 0 {
        return Err(Errno::last());
    }
    Ok((n as usize == size).then_some(info))
}
