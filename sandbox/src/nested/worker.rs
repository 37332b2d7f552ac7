//! The processes that serve a sandbox's portal.
//!
//! At the first request the launcher forks the **server**, which leaves
//! the host before anything else: its own session, the sandbox's cgroup,
//! the sandbox's namespaces (user, mount, ipc, uts, net when it has its
//! own), the sandbox user's ids, no descriptor but the listening socket,
//! not dumpable. It then forks into the sandbox's pid namespace and stays
//! there as the **acceptor** (the first process only waits, in the host's
//! pid namespace, invisible from the sandbox). The acceptor takes every
//! connection and forks a **worker** for it, which alone reads the request
//! (a new pid namespace can only be made from the pid namespace a process
//! is in: the nested one is a child of the sandbox's, so it shows in the
//! sandbox's /proc and ends with it). Beyond the sandbox's own processes,
//! these hold capabilities in the sandbox's user namespace, which they use
//! only through the runtime's fixed steps; not being dumpable, they cannot
//! be traced or have their /proc entries opened by the sandbox's
//! processes, which lack those capabilities.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::AssertUnwindSafe;

use super::MAX_WORKERS;
use super::plan;
use super::pool;
use super::request::Request;
use super::tally::{Outcome, Tally};
use super::wire::{self, Reply};
use crate::launch::{self, LaunchOptions, Watch};
use crate::prepare::Plan;
use crate::spec::SandboxSpec;
use crate::sys;

/// What every worker of one sandbox needs: the sandbox's description and
/// prepared plan (its seccomp filter, rlimits, cgroup), and its PID 1.
pub(crate) struct Context<'a> {
    pub spec: &'a SandboxSpec,
    pub plan: &'a Plan,
    pub pid1: libc::pid_t,
    /// The nested commands' filter ([`plan::command_filter`]): set by the
    /// server, once.
    pub command_filter: Option<&'a crate::seccomp::Program>,
    /// The caller's counters of how requests end, if it keeps them.
    pub tally: Option<&'a Tally>,
}

impl Context<'_> {
    fn count(&self, outcome: Outcome) {
        if let Some(tally) = self.tally {
            tally.add(outcome);
        }
    }
}

/// The name `/proc/PID/cmdline` shows for the portal's processes.
const PORTAL_NAME: &[u8] = b"tuixiu-sandbox-portal";

/// How long a front end may take to send its request.
const REQUEST_TIMEOUT_SECS: libc::time_t = 10;

/// The server's whole life (a fork of the launcher `monitor`, which keeps
/// the listening socket `listener` to itself again once this ends).
pub(crate) fn server(listener: RawFd, ctx: &Context<'_>, monitor: libc::pid_t) -> ! {
    let code = std::panic::catch_unwind(AssertUnwindSafe(|| serve(listener, ctx, monitor))).unwrap_or(1);
    sys::exit_now(code)
}

fn serve(listener: RawFd, ctx: &Context<'_>, monitor: libc::pid_t) -> i32 {
    if let Err(e) = leave_host(listener, ctx, monitor) {
        // On the launcher's stderr (ours until leave_host replaced it), as
        // the launcher logs; the launcher answers the waiting front ends
        // once it has reaped this process.
        tracing::warn!("nested sandboxes: the portal's server cannot enter the sandbox: {e}");
        return 1;
    }
    let filter = plan::command_filter(ctx.spec, ctx.plan.seccomp.as_ref());
    let ctx = &Context { command_filter: filter.as_ref(), ..*ctx };
    // The pipe's write end is this process's life: the acceptor checks it
    // once its parent-death signal is armed.
    let Ok((life_r, life_w)) = sys::pipe() else { return 1 };
    // SAFETY: single-threaded (a fork of the single-threaded launcher);
    // the child never returns into the caller.
    let child = match unsafe { sys::fork() } {
        Ok(0) => {
            drop(life_w);
            let code = std::panic::catch_unwind(AssertUnwindSafe(|| accept_forever(listener, ctx, life_r)))
                .unwrap_or(1);
            sys::exit_now(code)
        }
        Ok(pid) => pid,
        Err(_) => return 1,
    };
    drop(life_r);
    // SAFETY: the listening socket is the acceptor's now; this process
    // never uses the number again.
    let _ = unsafe { sys::close(listener) };
    loop {
        match sys::waitpid(child, 0) {
            // Killed: by the end of the sandbox's pid namespace, or by a
            // process of the sandbox (the agent's own user may). Either
            // way nothing failed here: the launcher starts a new server at
            // the next connection, and says nothing.
            Ok((_, status)) if libc::WIFSIGNALED(status) => return SERVER_STOPPED,
            Ok((_, status)) => return sys::exit_code_of(status),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 1,
        }
    }
}

