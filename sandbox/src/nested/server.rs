//! The launcher's side of the portal: it accepts on the listening socket
//! from its poll loop and forks one worker process per connection, so a
//! nested sandbox never holds up the loop (or another nested sandbox).

use std::os::fd::{AsFd, OwnedFd, RawFd};

use nix::errno::Errno;

use super::wire::{Reply, send_reply};
use super::{Context, MAX_WORKERS, worker};
use crate::sys;

pub(crate) struct Server<'a> {
    listener: RawFd,
    ctx: Context<'a>,
    workers: Vec<libc::pid_t>,
}

impl<'a> Server<'a> {
    pub(crate) fn new(listener: RawFd, ctx: Context<'a>) -> Self {
        Server { listener, ctx, workers: Vec::new() }
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.listener
    }

    /// Takes every pending connection: a worker each, or a refusal when
    /// [`MAX_WORKERS`] are busy.
    pub(crate) fn accept(&mut self) {
        loop {
            let conn: OwnedFd = match sys::accept(self.listener) {
                Ok(conn) => conn,
                Err(Errno::EINTR | Errno::ECONNABORTED) => continue,
                Err(_) => return,
            };
            if self.workers.len() >= MAX_WORKERS {
                let text = format!("too many nested sandboxes at once (at most {MAX_WORKERS} per sandbox)");
                send_reply(conn.as_fd(), &Reply::Error(text));
                continue;
            }
            // SAFETY: getpid cannot fail.
            let monitor = unsafe { libc::getpid() };
            // SAFETY: the launcher is single-threaded (checked before the
            // sandbox started); the worker never returns: it `_exit`s.
            match unsafe { sys::fork() } {
                Ok(0) => worker::main(conn, &self.ctx, monitor),
                Ok(pid) => self.workers.push(pid),
                Err(e) => send_reply(conn.as_fd(), &Reply::Error(format!("fork => {e}"))),
            }
        }
    }

    /// Reaps the workers that have ended (on SIGCHLD).
    pub(crate) fn reap(&mut self) {
        self.workers.retain(|&pid| !matches!(sys::waitpid(pid, libc::WNOHANG), Ok((p, _)) if p == pid));
    }
}

impl Drop for Server<'_> {
    /// The sandbox has ended, and its nested sandboxes with it (they live in
    /// its pid namespace); their workers go too.
    fn drop(&mut self) {
        for &pid in &self.workers {
            let _ = sys::kill(pid, libc::SIGKILL);
            let _ = sys::waitpid(pid, 0);
        }
    }
}
