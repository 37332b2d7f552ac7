//! The launcher: the parent side of the sandbox, which stays outside as the
//! monitor.
//!
//! ```text
//! launcher (caller's namespaces)          child = PID 1 (new namespaces)
//! ──────────────────────────────          ──────────────────────────────
//! prepare Plan (all allocation)
//! block forwarded signals + SIGCHLD
//! clone(NEWUSER|NEWNS|NEWPID|...)  ─────▶ read(sync)  … waits
//! write setgroups, uid_map, gid_map
//! write(sync, 1 byte)              ─────▶ setresgid/uid, PDEATHSIG, mounts,
//!                                         pivot_root, hostname, lo, chdir
//!                                         clone(VM|VFORK) ─▶ PID 2: setsid, exec
//! read(report): record ⇒ failure   ◀───── record on failure (exit 125/126/127)
//!               EOF    ⇒ started   ◀───── report pipe closed by exec (CLOEXEC)
//! read(exit): 'S'                  ◀───── PID 1 is about to start PID 2
//! signalfd: forward INT/TERM/…     ─────▶ PID 1 relays to PID 2 (before 'S':
//!                                         setup interrupted, PID 1 killed)
//! read(exit): PID 2's wait status  ◀───── PID 2 ended: PID 1 kills and reaps
//!                                         the rest, writes the status, exits
//!           SIGCHLD ⇒ waitpid      ◀───── PID 1 has exited with that status
//! ```
//!
//! With [`LaunchOptions::return_before_teardown`] the launcher returns as
//! soon as it has read the status, without waiting for PID 1's exit, in
//! which the kernel tears down the namespaces and the whole mount tree.
//!
//! The sync pipe's write end stays open in the launcher for the sandbox's
//! whole life: the child checks it right after setting its parent-death
//! signal, closing the race where the launcher dies before `prctl`.

use std::ffi::CString;
use std::fs;
use std::io::Write as _;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use crate::apply::{self, ApplyContext};
use crate::child::{self, ChildFds};
use crate::error::{LaunchError, SpecError, SyscallError};
use crate::init::FORWARDED_SIGNALS;
use crate::ns_ids::{NamespaceIds, STATUS_NAMESPACES, namespace_ids, read_namespace_ids};
use crate::prepare::Plan;
use crate::report;
use crate::sys;

/// Options of one launch that are not part of the sandbox's description.
#[derive(Clone, Debug, Default)]
pub struct LaunchOptions {
    /// The binary to serve as `bwrap` inside the sandbox (a static build of
    /// the `tuixiu-sandbox` launcher, which answers as bwrap when called
    /// so) when the spec asks for nested sandboxes; `None`: no nesting.
    pub bwrap_front_end: Option<std::path::PathBuf>,
    /// Write `{"child-pid": N}` when the command has started and
    /// `{"exit-code": N}` when it has ended, one JSON object per line
    /// (bubblewrap's `--json-status-fd` format).
    pub json_status_fd: Option<RawFd>,
    /// Once the command runs, point the launcher's own stdin and stdout at
    /// `/dev/null`, so that only the command holds the caller's pipes and
    /// end-of-file propagates as soon as the command closes them.
    pub release_stdio: bool,
    /// Return once the command has ended and every process of the sandbox
    /// is gone, without waiting for the kernel to tear down the sandbox's
    /// namespaces and mount tree (PID 1's own exit, a few hundred µs). PID 1
    /// is then left unreaped: for callers that exit right after, like the
    /// `run` command. Ignored when the sandbox has its own cgroup, which can
    /// only be removed once PID 1 has left it.
    pub return_before_teardown: bool,
    /// The read end of a pipe whose write end only the caller holds. When
    /// it reports hang-up, the caller is gone (whichever of its threads
    /// started the launcher, unlike `PR_SET_PDEATHSIG`), and the sandbox is
    /// killed: a daemon's sandboxes die with it.
    pub lifeline_fd: Option<RawFd>,
    /// bubblewrap's `--info-fd`, `--json-status-fd` and `--userns-block-fd`.
    pub bwrap_status: Option<BwrapStatus>,
    /// A unix stream socket on which PID 1 of a [`crate::Network::Proxied`]
    /// sandbox sends its egress listener (`crate::egress`); the caller
    /// holds the other end and serves the proxy. Required for that network.
    pub egress_fd: Option<RawFd>,
    /// Counters shared with the caller ([`crate::nested::Tally`]), to which
    /// the portal's workers add how each nested request ended.
    pub nested_counts_fd: Option<RawFd>,
}

