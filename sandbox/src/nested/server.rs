//! The launcher's side of the portal: it accepts on the listening socket
//! from its poll loop and forks one worker process per connection, so a
//! nested sandbox never holds up the loop (or another nested sandbox).

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

use super::wire::{Reply, send_reply};
use super::{Context, MAX_WORKERS, worker};
use crate::launch::Portal;
use crate::prepare::Plan;
use crate::spec::SandboxSpec;
use crate::sys;

pub(crate) struct Server<'a> {
    listener: RawFd,
    spec: &'a SandboxSpec,
    plan: &'a Plan,
    workers: Vec<libc::pid_t>,
}

impl<'a> Server<'a> {
    /// Serves `listener` for the sandbox of `spec`, prepared as `plan`.
    pub(crate) fn new(listener: &'a OwnedFd, spec: &'a SandboxSpec, plan: &'a Plan) -> Self {
        Server { listener: listener.as_raw_fd(), spec, plan, workers: Vec::new() }
    }
}

impl Portal for Server<'_> {
    fn fd(&self) -> RawFd {
        self.listener
    }

    /// Takes every pending connection: a worker each, or a refusal when
    /// [`MAX_WORKERS`] are busy.
    fn accept(&mut self, pid1: libc::pid_t) {
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
            let ctx = Context { spec: self.spec, plan: self.plan, pid1 };
            // SAFETY: the launcher is single-threaded (checked before the
            // sandbox started); the worker never returns: it `_exit`s.
            match unsafe { sys::fork() } {
                Ok(0) => worker::main(conn, &ctx, monitor),
                Ok(pid) => self.workers.push(pid),
                Err(e) => send_reply(conn.as_fd(), &Reply::Error(format!("fork => {e}"))),
            }
        }
    }

    /// Reaps the workers that have ended.
    fn reap(&mut self) {
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
