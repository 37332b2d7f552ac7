//! The launcher's side of the portal. The launcher serves no request
//! itself: at the first connection it forks the portal's server (see
//! `worker`), which leaves the host and accepts every connection from then
//! on, in the sandbox's namespaces; the launcher stops watching the socket
//! until that server ends. A server lives as long as the sandbox, so one
//! that ends before failed (it could not enter the sandbox, say): the
//! launcher then answers the connections waiting for it with an error,
//! rather than fork servers for them in a loop, and the connection after
//! those starts a new server.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use super::tally::{Outcome, Tally};
use super::wire::{self, Reply};
use super::{Context, worker};
use crate::launch::Portal;
use crate::prepare::Plan;
use crate::spec::SandboxSpec;
use crate::sys;

pub(crate) struct Server<'a> {
    listener: RawFd,
    spec: &'a SandboxSpec,
    plan: &'a Plan,
    /// The portal's server process, while it runs.
    server: Option<libc::pid_t>,
    /// The last server ended early: refuse the connections waiting now.
    failed: bool,
    /// The caller's counters: the descriptor until the first connection
    /// maps it, then the mapping (the servers' copies of this process).
    counts_fd: Option<RawFd>,
    tally: Option<Tally>,
}

impl<'a> Server<'a> {
    /// Serves `listener` for the sandbox of `spec`, prepared as `plan`.
    pub(crate) fn new(
        listener: &'a OwnedFd,
        spec: &'a SandboxSpec,
        plan: &'a Plan,
        counts_fd: Option<RawFd>,
    ) -> Self {
        Server {
            listener: listener.as_raw_fd(),
            spec,
            plan,
            server: None,
            failed: false,
            counts_fd,
            tally: None,
        }
    }

    /// The caller's counters, mapped at the first connection: none are
    /// mapped in the sandbox's PID 1 (cloned before) and a sandbox that
    /// never nests maps nothing. Not counting is only a warning: the
    /// counters are for metrics, the sandbox is the same without them.
    fn map_counts(&mut self) {
        if let Some(fd) = self.counts_fd.take() {
            // SAFETY: the caller gave this descriptor for the counters and
            // keeps it open while the sandbox runs.
            match Tally::map(unsafe { BorrowedFd::borrow_raw(fd) }) {
                Ok(tally) => self.tally = Some(tally),
                Err(e) => tracing::warn!("nested sandboxes are not counted: {e}"),
            }
        }
    }
}

impl Portal for Server<'_> {
    fn fd(&self) -> RawFd {
        if self.server.is_some() { -1 } else { self.listener }
    }

    fn accept(&mut self, pid1: libc::pid_t) {
        self.map_counts();
        if std::mem::take(&mut self.failed) {
            // The listening socket is non-blocking: this takes what waits.
            while let Ok(conn) = sys::accept(self.listener) {
                if let Some(tally) = &self.tally {
                    tally.add(Outcome::Refused);
                }
                let text = "the nested-sandbox server could not start in this sandbox (the launcher's \
                            stderr says why)";
                wire::send_reply(conn.as_fd(), &Reply::Error(text.into()));
            }
            return;
        }
        let monitor = nix::unistd::getpid().as_raw();
        let ctx = Context {
            spec: self.spec,
            plan: self.plan,
            pid1,
            tally: self.tally.as_ref(),
            command_filter: None,
        };
        // SAFETY: the launcher is single-threaded (checked before the
        // sandbox started); the server never returns: it `_exit`s.
        match unsafe { sys::fork() } {
            Ok(0) => worker::server(self.listener, &ctx, monitor),
            Ok(pid) => self.server = Some(pid),
            // The connection waits in the backlog; the next wake-up retries.
            Err(e) => tracing::warn!("nested sandboxes: cannot start the portal's server: fork => {e}"),
        }
    }

    fn reap(&mut self) {
        if let Some(pid) = self.server
            && let Ok((p, status)) = sys::waitpid(pid, libc::WNOHANG)
            && p == pid
        {
            self.server = None;
            let code = sys::exit_code_of(status);
            // Its acceptor was killed (the sandbox is ending, or the agent
            // killed it): the next connection gets a new server.
            if code == worker::SERVER_STOPPED {
                return;
            }
            self.failed = true;
            tracing::warn!(
                "nested sandboxes: the portal's server ended (status {code}); the waiting requests are refused"
            );
        }
    }
}

impl Drop for Server<'_> {
    /// The sandbox has ended, and its nested sandboxes with it (they live in
    /// its pid namespace); the portal's server goes too.
    fn drop(&mut self) {
        if let Some(pid) = self.server {
            let _ = sys::kill(pid, libc::SIGKILL);
            let _ = sys::waitpid(pid, 0);
        }
    }
}
