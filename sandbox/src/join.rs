//! Joining a running sandbox: a new process in the namespaces of the
//! sandbox's PID 1 (user, mount, pid, ipc, uts, and net when it has its
//! own), so it shares the agent's mount tree, `/tmp` and process tree,
//! with the same user view and the same hardening as a launched command.
//!
//! ```text
//! joiner (caller's namespaces, single-threaded)
//!  │  prepare (argv/envp, PATH candidates, seccomp, Landlock: all allocation)
//!  │  pidfd_open(PID 1, or the command for an unprivileged owner: reach.rs);
//!  │  setns(pidfd, USER|MNT|IPC|UTS|PID[|NET]) at once
//!  │    (one call: the pid namespace is checked with the sandbox user's
//!  │    capabilities, which an unprivileged caller has only there)
//!  │  fork ─▶ child (in the sandbox's pid namespace)
//!  │          setresgid/uid, PDEATHSIG + lifeline, chdir (or fchdir to
//!  │          the directory descriptor the caller resolved)
//!  │          no_new_privs, no capabilities, setsid, rlimits,
//!  │          close_range, Landlock, seccomp, execve
//!  │  report pipe: a record = failure (125/126/127); EOF = exec happened
//!  │  signals relayed to the child's process group
//!  └─ waitpid → the child's code; killed by N → the joiner re-raises N
//! ```
//!
//! The caller must own the sandbox's user namespace (it launched it), or
//! be root: only then may it enter it.

use std::ffi::CString;
use std::fmt::Write as _;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use nix::errno::Errno;

use crate::child::{Hardening, drop_privileges, harden_and_exec};
use crate::error::{ErrnoText, LaunchError, SpecError, SyscallError};
use crate::init::FORWARDED_SIGNALS;
use crate::prepare::ExecPlan;
use crate::report::{self, Report};
use crate::spec::SandboxSpec;
use crate::sys;

/// Where a joined process starts.
enum Cwd<'a> {
    /// The spec's working directory, by path.
    Path(CString),
    /// A directory descriptor the caller resolved inside the sandbox's view
    /// (an `O_PATH` one does), entered with `fchdir`: nothing in the
    /// sandbox can redirect it between the caller's check and the start.
    /// The spec's path names it in errors.
    Dir(BorrowedFd<'a>, CString),
}

/// What a joined process needs, computed before any namespace changes.
struct JoinPlan<'a> {
    uid: u32,
    gid: u32,
    cwd: Cwd<'a>,
    new_session: bool,
    exec: ExecPlan,
    seccomp: Option<crate::seccomp::Program>,
    landlock: Option<crate::landlock::Plan>,
    rlimits: Vec<(libc::c_int, u64)>,
}

fn prepare<'a>(spec: &SandboxSpec, cwd_dir: Option<BorrowedFd<'a>>) -> Result<JoinPlan<'a>, SpecError> {
    spec.user.validate()?;
    let limits = &spec.security.limits;
    if limits.memory.is_some() || limits.cpu_millis.is_some() || limits.pids.is_some() {
        return Err(SpecError::new(
            "memory, cpu and pids limits belong to the whole sandbox (its cgroup); a joined process cannot set its own",
        ));
    }
    let cwd = crate::guest_path::normalize(&spec.cwd)
        .map_err(|why| SpecError::new(format!("working directory {:?} {why}", spec.cwd)))?;
    let security = &spec.security;
    let sockets = spec.sockets();
    let seccomp = crate::seccomp::compile(&security.seccomp, security.allow_ptrace, sockets)?;
    let (landlock, _) =
        crate::landlock::plan(security.landlock, &crate::prepare::landlock_paths(spec)?, security.no_ip)?;
    let prepared = crate::limits::prepare(limits, false)?;
    let cwd = CString::new(cwd).map_err(|_| SpecError::new("working directory contains a NUL byte"))?;
    Ok(JoinPlan {
        uid: spec.user.uid,
        gid: spec.user.gid,
        cwd: match cwd_dir {
            Some(fd) => Cwd::Dir(fd, cwd),
            None => Cwd::Path(cwd),
        },
        new_session: spec.new_session,
        exec: ExecPlan::prepare(spec)?,
        seccomp,
        landlock,
        rlimits: prepared.rlimits.clone(),
    })
}