/// The server's status when its acceptor was killed (see `serve`).
pub(crate) const SERVER_STOPPED: i32 = 0;

/// Armed parent-death signal, then a check that the parent did not die
/// before it was armed (the write end of `life` is the parent's).
fn die_with_parent(life: OwnedFd) -> bool {
    if sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong).is_err() {
        return false;
    }
    sys::poll_now(life.as_raw_fd(), libc::POLLIN) == Some(0)
}

/// The acceptor, in the sandbox's pid namespace: a worker per connection,
/// at most [`MAX_WORKERS`] at once.
fn accept_forever(listener: RawFd, ctx: &Context<'_>, life: OwnedFd) -> i32 {
    if !die_with_parent(life) {
        return 1;
    }
    let sigchld = sys::sigset_of(&[libc::SIGCHLD]);
    let _ = sys::set_sigmask(libc::SIG_BLOCK, &sigchld);
    let Ok(sfd) = sys::signalfd(&sigchld, libc::SFD_NONBLOCK) else { return 1 };
    // The workers' lifeline: its write end lives as long as this process.
    let Ok((life_r, life_w)) = sys::pipe() else { return 1 };
    let mut workers: Vec<libc::pid_t> = Vec::new();
    loop {
        let mut pfds = [
            libc::pollfd { fd: listener, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: sfd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        if sys::poll(&mut pfds, -1).is_err() {
            continue;
        }
        if pfds[1].revents != 0 {
            let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
            while sys::read(sfd.as_raw_fd(), &mut info).is_ok_and(|n| n > 0) {}
            workers.retain(|&pid| {
                let ended = matches!(sys::waitpid(pid, libc::WNOHANG), Ok((p, _)) if p == pid);
                if ended {
                    // A worker killed before it cleaned up leaves its part
                    // of the pool behind.
                    pool::clean_after(pid);
                }
                !ended
            });
        }
        if pfds[0].revents == 0 {
            continue;
        }
        while let Ok(conn) = sys::accept(listener) {
            if workers.len() >= MAX_WORKERS {
                ctx.count(Outcome::Refused);
                let text = format!("too many nested sandboxes at once (at most {MAX_WORKERS} per sandbox)");
                wire::send_reply(conn.as_fd(), &Reply::Error(text));
                continue;
            }
            // SAFETY: single-threaded; the worker never returns here.
            match unsafe { sys::fork() } {
                Ok(0) => {
                    // SAFETY: the listening socket and the signalfd are
                    // the acceptor's, not the worker's: the worker never
                    // uses this number again.
                    let _ = unsafe { sys::close(listener) };
                    drop(sfd);
                    let _ = sys::set_sigmask(libc::SIG_UNBLOCK, &sigchld);
                    drop(life_w);
                    let code = std::panic::catch_unwind(AssertUnwindSafe(|| serve_one(&conn, ctx, life_r)))
                        .unwrap_or_else(|_| {
                            ctx.count(Outcome::Failed);
                            let text = "internal error: the nested-sandbox worker panicked".to_string();
                            wire::send_reply(conn.as_fd(), &Reply::Error(text));
                            1
                        });
                    sys::exit_now(code)
                }
                Ok(pid) => workers.push(pid),
                // No worker (a limit reached, as `--pids`): refused, as
                // `Outcome` counts it.
                Err(e) => {
                    ctx.count(Outcome::Refused);
                    wire::send_reply(conn.as_fd(), &Reply::Error(format!("fork => {e}")))
                }
            }
        }
    }
}

/// A worker: read, check and run one request.
fn serve_one(conn: &OwnedFd, ctx: &Context<'_>, life: OwnedFd) -> i32 {
    let fail = |text: String| {
        ctx.count(Outcome::Refused);
        wire::send_reply(conn.as_fd(), &Reply::Error(text));
        1
    };
    // Gone with the acceptor (and so with the launcher).
    if !die_with_parent(life) {
        return 1;
    }
    let timeout = libc::timeval { tv_sec: REQUEST_TIMEOUT_SECS, tv_usec: 0 };
    if let Err(e) =
        nix::sys::socket::setsockopt(conn, nix::sys::socket::sockopt::ReceiveTimeout, &timeout.into())
    {
        return fail(format!("setsockopt(SO_RCVTIMEO) => {e}"));
    }
    let (body, fds) = match wire::recv_request(conn.as_fd()) {
        Ok(received) => received,
        Err(e) => return fail(e.to_string()),
    };
    let request: Request = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return fail(format!("invalid request: {e}")),
    };
    drop(body);
    let mut dir = match pool::WorkerDir::make() {
        Ok(dir) => dir,
        Err(e) => return fail(format!("the nested sandboxes' tmpfs pool: {e}")),
    };
    let mut nested = match plan::prepare(
        &request,
        fds,
        conn.as_raw_fd(),
        ctx.spec,
        (ctx.plan, ctx.command_filter),
        &dir.path(),
    ) {
        Ok(plan) => plan,
        Err(e) => return fail(e.to_string()),
    };
    if let Err(e) = dir.reserve(plan::reserved_tmpfs(&request, ctx.spec)) {
        return fail(e);
    }
    // bubblewrap's reports go to the caller's status descriptors, which
    // this worker keeps (COMMAND does not get them).
    let status = status_fds(&request, &mut nested);
    // The nested PID 1 restores this one for COMMAND.
    sys::umask(request.umask as libc::mode_t);
    // Until PID 1 has gone, with its mounts: what they held in the pool is
    // free again when the caller learns the status.
    let options = LaunchOptions { bwrap_status: status, ..LaunchOptions::default() };
    let outcome = launch::execute(&nested, &options, None, Watch::Caller(conn.as_raw_fd()));
    drop(dir);
    match outcome {
        Ok(status) => {
            ctx.count(Outcome::Started);
            wire::send_reply(conn.as_fd(), &Reply::Exit(status.code()));
            0
        }
        Err(e) => {
            ctx.count(Outcome::Failed);
            wire::send_reply(
                conn.as_fd(),
                &Reply::Error(super::host::bwrap_message(e, &nested.exec.program)),
            );
            1
        }
    }
}

/// `--info-fd`, `--json-status-fd`, `--userns-block-fd` of the request:
/// taken out of what COMMAND gets (bubblewrap consumes them: a caller
/// reading one to its end must not wait for COMMAND) and kept by this
/// worker, on which `launch` writes (and closes the first and the last, as
/// bubblewrap's monitor does); `None` without any.
fn status_fds(request: &Request, nested: &mut Plan) -> Option<launch::BwrapStatus> {
    let named = [request.info_fd, request.json_status_fd, request.userns_block_fd];
    if named.iter().all(Option::is_none) {
        return None;
    }
    let targets = &mut nested.nested.as_mut()?.fds;
    let mut take = |fd: Option<i32>| {
        let at = targets.iter().position(|(target, _)| Some(*target) == fd)?;
        let source = targets.remove(at).1;
        // Moved below the plan's numbers, which the nested PID 1 keeps (it
        // closes everything under them): a copy there would hold the
        // caller's pipe open for the nested sandbox's life. Held until this
        // worker exits (the status lines are the last it writes).
        // SAFETY: the plan's raw copy, taken out of it: ours alone.
        let source = unsafe { OwnedFd::from_raw_fd(source) };
        Some(match sys::dup_cloexec(source.as_raw_fd(), 3) {
            Ok(low) => std::os::fd::IntoRawFd::into_raw_fd(low),
            Err(_) => std::os::fd::IntoRawFd::into_raw_fd(source),
        })
    };
    Some(launch::BwrapStatus {
        info_fd: take(request.info_fd),
        json_status_fd: take(request.json_status_fd),
        userns_block_fd: take(request.userns_block_fd),
        userns2_fd: None,
    })
}

/// Everything the worker gives up before it reads the request.
fn leave_host(listener: RawFd, ctx: &Context<'_>, monitor: libc::pid_t) -> Result<(), String> {
    // This process and every one it forks (down to the helper that makes
    // a nested sandbox's user namespace, dumpable: child.rs) are copies of the
    // launcher's memory: the caller's whole environment goes first (found
    // through the host's /proc, before the sandbox's mount namespace hides
    // this process's pid), and its arguments, which the sandbox's
    // processes may read in /proc/PID/cmdline (bind sources, `--env`
    // values, the workspace's host path).
    crate::confine::forget_inherited(Some(PORTAL_NAME));
    crate::confine::trim_heap();
    // Not in the launcher's session or process group (the caller's
    // terminal), and gone with the launcher.
    let _ = sys::setsid();
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG) => {e}"))?;
    if nix::unistd::getppid().as_raw() != monitor {
        sys::exit_now(1);
    }
    // Counted with the sandbox, under its limits; written while the host's
    // cgroup tree is still reachable.
    if let Some(cgroup) = &ctx.plan.limits.cgroup {
        let procs = cgroup.dir.join("cgroup.procs");
        std::fs::write(&procs, "0").map_err(|e| format!("write(\"{}\", \"0\") => {e}", procs.display()))?;
    }
    crate::join::enter(ctx.pid1, true).map_err(|e| e.to_string())?;
    let user = &ctx.spec.user;
    sys::setresgid(user.gid).map_err(|e| format!("setresgid({}) => {e}", user.gid))?;
    sys::setresuid(user.uid).map_err(|e| format!("setresuid({}) => {e}", user.uid))?;
    // A mount namespace of the portal's own: the nested sandboxes' tmpfs
    // pool where the portal's socket was (pool.rs), made as the sandbox
    // user (the launcher's own ids may not be mapped in the sandbox).
    let budget = ctx.spec.security.limits.tmpfs_size.unwrap_or(crate::limits::DEFAULT_TMPFS_SIZE);
    pool::make(budget).map_err(|e| format!("the nested sandboxes' tmpfs pool: {e}"))?;
    // `--pids` without a cgroup is RLIMIT_NPROC, counted per user in each
    // user namespace and checked, for a namespace's processes, against the
    // limit its creator had: set here, before anything below makes one,
    // every process of every nested sandbox counts against the sandbox's
    // limit (docs/security.md).
    for &(resource, value) in &ctx.plan.limits.rlimits {
        if resource == libc::RLIMIT_NPROC as libc::c_int {
            sys::setrlimit(resource, value)
                .map_err(|e| format!("setrlimit(RLIMIT_NPROC, {value}) => {e}"))?;
        }
    }
    // Nothing of the launcher's: its pipes, its signalfd, its stdio (the
    // caller's terminal) are not the nested sandbox's business.
    sys::close_all_except(&[listener], libc::c_uint::MAX).map_err(|e| format!("close_range => {e}"))?;
    let null = sys::open(c"/dev/null", libc::O_RDWR, 0).map_err(|e| format!("open(\"/dev/null\") => {e}"))?;
    for fd in 0..3 {
        sys::dup2(null.as_raw_fd(), fd).map_err(|e| format!("dup2 => {e}"))?;
    }
    drop(null);
    // Holding capabilities in the sandbox's user namespace: no ptrace or
    // /proc access from there, and no core dump.
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(|e| format!("prctl(PR_SET_DUMPABLE) => {e}"))?;
    Ok(())
}
