//! PID 1 of the sandbox: a reaper that relays signals to the command.
//!
//! The kernel drops signals sent to a pid namespace's init from outside
//! unless init has a handler, so the launcher's forwarded signals only
//! arrive here because we install one. Each is passed on to the command.
//! Orphans re-parented to us are reaped. When the command exits we exit
//! with its status (128+signal if it was killed), and the kernel then kills
//! whatever is left in the namespace.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::errno::Errno;

use crate::sys;

/// Signals relayed from the launcher to the command.
pub const FORWARDED_SIGNALS: [libc::c_int; 6] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2];

static COMMAND_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn relay(sig: libc::c_int) {
    // Async-signal-safe: an atomic load and kill(2).
    let pid = COMMAND_PID.load(Ordering::Relaxed);
    if pid > 0 {
        let _ = sys::kill(pid, sig);
    }
}

pub(crate) fn reap(command: libc::pid_t) -> ! {
    COMMAND_PID.store(command, Ordering::Relaxed);
    // Nothing in here reads stdin or writes stdout; holding them would keep
    // a pipe open after the command closed its end.
    if let Ok(null) = sys::open(c"/dev/null", libc::O_RDWR, 0) {
        use std::os::fd::AsRawFd;
        let _ = sys::dup2(null.as_raw_fd(), 0);
        let _ = sys::dup2(null.as_raw_fd(), 1);
    }
    for sig in FORWARDED_SIGNALS {
        let _ = sys::set_signal_handler(sig, relay);
    }
    // Signals blocked since before clone are delivered now, to `relay`.
    let _ = sys::set_sigmask(libc::SIG_SETMASK, &sys::empty_sigset());
    loop {
        match sys::waitpid(-1, 0) {
            Ok((pid, status)) if pid == command => sys::exit_now(sys::exit_code_of(status)),
            Ok(_) => {}
            Err(Errno::ECHILD) => sys::exit_now(crate::error::EXIT_SETUP_FAILED as i32),
            Err(_) => {}
        }
    }
}
