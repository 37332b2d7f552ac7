//! Running a helper process (the docker CLI) in the foreground of `run`:
//! the caller's stdio passes straight through, and signals sent to us are
//! relayed, the way the native launcher relays them to its sandbox.

use std::process::{Child, Command, ExitStatus};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// The signals relayed to the command (as the native launcher's).
const RELAYED: [Signal; 6] =
    [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGUSR1, Signal::SIGUSR2];

/// A signal that reached `run`: `from_terminal` is true when the kernel
/// generated it for the terminal's foreground group (^C), which the child,
/// being in that group too, received as well.
pub struct Received {
    pub signal: i32,
    pub from_terminal: bool,
}

/// Spawns `cmd` and waits for it. While it runs, every relayed signal is
/// handed to `on_signal` with the child. The child starts with an empty
/// signal mask (std resets it), whatever ours is.
pub fn run(mut cmd: Command, mut on_signal: impl FnMut(&Child, Received)) -> std::io::Result<ExitStatus> {
    let mut mask = SigSet::empty();
    for sig in RELAYED {
        mask.add(sig);
    }
    mask.add(Signal::SIGCHLD);
    // Blocked before the spawn, so a signal (or the child's exit) arriving
    // at any moment waits in the signalfd instead of killing us.
    let old = mask.thread_swap_mask(SigmaskHow::SIG_BLOCK).map_err(std::io::Error::from)?;
    let outcome = (|| {
        let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).map_err(std::io::Error::from)?;
        let mut child = cmd.spawn()?;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            let info = match sfd.read_signal() {
                Ok(Some(info)) => info,
                Ok(None) | Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            let signal = info.ssi_signo as i32;
            if signal != libc::SIGCHLD {
                on_signal(&child, Received { signal, from_terminal: info.ssi_code == libc::SI_KERNEL });
            }
        }
    })();
    let _ = old.thread_set_mask();
    outcome
}

/// Sends `signal` to `child`, which has not been reaped yet (so its pid
/// cannot have been reused).
pub fn signal_child(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own unreaped child.
    unsafe {
        libc::kill(child.id() as i32, signal);
    }
}
