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

/// First byte on the exit pipe: PID 1 is starting the command. The
/// command's wait status follows when it ends.
pub(crate) const EXIT_STARTING: u8 = b'S';

extern "C" fn relay(sig: libc::c_int) {
    // Async-signal-safe: an atomic load and kill(2).
    let pid = COMMAND_PID.load(Ordering::Relaxed);
    if pid > 0 {
        let _ = sys::kill(pid, sig);
    }
}

/// The reaper's loop, under `filter` (installed here, once everything else
/// it needs is set up: from then on it may only wait, signal, write its
/// status and exit).
pub(crate) fn reap(command: libc::pid_t, exit_fd: libc::c_int, filter: &[libc::sock_filter]) -> ! {
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
    if let Err(e) = sys::seccomp_set_filter(filter) {
        // The command already runs; it must not run beside an unconfined
        // PID 1. Stop it, say why on the caller's stderr, and fail.
        let _ = sys::kill(-1, libc::SIGKILL);
        let mut report = crate::report::Report::new();
        let _ = std::fmt::Write::write_fmt(
            &mut report,
            format_args!(
                "tuixiu-sandbox: confine the sandbox's PID 1: seccomp(SECCOMP_SET_MODE_FILTER) => {}; the command was stopped\n",
                crate::error::ErrnoText(e)
            ),
        );
        let _ = sys::write_all(2, report.text());
        while sys::waitpid(-1, 0).is_ok() {}
        sys::exit_now(crate::error::EXIT_SETUP_FAILED as i32);
    }
    // Signals blocked since before clone are delivered now, to `relay`.
    let _ = sys::set_sigmask(libc::SIG_SETMASK, &sys::empty_sigset());
    loop {
        match sys::waitpid(-1, 0) {
            Ok((pid, status)) if pid == command => finish(status, exit_fd),
            Ok(_) => {}
            Err(Errno::ECHILD) => sys::exit_now(crate::error::EXIT_SETUP_FAILED as i32),
            Err(_) => {}
        }
    }
}

/// The command has ended: end everything it left behind, tell the launcher
/// its status, and exit with it.
///
/// The kernel would kill the rest of the namespace when we exit, but only
/// after tearing down our namespaces and mounts, and the launcher would
/// learn the status only then. Killing and reaping here first means that
/// once the launcher has the status, no process of the sandbox runs any
/// more; what is left is the kernel's cleanup of this process, which the
/// launcher need not wait for (bubblewrap's monitor does not either).
fn finish(status: libc::c_int, exit_fd: libc::c_int) -> ! {
    // kill(-1) reaches every process of our pid namespace but ourselves
    // (they all run as our user, without capabilities); orphans are our
    // children, so waiting until ECHILD means they are all gone.
    let _ = sys::kill(-1, libc::SIGKILL);
    while sys::waitpid(-1, 0).is_ok() {}
    let _ = sys::write_all(exit_fd, &status.to_ne_bytes());
    sys::exit_now(sys::exit_code_of(status))
}
