//! Process descriptors (`pidfd_open`, `pidfd_send_signal`, exit by
//! readability): the one helper the providers, the ACP host and skill
//! jobs use to refer to a process without racing pid reuse.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// A pidfd of `pid`; `None` when the process is gone (or pidfds are
/// unavailable).
pub fn open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just gave us this descriptor; dropping closes it.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` to the process of `fd` (no siginfo, no flags).
pub fn send_signal(fd: &OwnedFd, signal: i32) -> std::io::Result<()> {
    // SAFETY: a valid pidfd, a null siginfo (the kernel fills in the
    // sender's), no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Whether the process of `fd` has exited (a pidfd is readable then).
pub fn has_exited(fd: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd; a zero timeout never blocks.
    unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
}

/// Whether the process of `fd` exits before `deadline`. Checked every
/// 20 ms rather than registered with the reactor, so this also works
/// outside the daemon's runtime.
pub async fn exited_by(fd: &OwnedFd, deadline: tokio::time::Instant) -> bool {
    loop {
        if has_exited(fd) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