/// bubblewrap's reports on a sandbox, in its formats: once the namespaces
/// exist, `--info-fd` gets `{"child-pid": N, "<ns>-namespace": ID, ...}`
/// (pretty-printed, then closed) and `--json-status-fd` the same on one
/// line; when COMMAND (once executed) ends, `{ "exit-code": N }` on the
/// latter. `--userns-block-fd` is read before the sandbox goes on.
#[derive(Clone, Debug, Default)]
pub struct BwrapStatus {
    pub info_fd: Option<RawFd>,
    pub json_status_fd: Option<RawFd>,
    pub userns_block_fd: Option<RawFd>,
    /// `--userns2`: bubblewrap's monitor joins it too, before it reports.
    pub userns2_fd: Option<RawFd>,
}

impl BwrapStatus {
    /// Whether the status lines want namespace ids at all.
    fn reports_ids(&self) -> bool {
        self.info_fd.is_some() || self.json_status_fd.is_some()
    }

    /// The status lines for the child `pid`, with the `ids` of its
    /// namespaces.
    fn announce(&self, pid: libc::pid_t, ids: &NamespaceIds) -> Result<(), SyscallError> {
        if let Some(fd) = self.userns2_fd {
            sys::setns(fd, libc::CLONE_NEWUSER)
                .map_err(|e| SyscallError::new("Setting userns2 failed", "setns", e))?;
        }
        let mut line = String::new();
        let mut pretty = String::new();
        for (&id, (name, _)) in ids.iter().zip(STATUS_NAMESPACES).filter(|(id, _)| **id != 0) {
            line.push_str(&format!(", \"{name}-namespace\": {id}"));
            pretty.push_str(&format!(",\n    \"{name}-namespace\": {id}"));
        }
        let write = |fd: RawFd, text: &str| {
            sys::write_all(fd, text.as_bytes()).map_err(|e| SyscallError::new("Write to info_fd", "write", e))
        };
        if let Some(fd) = self.info_fd {
            write(fd, &format!("{{\n    \"child-pid\": {pid}{pretty}\n}}\n"))?;
            // SAFETY: bubblewrap closes the info descriptor once written;
            // it is the caller's to give away.
            let _ = unsafe { sys::close(fd) };
        }
        if let Some(fd) = self.json_status_fd {
            write(fd, &format!("{{ \"child-pid\": {pid}{line} }}\n"))?;
        }
        if let Some(fd) = self.userns_block_fd {
            let mut byte = [0u8; 1];
            let _ = sys::read(fd, &mut byte);
            // SAFETY: as for the info descriptor.
            let _ = unsafe { sys::close(fd) };
        }
        Ok(())
    }

    fn exited(&self, code: i32) {
        if let Some(fd) = self.json_status_fd {
            let _ = sys::write_all(fd, format!("{{ \"exit-code\": {code} }}\n").as_bytes());
        }
    }
}

/// How the command ended: its exit code, or 128+signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitStatus {
    code: i32,
    timed_out: bool,
}

impl ExitStatus {
    pub(crate) fn from_code(code: i32) -> ExitStatus {
        ExitStatus { code, timed_out: false }
    }

    pub fn code(self) -> i32 {
        self.code
    }

    /// The wall-clock limit ended the command (it was sent SIGTERM, and
    /// SIGKILL if it outlived the grace period).
    pub fn timed_out(self) -> bool {
        self.timed_out
    }

    pub fn success(self) -> bool {
        self.code == 0
    }
}

/// The error type apply callbacks return.
pub type ApplyError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) type ApplyFn<'f> = Box<dyn FnOnce(&mut ApplyContext<'_>) -> Result<(), ApplyError> + 'f>;

/// A nested-sandbox portal the monitor serves (see `crate::nested`): it
/// watches the listening socket while [`Portal::fd`] gives one.
pub(crate) trait Portal {
    /// The listening socket.
    fn fd(&self) -> RawFd;
    /// Connections are waiting; `pid1` is the sandbox's PID 1.
    fn accept(&mut self, pid1: libc::pid_t);
    /// A child of this process ended (the portal's server, maybe).
    fn reap(&mut self);
}

/// What the monitor watches besides the sandbox itself.
pub(crate) enum Watch<'a> {
    Nothing,
    /// An outer sandbox's nested-sandbox portal, served once the command runs.
    Portal(&'a mut dyn Portal),
    /// A nested sandbox: the connection of its front end, whose end kills it.
    Caller(RawFd),
}