fn same_ns(pid: i32, ns: &str) -> bool {
    let a = std::fs::metadata(format!("/proc/{pid}/ns/{ns}"));
    let b = std::fs::metadata(format!("/proc/self/ns/{ns}"));
    match (a, b) {
        (Ok(a), Ok(b)) => {
            use std::os::unix::fs::MetadataExt;
            (a.dev(), a.ino()) == (b.dev(), b.ino())
        }
        _ => false,
    }
}

/// Runs `spec`'s command (argv, env, cwd, user, hardening; its mounts are
/// ignored: the sandbox has them) inside the running sandbox whose PID 1
/// is host pid `pid`. Must be called from a single-threaded process.
/// With `cwd_dir`, a directory of the sandbox's tree the caller resolved
/// (through `/proc/<pid>/root`), the command starts there (`fchdir`), and
/// the spec's `cwd` only names it. `on_started(host_pid)` is called once
/// the command runs. When the command is killed by a signal, the caller
/// dies of the same signal.
pub fn join(
    spec: &SandboxSpec,
    pid: i32,
    cwd_dir: Option<BorrowedFd<'_>>,
    on_started: impl FnOnce(i32),
) -> Result<crate::ExitStatus, LaunchError> {
    crate::launch::ensure_single_threaded()?;
    let plan = prepare(spec, cwd_dir)?;
    // A root caller's supplementary groups would show up as nogroup inside.
    crate::launch::drop_supplementary_groups();
    let pipe = |what: &str| {
        sys::pipe().map_err(|e| SyscallError::new(format!("create the {what} pipe"), "pipe2", e))
    };
    let (report_r, report_w) = pipe("report")?;
    let (life_r, life_w) = pipe("lifeline")?;
    let mut watched = FORWARDED_SIGNALS.to_vec();
    watched.push(libc::SIGCHLD);
    let watched = sys::sigset_of(&watched);
    sys::set_sigmask(libc::SIG_BLOCK, &watched)
        .map_err(|e| SyscallError::new("block signals", "sigprocmask", e))?;
    // Into the sandbox (our children: into its pid namespace too). The
    // joiner stays outside the sandbox's pid namespace, invisible there.
    enter(pid, true)?;

    // SAFETY: single-threaded (checked); the child only calls
    // async-signal-safe functions on prepared data, then execs or exits.
    let child =
        unsafe { sys::fork() }.map_err(|e| SyscallError::new("start the joined process", "fork", e))?;
    if child == 0 {
        drop(life_w);
        joined_child(&plan, report_w.as_raw_fd(), life_r.as_raw_fd());
    }
    drop(report_w);
    drop(life_r);

    let mut bytes = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        match sys::read(report_r.as_raw_fd(), &mut buf) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(SyscallError::new("read the joined process's report", "read", e).into()),
        }
    }
    if let Some((code, message)) = report::parse(&bytes) {
        let _ = sys::waitpid(child, 0);
        return Err(LaunchError::Child { code, message });
    }
    on_started(child);
    // Relay signals to the command's process group until it ends.
    let status = loop {
        let Ok(sig) = sys::sigwait(&watched) else { continue };
        if sig == libc::SIGCHLD {
            if let Ok((p, status)) = sys::waitpid(child, libc::WNOHANG)
                && p == child
            {
                break status;
            }
        } else {
            let target = if plan.new_session { -child } else { child };
            let _ = sys::kill(target, sig);
        }
    };
    drop(life_w);
    if libc::WIFSIGNALED(status) {
        // Killed by a signal: die of the same one, so whoever waits for
        // this joiner sees a signal, not a code (ACP's exitStatus.signal).
        let sig = libc::WTERMSIG(status);
        let _ = sys::setrlimit(libc::RLIMIT_CORE as libc::c_int, 0);
        sys::reset_signal(sig);
        let _ = sys::set_sigmask(libc::SIG_SETMASK, &sys::empty_sigset());
        let _ = sys::raise(sig);
    }
    Ok(crate::ExitStatus::from_code(sys::exit_code_of(status)))
}

