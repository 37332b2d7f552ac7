//! One nested sandbox, served by a process the launcher forks per request.
//!
//! Before it reads a byte of the request, the worker leaves the host: its
//! own session, the sandbox's cgroup, the sandbox's namespaces (user,
//! mount, ipc, uts, net when it has its own), the sandbox user's ids, and
//! no descriptor but the connection; then it forks into the sandbox's pid
//! namespace, and only that child reads the request. What the child has
//! beyond the sandbox's own processes are the capabilities it holds in the
//! sandbox's user namespace, which it uses only through the runtime's
//! fixed steps (it is not dumpable, so the sandbox's processes, which lack
//! them, cannot trace it or open its /proc entries).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;

use super::plan;
use super::request::Request;
use super::wire::{self, Reply};
use crate::error::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, LaunchError};
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
}

/// How long a front end may take to send its request.
const REQUEST_TIMEOUT_SECS: libc::time_t = 10;

/// The worker's whole life; never returns.
pub(crate) fn main(conn: OwnedFd, ctx: &Context<'_>, monitor: libc::pid_t) -> ! {
    let code = std::panic::catch_unwind(AssertUnwindSafe(|| serve(conn, ctx, monitor))).unwrap_or(1);
    sys::exit_now(code)
}

fn serve(conn: OwnedFd, ctx: &Context<'_>, monitor: libc::pid_t) -> i32 {
    let fail = |conn: &OwnedFd, text: String| {
        wire::send_reply(conn.as_fd(), &Reply::Error(text));
        1
    };
    if let Err(e) = leave_host(&conn, ctx, monitor) {
        return fail(&conn, format!("cannot serve nested sandboxes: {e}"));
    }
    // A new pid namespace can only be made from the pid namespace a process
    // is in: the rest is done by a child, in the sandbox's pid namespace,
    // so that the nested one is the sandbox's child (it sees the nested
    // processes in its /proc, and they end with it). This process stays
    // outside, invisible from the sandbox, and waits.
    // The pipe's write end is this process's life: the child checks it once
    // its parent-death signal is armed.
    let (life_r, life_w) = match sys::pipe() {
        Ok(pipe) => pipe,
        Err(e) => return fail(&conn, format!("cannot serve nested sandboxes: pipe2 => {e}")),
    };
    // SAFETY: single-threaded (a fork of the single-threaded launcher);
    // the child never returns into the caller.
    let child = match unsafe { sys::fork() } {
        Ok(0) => {
            drop(life_w);
            let code = std::panic::catch_unwind(AssertUnwindSafe(|| serve_inside(&conn, ctx, life_r)))
                .unwrap_or_else(|_| fail(&conn, "internal error: the nested-sandbox worker panicked".into()));
            sys::exit_now(code)
        }
        Ok(pid) => pid,
        Err(e) => return fail(&conn, format!("cannot serve nested sandboxes: fork => {e}")),
    };
    // The front end must see end-of-file when the child is done.
    drop(conn);
    drop(life_r);
    loop {
        match sys::waitpid(child, 0) {
            Ok((_, status)) => return sys::exit_code_of(status),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 1,
        }
    }
}

/// In the sandbox's pid namespace: read, check and run the request.
fn serve_inside(conn: &OwnedFd, ctx: &Context<'_>, life: OwnedFd) -> i32 {
    let fail = |text: String| {
        wire::send_reply(conn.as_fd(), &Reply::Error(text));
        1
    };
    // Gone with the outer worker (and so with the launcher).
    if let Err(e) = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) {
        return fail(format!("cannot serve nested sandboxes: prctl(PR_SET_PDEATHSIG) => {e}"));
    }
    let mut pfd = libc::pollfd { fd: life.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    if unsafe { libc::poll(&mut pfd, 1, 0) } != 0 {
        return 1;
    }
    drop(life);
    let (body, fds) = match wire::recv_request(conn.as_fd()) {
        Ok(received) => received,
        Err(e) => return fail(e.to_string()),
    };
    let request: Request = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return fail(format!("invalid request: {e}")),
    };
    drop(body);
    let nested = match plan::prepare(&request, fds, conn.as_raw_fd(), ctx.spec, ctx.plan) {
        Ok(plan) => plan,
        Err(e) => return fail(e.to_string()),
    };
    // SAFETY: umask cannot fail; the nested PID 1 restores this one for COMMAND.
    unsafe { libc::umask(request.umask as libc::mode_t) };
    let options = LaunchOptions { return_before_teardown: true, ..LaunchOptions::default() };
    match launch::execute(&nested, &options, None, Watch::Caller(conn.as_raw_fd())) {
        Ok(status) => {
            wire::send_reply(conn.as_fd(), &Reply::Exit(status.code()));
            0
        }
        // bubblewrap's words for a command that cannot be executed.
        Err(LaunchError::Child { code: EXIT_NOT_FOUND, .. }) => {
            fail(format!("execvp {}: {}", nested.exec.program, crate::error::strerror(libc::ENOENT)))
        }
        Err(LaunchError::Child { code: EXIT_CANNOT_EXECUTE, message }) => {
            let why = if message.contains("EACCES") { crate::error::strerror(libc::EACCES) } else { message };
            fail(format!("execvp {}: {why}", nested.exec.program))
        }
        Err(e) => fail(e.to_string()),
    }
}

/// Everything the worker gives up before it reads the request.
fn leave_host(conn: &OwnedFd, ctx: &Context<'_>, monitor: libc::pid_t) -> Result<(), String> {
    // Not in the launcher's session or process group (the caller's
    // terminal), and gone with the launcher.
    let _ = sys::setsid();
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG) => {e}"))?;
    // SAFETY: getppid cannot fail.
    if unsafe { libc::getppid() } != monitor {
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
    // Nothing of the launcher's: its pipes, its signalfd, its stdio (the
    // caller's terminal) are not the nested sandbox's business.
    sys::close_all_except(&[conn.as_raw_fd()], libc::c_uint::MAX)
        .map_err(|e| format!("close_range => {e}"))?;
    let null = sys::open(c"/dev/null", libc::O_RDWR, 0).map_err(|e| format!("open(\"/dev/null\") => {e}"))?;
    for fd in 0..3 {
        sys::dup2(null.as_raw_fd(), fd).map_err(|e| format!("dup2 => {e}"))?;
    }
    drop(null);
    // Holding capabilities in the sandbox's user namespace: no ptrace or
    // /proc access from there, and no core dump.
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(|e| format!("prctl(PR_SET_DUMPABLE) => {e}"))?;
    let timeout = libc::timeval { tv_sec: REQUEST_TIMEOUT_SECS, tv_usec: 0 };
    nix::sys::socket::setsockopt(conn, nix::sys::socket::sockopt::ReceiveTimeout, &timeout.into())
        .map_err(|e| format!("setsockopt(SO_RCVTIMEO) => {e}"))?;
    Ok(())
}