/// Starts the prepared sandbox and monitors it to the end: the launcher's
/// side of the exchange drawn at the top of this file, in its order.
pub(crate) fn execute(
    plan: &Plan,
    options: &LaunchOptions,
    apply: Option<ApplyFn<'_>>,
    watch: Watch<'_>,
) -> Result<ExitStatus, LaunchError> {
    let pipe = |what: &str| {
        sys::pipe().map_err(|e| SyscallError::new(format!("create the {what} pipe"), "pipe2", e))
    };
    let (report_r, report_w) = pipe("report")?;
    let (sync_r, sync_w) = pipe("sync")?;
    let (exit_r, exit_w) = pipe("exit")?;
    let acks = if plan.apply_phase { Some(pipe("ack")?) } else { None };
    let egress = egress_socket(plan, options)?;
    let (watched, old_mask) = block_watched_signals()?;
    let _restore_mask = Defer(|| {
        let _ = sys::set_sigmask(libc::SIG_SETMASK, &old_mask);
    });
    let status = options.bwrap_status.as_ref();
    let ids_pair = namespace_ids_socket(plan, status)?;
    let child_fds = ChildFds {
        ns_ids: ids_pair.as_ref().map_or(-1, |(_, theirs)| theirs.as_raw_fd()),
        report: report_w.as_raw_fd(),
        sync: sync_r.as_raw_fd(),
        ack: acks.as_ref().map_or(-1, |(_, w)| w.as_raw_fd()),
        exit: exit_w.as_raw_fd(),
        egress,
    };
    // SAFETY: we checked that this process is single-threaded, and the
    // child branch never returns: `child::main` ends in `_exit`.
    let pid = match unsafe { sys::clone_fork(plan.clone_flags) } {
        Ok(0) => child::main(plan, &child_fds),
        Ok(pid) => pid,
        Err(e) => return Err(clone_error(e).into()),
    };
    let mut child = ChildGuard { pid, reaped: false };
    // Into the sandbox's cgroup before it runs anything (it waits for the
    // sync byte), so every process it will ever have is counted.
    if let Some(cgroup) = &plan.limits.cgroup {
        cgroup.add(pid)?;
    }
    let ids_r = ids_pair.map(|(ours, _)| ours);
    drop(report_w);
    drop(sync_r);
    drop(exit_w);
    let ack_r = acks.map(|(r, w)| {
        drop(w);
        r
    });
    close_handed_over(plan);
    release_child(plan, pid, status, ids_r.as_ref(), sync_w.as_raw_fd())?;
    // Reap the (killed) idmap helper now, while the child builds its root,
    // rather than leave a zombie beside the sandbox for its whole life.
    drop(plan.idmap_helper.take());
    if let (Some(apply), Some(ack_r)) = (apply, ack_r) {
        run_apply_phase(plan, pid, apply, ack_r.as_raw_fd(), sync_w.as_raw_fd())?;
    }

    let timeout = plan.limits.timeout.map(|t| (t, plan.limits.kill_after));
    let early = options.return_before_teardown && plan.limits.cgroup.is_none();
    let pipes = MonitorPipes { report: report_r, exit: exit_r, return_on_exit_status: early };
    let mut watch = watch;
    monitor(&mut child, pipes, plan.new_session, options, &watched, timeout, &mut watch)
    // `sync_w` (the lifeline) closes here, after the sandbox has ended.
}

/// The caller's socket for a proxied network's egress listener (-1 for
/// other networks).
fn egress_socket(plan: &Plan, options: &LaunchOptions) -> Result<RawFd, LaunchError> {
    match (plan.egress, options.egress_fd) {
        (false, _) => Ok(-1),
        (true, Some(fd)) => Ok(fd),
        (true, None) => Err(SpecError::new(
            "a proxied network needs someone to serve its egress proxy (no egress socket was given)",
        )
        .into()),
    }
}

/// Blocks the forwarded signals and SIGCHLD before clone, so none is lost
/// between clone and the signalfd, and none runs a default action on us:
/// `(the blocked set, the mask before)`.
fn block_watched_signals() -> Result<(libc::sigset_t, libc::sigset_t), LaunchError> {
    // A caller that ignores SIGCHLD (Erlang's ports start programs so)
    // would have the kernel reap our child and never raise the signal the
    // monitor waits for: its default disposition back, as bubblewrap does.
    sys::reset_signal(libc::SIGCHLD);
    let mut watched = FORWARDED_SIGNALS.to_vec();
    watched.push(libc::SIGCHLD);
    let watched = sys::sigset_of(&watched);
    let old_mask = sys::set_sigmask(libc::SIG_BLOCK, &watched)
        .map_err(|e| SyscallError::new("block signals", "sigprocmask", e))?;
    Ok((watched, old_mask))
}