/// Enters the namespaces of the running sandbox whose PID 1 is host pid
/// `pid`: its user, mount, ipc and uts namespaces (and its network one when
/// it has its own) for this process, with `children_pid` its pid namespace
/// for its children. One `setns` call: the pid namespace is checked with
/// the sandbox user's capabilities, which an unprivileged caller has only
/// there. Through PID 1, or for an unprivileged owner (PID 1 is not
/// dumpable) through the command (reach.rs): the same namespaces either
/// way. Used by `join` and by the nested-sandbox portal's server.
pub(crate) fn enter(pid: i32, children_pid: bool) -> Result<(), LaunchError> {
    let crate::reach::Entry { pid: through, pidfd } = crate::reach::entry(pid)?;
    if same_ns(through, "user") {
        return Err(SpecError::new(format!(
            "pid {pid} is not a sandbox: it shares this process's user namespace"
        ))
        .into());
    }
    let mut flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    if !same_ns(through, "net") {
        flags |= libc::CLONE_NEWNET;
    }
    if children_pid {
        flags |= libc::CLONE_NEWPID;
    }
    sys::setns(pidfd.as_raw_fd(), flags).map_err(|e| {
        SyscallError::new("enter the sandbox", "setns(pidfd, CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID|...)", e)
            .into()
    })
}

fn joined_child(plan: &JoinPlan, report_fd: RawFd, life: RawFd) -> ! {
    let mut report = Report::new();
    let fail = |report: &mut Report, what: &str, call: &str, e: Errno| -> ! {
        let _ = write!(report, "{what}: {call} => {}", ErrnoText(e));
        report.send(report_fd, crate::EXIT_SETUP_FAILED);
        sys::exit_now(crate::EXIT_SETUP_FAILED as i32)
    };
    if let Err(e) = sys::setresgid(plan.gid) {
        fail(&mut report, "switch to the sandbox group", "setresgid", e);
    }
    if let Err(e) = sys::setresuid(plan.uid) {
        fail(&mut report, "switch to the sandbox user", "setresuid", e);
    }
    // In the sandbox's pid namespace, as the command's user, with no filter
    // until the last step: not dumpable (after the last credential change,
    // before the capabilities go), or the command could write this copy of
    // the joiner's memory meanwhile. `execve` makes the command dumpable.
    if let Err(e) = crate::confine::make_undumpable() {
        fail(
            &mut report,
            "keep the joined process out of the sandbox's reach",
            "prctl(PR_SET_DUMPABLE, 0)",
            e,
        );
    }
    if let Err(e) = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) {
        fail(&mut report, "die with the joiner", "prctl(PR_SET_PDEATHSIG)", e);
    }
    if sys::poll_now(life, libc::POLLIN).is_some_and(|revents| revents & libc::POLLHUP != 0) {
        sys::exit_now(crate::EXIT_SETUP_FAILED as i32);
    }
    let entered = match &plan.cwd {
        Cwd::Path(path) => sys::chdir(path).map_err(|e| ("chdir", path, e)),
        Cwd::Dir(fd, path) => sys::fchdir(*fd).map_err(|e| ("fchdir", path, e)),
    };
    if let Err((call, path, e)) = entered {
        let _ = write!(
            report,
            "enter the working directory: {call}(\"{}\") => {}",
            path.to_string_lossy(),
            ErrnoText(e)
        );
        report.send(report_fd, crate::EXIT_SETUP_FAILED);
        sys::exit_now(crate::EXIT_SETUP_FAILED as i32);
    }
    if let Err((call, e)) = drop_privileges() {
        fail(&mut report, "drop privileges", call, e);
    }
    for sig in 1..libc::SIGRTMAX() {
        sys::reset_signal(sig);
    }
    let _ = sys::set_sigmask(libc::SIG_SETMASK, &sys::empty_sigset());
    harden_and_exec(
        &Hardening {
            new_session: plan.new_session,
            rlimits: &plan.rlimits,
            fds: &[],
            landlock: plan.landlock.as_ref(),
            seccomp: plan.seccomp.as_ref(),
            extra_filters: &[],
            exec: &plan.exec,
        },
        report_fd,
    )
}