/// A sandbox served through the portal makes its mount namespace itself,
/// and no other process may read its namespace links (its PID 1 is never
/// dumpable): it sends their ids for the status lines over this socket
/// and waits there until they are written (docs/bwrap.md).
fn namespace_ids_socket(
    plan: &Plan,
    status: Option<&BwrapStatus>,
) -> Result<Option<(OwnedFd, OwnedFd)>, LaunchError> {
    match status.filter(|s| plan.pool.is_some() && s.reports_ids()) {
        Some(_) => Ok(Some(
            socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
                .map_err(|e| SyscallError::new("create the namespace ids socket", "socketpair", e))?,
        )),
        None => Ok(None),
    }
}

/// A nested sandbox's caller's descriptors, and those its sources were
/// opened through, are the nested PID 1's now: the launcher closes its
/// copies.
fn close_handed_over(plan: &Plan) {
    let Some(nested) = &plan.nested else { return };
    let held = nested.host.as_ref().map_or(&[][..], |h| &h.held);
    for source in nested
        .fds
        .iter()
        .map(|&(_, source)| source)
        .chain(nested.source_fds.iter().copied())
        .chain(held.iter().copied())
    {
        // SAFETY: the plan's raw copies, ours to close, closed once.
        let _ = unsafe { sys::close(source) };
    }
}

/// Writes the child's id maps (unless the caller writes them), bubblewrap's
/// status lines, and the sync byte that lets the child go on.
fn release_child(
    plan: &Plan,
    pid: libc::pid_t,
    status: Option<&BwrapStatus>,
    ids_r: Option<&OwnedFd>,
    sync: RawFd,
) -> Result<(), LaunchError> {
    let host = plan.nested.as_ref().and_then(|n| n.host.as_ref());
    // bubblewrap's `--userns-block-fd`: the caller writes the maps.
    if plan.clone_flags & libc::CLONE_NEWUSER as libc::c_ulong != 0 && !host.is_some_and(|h| h.caller_maps) {
        write_id_maps(pid, plan)?;
    }
    if let Some(status) = status.filter(|_| ids_r.is_none()) {
        let ns_dir = CString::new(format!("/proc/{}/ns", proc_pid(pid))).expect("a path of digits");
        status.announce(pid, &namespace_ids(&ns_dir, plan.clone_flags))?;
    }
    sys::write_all(sync, &[1]).map_err(|e| SyscallError::new("release the sandbox child", "write", e))?;
    if let (Some(status), Some(ids_r)) = (status, ids_r) {
        // End-of-file: setup failed before the namespaces were complete;
        // the lines still name the child, as bubblewrap's would.
        status.announce(pid, &read_namespace_ids(ids_r.as_raw_fd()))?;
        let _ = sys::write_all(ids_r.as_raw_fd(), &[1]);
    }
    Ok(())
}

/// The apply phase, once the child says READY: `apply` lands the caller's
/// inputs in the sandbox's tree, commanding the child over `commands`. A
/// child that fails setup exits instead of saying READY; the monitor then
/// reads its report.
fn run_apply_phase(
    plan: &Plan,
    pid: libc::pid_t,
    apply: ApplyFn<'_>,
    acks: RawFd,
    commands: RawFd,
) -> Result<(), LaunchError> {
    let ready = apply::wait_ready(acks)
        .map_err(|e| SyscallError::new("wait for the sandbox", "read(ack pipe)", e))?;
    if ready {
        let mut ctx = ApplyContext {
            plan,
            root: apply::open_root(pid)?,
            commands,
            acks,
            attached: vec![false; plan.deferred.len()],
        };
        let fs_ids = FsIds::become_sandbox_owner(plan);
        let outcome = apply(&mut ctx);
        drop(fs_ids);
        outcome.map_err(LaunchError::Apply)?;
        ctx.finish()?;
    }
    Ok(())
}

/// During the apply phase a root launcher writes with the host ids the
/// sandbox user maps onto, so files it creates belong to that user inside.
struct FsIds {
    restore: Option<(u32, u32)>,
}

impl FsIds {
    fn become_sandbox_owner(plan: &Plan) -> FsIds {
        let (uid, gid) = crate::prepare::own_ids();
        if uid != 0 || (plan.host_uid, plan.host_gid) == (uid, gid) {
            return FsIds { restore: None };
        }
        // Only this (single) thread's filesystem ids; they cannot fail in a
        // way that matters here.
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(plan.host_gid));
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(plan.host_uid));
        FsIds { restore: Some((uid, gid)) }
    }
}

impl Drop for FsIds {
    fn drop(&mut self) {
        if let Some((uid, gid)) = self.restore {
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(gid));
        }
    }
}

/// Kills and reaps the child if the launcher bails out early.
struct ChildGuard {
    pid: libc::pid_t,
    reaped: bool,
}

impl ChildGuard {
    /// PID 1 is exiting on its own: reap it if it is already gone, else
    /// leave it (its parent's exit hands it to init).
    fn detach(&mut self) {
        let _ = sys::waitpid(self.pid, libc::WNOHANG);
        self.reaped = true;
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = sys::kill(self.pid, libc::SIGKILL);
            let _ = sys::waitpid(self.pid, 0);
        }
    }
}

struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// What the monitor reads besides signals.
struct MonitorPipes {
    /// Setup failures; end-of-file once the command was executed.
    report: OwnedFd,
    /// The command's wait status, from PID 1.
    exit: OwnedFd,
    /// Return with that status instead of waiting for PID 1 to exit.
    return_on_exit_status: bool,
}

/// Watches the sandbox to its end: one `poll` over the report pipe, the
/// signalfd, the exit pipe, the lifeline and the [`Watch`]; their events
/// handled by [`Monitor`]'s methods in a fixed order (lifeline, report,
/// exit, watch, signals); then the status.
fn monitor(
    child: &mut ChildGuard,
    pipes: MonitorPipes,
    new_session: bool,
    options: &LaunchOptions,
    watched: &libc::sigset_t,
    timeout: Option<(Duration, Duration)>,
    watch: &mut Watch<'_>,
) -> Result<ExitStatus, LaunchError> {
    let mut clock = Clock::start(timeout);
    let sfd = sys::signalfd(watched, 0).map_err(|e| SyscallError::new("watch signals", "signalfd", e))?;
    let mut m = Monitor::new(child, pipes, options);
    let status = loop {
        let mut pfds = m.poll_fds(sfd.as_raw_fd(), watch);
        let Some(wait_ms) = clock.wait_ms(m.child.pid, m.started || m.exit_len > 0) else { continue };
        // A negative fd is ignored.
        if let Err(e) = sys::poll(&mut pfds, wait_ms) {
            if e == Errno::EINTR {
                continue;
            }
            return Err(SyscallError::new("monitor the sandbox", "poll", e).into());
        }
        if pfds[3].revents != 0 {
            m.caller_gone();
        }
        if pfds[0].revents != 0 {
            m.read_report_pipe()?;
        }
        if pfds[2].revents != 0
            && let Some(status) = m.read_exit_pipe()
        {
            break status;
        }
        if pfds[4].revents != 0 {
            m.serve_watch(watch, pfds[4].fd);
        }
        if pfds[1].revents != 0
            && let Some(status) = m.handle_signal(sfd.as_fd(), watch, new_session)
        {
            break status;
        }
    };
    m.finish(status, clock.timed_out)
}

/// The wall clock: SIGTERM at the deadline (PID 1 relays it to the
/// command), SIGKILL to PID 1 after the grace period, which ends the whole
/// pid namespace.
struct Clock {
    /// `(limit, grace period)`.
    timeout: Option<(Duration, Duration)>,
    deadline: Option<Instant>,
    timed_out: bool,
}

impl Clock {
    fn start(timeout: Option<(Duration, Duration)>) -> Clock {
        let start = Instant::now();
        Clock { timeout, deadline: timeout.map(|(t, _)| start + t), timed_out: false }
    }

    /// How long `poll` may wait (-1: no deadline); `None` when the deadline
    /// has just passed and `pid` was signalled (SIGTERM where PID 1 relays
    /// it, i.e. once `relayed`, else SIGKILL; SIGKILL after the grace).
    fn wait_ms(&mut self, pid: libc::pid_t, relayed: bool) -> Option<i32> {
        let Some(at) = self.deadline else { return Some(-1) };
        let now = Instant::now();
        if now < at {
            return Some((at - now).as_millis().min(i32::MAX as u128) as i32 + 1);
        }
        if !self.timed_out {
            self.timed_out = true;
            let (limit, grace) = self.timeout.expect("a deadline comes from a timeout");
            tracing::warn!(
                "the command exceeded its time limit of {limit:?}: sending SIGTERM, SIGKILL in {grace:?}"
            );
            let _ = sys::kill(pid, if relayed { libc::SIGTERM } else { libc::SIGKILL });
            self.deadline = Some(now + grace);
        } else {
            let _ = sys::kill(pid, libc::SIGKILL);
            self.deadline = None;
        }
        None
    }
}

/// What the monitor has seen of the sandbox so far.
struct Monitor<'a> {
    child: &'a mut ChildGuard,
    options: &'a LaunchOptions,
    exit_r: OwnedFd,
    report_r: OwnedFd,
    return_on_exit_status: bool,
    report_bytes: Vec<u8>,
    report_open: bool,
    exit_open: bool,
    /// From PID 1 on the exit pipe: `EXIT_STARTING`, then the 4-byte status.
    exit_msg: [u8; 5],
    exit_len: usize,
    started: bool,
    killed_by: Option<i32>,
    lifeline: Option<RawFd>,
}

impl<'a> Monitor<'a> {
    fn new(child: &'a mut ChildGuard, pipes: MonitorPipes, options: &'a LaunchOptions) -> Monitor<'a> {
        let MonitorPipes { report: report_r, exit: exit_r, return_on_exit_status } = pipes;
        Monitor {
            child,
            options,
            report_r,
            exit_r,
            return_on_exit_status,
            report_bytes: Vec::new(),
            report_open: true,
            exit_open: true,
            exit_msg: [0u8; 5],
            exit_len: 0,
            started: false,
            killed_by: None,
            lifeline: options.lifeline_fd,
        }
    }

    /// What `poll` watches, by index: 0 the report pipe, 1 the signalfd,
    /// 2 the exit pipe, 3 the lifeline, 4 the [`Watch`] (a portal only
    /// once the command runs); -1 where there is nothing (any more).
    fn poll_fds(&self, sfd: RawFd, watch: &Watch<'_>) -> [libc::pollfd; 5] {
        let pollin = |fd: RawFd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        [
            pollin(if self.report_open { self.report_r.as_raw_fd() } else { -1 }),
            pollin(sfd),
            pollin(if self.exit_open { self.exit_r.as_raw_fd() } else { -1 }),
            pollin(self.lifeline.unwrap_or(-1)),
            pollin(match watch {
                Watch::Portal(portal) if self.started => portal.fd(),
                Watch::Caller(fd) => *fd,
                _ => -1,
            }),
        ]
    }

    /// Nobody ever writes to the lifeline: any event is its hang-up.
    fn caller_gone(&mut self) {
        tracing::warn!("the launcher's caller is gone: killing the sandbox");
        let _ = sys::kill(self.child.pid, libc::SIGKILL);
        self.killed_by.get_or_insert(128 + libc::SIGKILL);
        self.lifeline = None;
    }

    /// A failure record, or end-of-file: without a record (and unless the
    /// sandbox was killed), the command has been executed.
    fn read_report_pipe(&mut self) -> Result<(), LaunchError> {
        if read_report(&self.report_r, &mut self.report_bytes)? == 0 {
            self.report_open = false;
            if self.report_bytes.is_empty() && self.killed_by.is_none() {
                self.started = true;
                write_status(self.options.json_status_fd, &format!("{{\"child-pid\": {}}}", self.child.pid));
                if self.options.release_stdio {
                    release_stdio();
                }
            }
        }
        Ok(())
    }

    /// Reads PID 1's messages; the command's wait status when the monitor
    /// is to return with it now.
    fn read_exit_pipe(&mut self) -> Option<libc::c_int> {
        match sys::read(self.exit_r.as_raw_fd(), &mut self.exit_msg[self.exit_len..]) {
            Ok(0) | Err(_) => self.exit_open = false,
            Ok(n) => self.exit_len += n,
        }
        if self.exit_len == self.exit_msg.len() {
            self.exit_open = false;
            let m = &self.exit_msg;
            let status = libc::c_int::from_ne_bytes([m[1], m[2], m[3], m[4]]);
            if self.return_on_exit_status && self.killed_by.is_none() {
                self.child.detach();
                return Some(status);
            }
        }
        // Without the status (PID 1 was killed, or failed before the
        // command ran), PID 1's own exit tells the rest.
        None
    }

    /// A portal's connections, or the nested caller's front end (`fd`).
    fn serve_watch(&mut self, watch: &mut Watch<'_>, fd: RawFd) {
        match watch {
            Watch::Portal(portal) => portal.accept(self.child.pid),
            Watch::Caller(_) => {
                // Nothing more is expected from the front end: any read
                // that is not data means it is gone.
                let mut byte = [0u8; 64];
                if !matches!(sys::read(fd, &mut byte), Ok(n) if n > 0) {
                    *watch = Watch::Nothing;
                    let _ = sys::kill(self.child.pid, libc::SIGKILL);
                    self.killed_by.get_or_insert(128 + libc::SIGKILL);
                }
            }
            Watch::Nothing => {}
        }
    }

    /// One signal from the signalfd: SIGCHLD reaps (PID 1's wait status
    /// once it has exited), the others end the setup or are relayed.
    fn handle_signal(
        &mut self,
        sfd: BorrowedFd<'_>,
        watch: &mut Watch<'_>,
        new_session: bool,
    ) -> Option<libc::c_int> {
        let Ok(Some(info)) = sys::read_signal(sfd) else { return None };
        let pid = self.child.pid;
        let sig = info.ssi_signo as libc::c_int;
        if sig == libc::SIGCHLD {
            if let Watch::Portal(portal) = watch {
                portal.reap();
            }
            if let Ok((reaped, status)) = sys::waitpid(pid, libc::WNOHANG)
                && reaped == pid
            {
                self.child.reaped = true;
                return Some(status);
            }
        } else if !self.started && self.exit_len == 0 {
            // Interrupted during setup: nothing to relay to yet. (Once
            // PID 1 is starting the command, a signal waits in PID 1,
            // blocked until it can relay it, even if the command has not
            // yet closed the report pipe by executing.)
            let _ = sys::kill(pid, libc::SIGKILL);
            self.killed_by.get_or_insert(128 + sig);
        } else if new_session || info.ssi_code != libc::SI_KERNEL {
            // A signal the terminal generated (SI_KERNEL) already reached
            // a command that shares our session; relay only the others.
            let _ = sys::kill(pid, sig);
        }
        None
    }

    /// The child is gone with `status`: its report (a setup failure) or
    /// the command's exit code, on the status descriptors too.
    fn finish(mut self, status: libc::c_int, timed_out: bool) -> Result<ExitStatus, LaunchError> {
        // Whatever it reported is in the pipe already, and end-of-file
        // follows once the last process of the sandbox has exited.
        while self.report_open {
            if read_report(&self.report_r, &mut self.report_bytes)? == 0 {
                self.report_open = false;
            }
        }
        let options = self.options;
        let code = match (report::parse(&self.report_bytes), self.killed_by) {
            (Some((code, message)), _) => {
                write_status(options.json_status_fd, &format!("{{\"exit-code\": {code}}}"));
                return Err(LaunchError::Child { code, message });
            }
            (None, Some(code)) => code,
            (None, None) => sys::exit_code_of(status),
        };
        write_status(options.json_status_fd, &format!("{{\"exit-code\": {code}}}"));
        if let Some(bwrap) = options.bwrap_status.as_ref().filter(|_| self.started) {
            bwrap.exited(code);
        }
        Ok(ExitStatus { code, timed_out })
    }
}

/// Reads what is available on the report pipe; returns the byte count (0 at EOF).
fn read_report(fd: &OwnedFd, into: &mut Vec<u8>) -> Result<usize, LaunchError> {
    let mut buf = [0u8; 2048];
    let n = sys::read(fd.as_raw_fd(), &mut buf)
        .map_err(|e| SyscallError::new("read the sandbox's report", "read", e))?;
    into.extend_from_slice(&buf[..n]);
    report::take_notices(into);
    Ok(n)
}

fn write_status(fd: Option<RawFd>, json: &str) {
    if let Some(fd) = fd {
        let line = format!("{json}\n");
        // The status fd is the caller's; a closed reader is not our failure.
        let _ = sys::write_all(fd, line.as_bytes());
    }
}

fn release_stdio() {
    if let Ok(null) = fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        let _ = sys::dup2(null.as_raw_fd(), 0);
        let _ = sys::dup2(null.as_raw_fd(), 1);
    }
}

pub(crate) fn ensure_single_threaded() -> Result<(), LaunchError> {
    let threads = thread_count().unwrap_or(1);
    if threads == 1 {
        Ok(())
    } else {
        Err(SpecError::new(format!(
            "the sandbox launcher must run in a single-threaded process (this one has {threads} threads); \
             spawn `tuixiu-sandbox __exec` with the spec instead"
        ))
        .into())
    }
}

/// This process's thread count. procfs gives `/proc/self/task` a link count
/// of 2 plus the number of threads (one `statx` instead of listing it).
fn thread_count() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let links = fs::metadata("/proc/self/task").ok()?.nlink();
    if links > 2 { Some(links - 2) } else { fs::read_dir("/proc/self/task").ok().map(|d| d.count() as u64) }
}

/// A root caller's supplementary groups would show up as `nogroup` inside;
/// drop them while we still may (unprivileged callers cannot, and have
/// `setgroups` denied in the sandbox anyway).
pub(crate) fn drop_supplementary_groups() {
    let _ = nix::unistd::setgroups(&[]);
}

/// `pid` (of our pid namespace) as the mounted `/proc` numbers it: the
/// same unless that `/proc` is another pid namespace's (a bwrap sandbox
/// given the host's `--bind /proc /proc`), where a pidfd's `fdinfo`,
/// which procfs writes in its own namespace's numbers, tells.
fn proc_pid(pid: libc::pid_t) -> libc::pid_t {
    let me = nix::unistd::getpid().as_raw();
    let ours = fs::read_link("/proc/self").ok().and_then(|p| p.to_str()?.parse::<libc::pid_t>().ok());
    if ours == Some(me) {
        return pid;
    }
    let Ok(fd) = sys::pidfd_open(pid) else { return pid };
    fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .ok()
        .and_then(|info| info.lines().find_map(|l| l.strip_prefix("Pid:")?.trim().parse().ok()))
        .unwrap_or(pid)
}

fn write_proc_file(pid: libc::pid_t, name: &str, contents: &str) -> Result<(), SyscallError> {
    let path = format!("/proc/{}/{name}", proc_pid(pid));
    let step = format!("write the sandbox's {name}");
    let mut file = fs::OpenOptions::new().write(true).open(&path).map_err(|e| {
        SyscallError::new(
            step.clone(),
            format!("open(\"{path}\")"),
            Errno::from_raw(e.raw_os_error().unwrap_or(0)),
        )
    })?;
    file.write_all(contents.as_bytes()).map_err(|e| {
        SyscallError::new(
            step,
            format!("write(\"{path}\", {:?})", contents.trim_end()),
            Errno::from_raw(e.raw_os_error().unwrap_or(0)),
        )
    })
}

fn write_id_maps(pid: libc::pid_t, plan: &Plan) -> Result<(), SyscallError> {
    let add_hint = |e: SyscallError| match e.errno {
        Errno::EPERM | Errno::EACCES => match userns_map_hint() {
            Some(hint) => e.hint(hint),
            None => e,
        },
        _ => e,
    };
    write_proc_file(pid, "uid_map", &plan.uid_map()).map_err(add_hint)?;
    // Unprivileged gid maps require setgroups to be denied first; we deny it
    // for every caller, so nobody in the sandbox can drop a group to gain access.
    write_proc_file(pid, "setgroups", "deny").map_err(add_hint)?;
    write_proc_file(pid, "gid_map", &plan.gid_map()).map_err(add_hint)
}

fn read_sysctl(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn userns_map_hint() -> Option<String> {
    if read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        return Some(
            "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1): \
             install the AppArmor profile from docs/troubleshooting.md for this binary, or set the sysctl to 0"
                .into(),
        );
    }
    Some("the id map could not be written; an LSM (AppArmor, SELinux) may confine user namespaces on this host".into())
}

fn clone_error(errno: Errno) -> SyscallError {
    let call = "clone(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWIPC|CLONE_NEWUTS)";
    let e = SyscallError::new("create the sandbox namespaces", call, errno);
    let hint = match errno {
        Errno::EPERM | Errno::EACCES => {
            if read_sysctl("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
                "unprivileged user namespaces are disabled: set kernel.unprivileged_userns_clone=1"
                    .to_string()
            } else if read_sysctl("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
                "user namespaces are disabled: set user.max_user_namespaces to a positive value".to_string()
            } else {
                "creating namespaces is forbidden here; inside a container, its seccomp profile \
                 (docker's default) blocks clone(CLONE_NEWUSER): use --security-opt seccomp=unconfined, \
                 or --provider docker on the host"
                    .to_string()
            }
        }
        Errno::ENOSPC | Errno::EUSERS => format!(
            "the user namespace limit was reached (user.max_user_namespaces = {}) or the nesting depth (32) exceeded",
            read_sysctl("/proc/sys/user/max_user_namespaces").unwrap_or_else(|| "?".into())
        ),
        Errno::EINVAL => {
            "this kernel lacks support for one of the namespaces (CONFIG_USER_NS, CONFIG_PID_NS...)".into()
        }
        _ => return e,
    };
    e.hint(hint)
}
