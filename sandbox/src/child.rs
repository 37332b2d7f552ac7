//! The sandbox child: PID 1 of the new pid namespace.
//!
//! [`main`] is the whole in-child setup as one checklist, in order. Every
//! step works on the [`Plan`] prepared before `clone` and reports a failure
//! as one line on the report pipe, then exits 125. After setup this process
//! forks the command (PID 2) and stays behind as the reaper ([`crate::init`]).

use std::ffi::{CStr, CString};
use std::fmt::Write as _;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::panic::AssertUnwindSafe;

use nix::errno::Errno;

use crate::apply;
use crate::error::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED, ErrnoText};
use crate::mounts::{self, Clones, Fail};
use crate::prepare::{Action, HostChild, Plan};
use crate::report::{Lossy, Report};
use crate::sys;

/// Descriptors the child inherits from the launcher.
pub(crate) struct ChildFds {
    /// A socket on which PID 1 sends its namespace ids for bubblewrap's
    /// status lines and waits until they are written (-1 without one).
    pub ns_ids: RawFd,
    /// Write end of the report pipe (close-on-exec).
    pub report: RawFd,
    /// Read end of the sync pipe: one byte once the id maps are written,
    /// then end-of-file when the launcher dies (and apply-phase commands).
    pub sync: RawFd,
    /// Write end of the ack pipe for the apply phase (-1 without one).
    pub ack: RawFd,
    /// Write end of the exit pipe: PID 1 writes the command's wait status
    /// there once the command and everything it left behind are gone.
    pub exit: RawFd,
    /// The caller's unix socket for the egress listener (-1 without one).
    pub egress: RawFd,
}

/// A setup failure: which step, which call, and a hint if one is known.
struct StepFail<'a> {
    what: &'a str,
    fail: Fail<'a>,
    hint: Option<&'static str>,
    /// The mount step it happened in, for bubblewrap's words.
    action: Option<&'a Action>,
}

fn fail<'a>(what: &'a str, call: &'static str, arg: &'a CStr, errno: Errno) -> StepFail<'a> {
    StepFail { what, fail: Fail::new(call, arg, errno), hint: None, action: None }
}

/// Entry point after `clone`; never returns.
pub(crate) fn main(plan: &Plan, fds: &ChildFds) -> ! {
    // A panic must not unwind into the launcher's code in this copy of the
    // process; report it and leave.
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| setup(plan, fds)));
    let mut report = Report::new();
    match outcome {
        Ok(Ok(never)) => match never {},
        // A bwrap sandbox's mount step: bubblewrap's message where one fits.
        Ok(Err(f))
            if let Some(words) = f
                .action
                .filter(|_| plan.nested.is_some())
                .and_then(|action| crate::bwrap_words::setup_failure(action, &f.fail)) =>
        {
            let _ = write!(report, "{words}");
        }
        // bubblewrap's words: the step says it all (with its argument, if
        // any), then the error's text.
        Ok(Err(f)) if f.fail.call.is_empty() => {
            let arg = Lossy(f.fail.arg.map_or(&[][..], CStr::to_bytes));
            let _ = write!(report, "{}{arg}: {}", f.what, f.fail.errno.desc());
        }
        Ok(Err(f)) => {
            let _ = write!(report, "{}: {}", f.what, f.fail.call);
            if let Some(arg) = f.fail.arg {
                let slash = if f.fail.rooted { "/" } else { "" };
                let _ = write!(report, "(\"{slash}{}\")", Lossy(arg.to_bytes()));
            }
            let _ = write!(report, " => {}", ErrnoText(f.fail.errno));
            if let Some(hint) = f.hint.or_else(|| hint_for(f.fail.call, f.fail.errno)) {
                let _ = write!(report, "; hint: {hint}");
            }
        }
        Err(_) => {
            let _ = write!(report, "internal error: the sandbox child panicked during setup");
        }
    }
    report.send(fds.report, EXIT_SETUP_FAILED);
    sys::exit_now(EXIT_SETUP_FAILED as i32)
}

/// The in-child checklist, in order: the order is part of the sandbox's
/// security (ids before mounts, mounts before the pivot, the last
/// credential change before the privileges go, the privileges before the
/// command), so it is written out here once and each step is a function
/// of its own. Returns only on failure.
fn setup<'a>(plan: &'a Plan, fds: &ChildFds) -> Result<std::convert::Infallible, StepFail<'a>> {
    // 0. Only our pipes (and the plan's descriptors) stay open.
    close_inherited(plan, fds)?;
    // 1. The launcher has written our uid/gid maps.
    wait_for_id_maps(fds.sync);
    let bwrap_host = plan.nested.as_ref().and_then(|n| n.host.as_ref());
    if let Some(message) = bwrap_host.and_then(|h| h.fail_at_start.as_deref()) {
        report_and_exit(message, fds.report);
    }
    // 2. Become the sandbox user.
    become_sandbox_user(plan, bwrap_host)?;
    // 3. Die with the launcher (after 2, which resets the signal).
    die_with_launcher(fds.sync)?;
    // 4. Files created during setup get exactly the modes we ask for.
    let caller_umask = sys::umask(0);
    // 5. Nothing we mount may propagate back to the host. (A nested
    //    sandbox's PID 1 starts in its portal worker's mount namespace and
    //    makes its own in step 6.)
    if plan.pool.is_none() {
        make_mounts_slave()?;
    }
    // 6. Clone every host source now, while the host's tree is our root.
    let mut host = open_host_root()?;
    let proc_self = open_private_proc(plan, host.as_fd())?;
    let exec_label = open_exec_label(plan)?;
    let pool_rel = plan.pool.as_deref();
    let mut pool = mounts::Pool::open(host.as_fd(), pool_rel).map_err(pool_fail)?;
    let mut clones = clone_host_sources(plan, host.as_fd(), &mut pool, fds.report)?;
    close_source_fds(plan);
    if pool.is_some() {
        enter_own_mount_namespace(&mut host, &mut pool, pool_rel)?;
    }
    send_namespace_ids(plan, fds.ns_ids);
    // 7. Build the new root on top of `/`, in the planned order.
    let new = build_new_root(plan, host, pool, &mut clones, fds.report)?;
    // 8. Enter it; the host's whole tree goes with one lazy unmount.
    enter_new_root(new)?;
    // 9. Hostname, loopback, the egress listener.
    set_hostname(plan)?;
    set_up_network(plan, fds.egress)?;
    // 10. The apply phase: the launcher lands its inputs in this tree and
    //     has deferred binds attached, in its order.
    if plan.apply_phase && !apply::serve(plan, clones, fds.sync, fds.ack) {
        sys::exit_now(EXIT_SETUP_FAILED as i32);
    }
    // 11. The command's working directory, then bubblewrap's lock files
    //     (opened from there, as bubblewrap's reaper does).
    enter_working_directory(plan)?;
    take_lock_files(plan)?;
    // 11b. A nested sandbox's own user namespace, made only now, then
    //      PID 1 out of the command's reach (after that last credential
    //      change, which may reset the flag).
    let helpers_left = enter_nested_userns(plan, proc_self, fds.sync)?;
    make_pid1_undumpable(plan)?;
    // 12. Drop privileges for good, here in PID 1 before the fork.
    drop_privileges_for_good(plan, bwrap_host, fds.report)?;
    // 12b. `--exec-label`: COMMAND inherits the attribute and is executed
    //      in that context (bubblewrap's `setexeccon`, at the same point).
    if let Some((attr, label, what)) = exec_label {
        crate::selinux::set_exec(&attr, label).map_err(|e| fail(what, "", c"", e))?;
    }
    // 13. Start the command (PID 2); this process becomes the reaper.
    start_command(plan, fds, caller_umask, helpers_left)
}

/// One line on the report pipe, then PID 1 ends.
fn report_and_exit(message: &str, report_fd: RawFd) -> ! {
    let mut report = Report::new();
    let _ = write!(report, "{message}");
    report.send(report_fd, EXIT_SETUP_FAILED);
    sys::exit_now(EXIT_SETUP_FAILED as i32)
}

/// Step 0. Nothing the launcher had open stays with us but our pipes: a
/// descriptor held here (a directory, a file) would be reachable from the
/// sandbox through /proc/1/fd once PID 1 has dropped privileges. The
/// idmapped system trees the launcher prepared are ours too. A nested
/// sandbox also keeps the caller's descriptors, which the launcher numbered
/// from `fd_base` up for the command.
fn close_inherited<'a>(plan: &Plan, fds: &ChildFds) -> Result<(), StepFail<'a>> {
    let mut keep = [-1 as RawFd; sys::MAX_KEPT_FDS];
    let ours = [fds.report, fds.sync, fds.ack, fds.exit, fds.egress, fds.ns_ids];
    keep[..ours.len()].copy_from_slice(&ours);
    let n = ours.len() + plan.kept_fds.len().min(sys::MAX_KEPT_FDS - ours.len());
    keep[ours.len()..n].copy_from_slice(&plan.kept_fds[..n - ours.len()]);
    let below = plan.nested.as_ref().map_or(libc::c_uint::MAX, |n| n.fd_base as libc::c_uint);
    sys::close_all_except(&keep[..n], below)
        .map_err(|e| fail("close inherited descriptors", "close_range", c"3..", e))
}

/// Step 1. Waits until the launcher has written our uid/gid maps.
/// End-of-file means the launcher died before that: leave quietly.
fn wait_for_id_maps(sync: RawFd) {
    let mut byte = [0u8; 1];
    match sys::read(sync, &mut byte) {
        Ok(1) => {}
        _ => sys::exit_now(EXIT_SETUP_FAILED as i32),
    }
}

/// Step 2. For an unprivileged caller these ids are already ours; for a
/// root caller mapping onto other host ids this switches to them. We keep
/// all capabilities in our own namespace. (Ids the caller mapped itself,
/// bubblewrap's `--userns-block-fd`, are the sandbox's as they are.)
fn become_sandbox_user<'a>(plan: &Plan, bwrap_host: Option<&HostChild>) -> Result<(), StepFail<'a>> {
    if !bwrap_host.is_some_and(|h| h.caller_maps) {
        sys::setresgid(plan.gid).map_err(|e| fail("switch to the sandbox group", "setresgid", c"", e))?;
        sys::setresuid(plan.uid).map_err(|e| fail("switch to the sandbox user", "setresuid", c"", e))?;
    } else if !ids_mapped() {
        // Unmapped ids create nothing: bubblewrap fails at its first mkdir.
        return Err(fail("Creating newroot failed", "", c"", Errno::EOVERFLOW));
    }
    Ok(())
}

/// Step 3. Credential changes reset the parent-death signal, so it is set
/// after step 2; then the lifeline is re-checked: if the launcher died in
/// between, the sync pipe is at end-of-file.
fn die_with_launcher<'a>(sync: RawFd) -> Result<(), StepFail<'a>> {
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        .map_err(|e| fail("die with the launcher", "prctl(PR_SET_PDEATHSIG)", c"", e))?;
    if launcher_gone(sync) {
        sys::exit_now(EXIT_SETUP_FAILED as i32);
    }
    Ok(())
}

/// How steps 5 to 7 name a failure.
const ROOT_WHAT: &str = "prepare the new root";

/// Steps 5 and 6: nothing mounted below `/` propagates back to the host.
fn make_mounts_slave<'a>() -> Result<(), StepFail<'a>> {
    sys::mount(None, c"/", None, libc::MS_SLAVE | libc::MS_REC, None)
        .map_err(|e| fail(ROOT_WHAT, "mount(MS_SLAVE|MS_REC)", c"/", e))
}

/// Step 6: the caller's tree, where the host sources are found.
fn open_host_root<'a>() -> Result<OwnedFd, StepFail<'a>> {
    sys::open(c"/", libc::O_PATH | libc::O_DIRECTORY, 0).map_err(|e| fail(ROOT_WHAT, "open", c"/", e))
}

/// Step 6: a nested sandbox that gets its own user namespace writes its id
/// maps after the mounts, through a procfs that is never attached anywhere
/// (the sandbox's own /proc may be missing or covered).
fn open_private_proc<'a>(plan: &Plan, host: BorrowedFd<'_>) -> Result<Option<PrivateProc>, StepFail<'a>> {
    match plan.nested.as_ref().filter(|n| !n.userns.is_empty()) {
        Some(_) => Ok(Some(private_proc(host).map_err(|(call, e)| fail(ROOT_WHAT, call, c"proc", e))?)),
        None => Ok(None),
    }
}

/// bubblewrap's `--exec-label`: the attribute file, the label, and the
/// words for its failure.
type ExecLabel<'a> = (OwnedFd, &'a [u8], &'a str);

/// Step 6: this thread's `exec` attribute, opened while the caller's /proc
/// is visible (the new root may have none), written before COMMAND starts
/// (selinux.rs).
fn open_exec_label(plan: &Plan) -> Result<Option<ExecLabel<'_>>, StepFail<'_>> {
    match plan.nested.as_ref().and_then(|n| n.exec_label.as_ref()) {
        Some((label, what)) => Ok(Some((
            crate::selinux::open_exec_attr().map_err(|e| fail(what, "", c"", e))?,
            label.as_slice(),
            what.as_str(),
        ))),
        None => Ok(None),
    }
}

fn pool_fail(f: Fail<'_>) -> StepFail<'_> {
    fail(ROOT_WHAT, f.call, c"the pool", f.errno)
}

/// Step 6: detached copies of every host source, with their
/// read-only/nosuid/nodev flags already set. A nested sandbox's tmpfs
/// content goes to its directory of the outer sandbox's pool (mounts.rs),
/// which the portal attached below an unbindable mount in its own mount
/// namespace: no recursive clone of a source carries it (nested/pool.rs).
fn clone_host_sources<'a>(
    plan: &'a Plan,
    host: BorrowedFd<'_>,
    pool: &mut mounts::Pool,
    report_fd: RawFd,
) -> Result<Clones, StepFail<'a>> {
    Clones::make(&plan.host_sources, host, pool).map_err(|(i, f)| {
        let source = &plan.host_sources[i];
        match source.overlay.as_ref().filter(|_| plan.nested.is_some()) {
            // bubblewrap's words for its overlay mount.
            Some(overlay) => overlay_failure(&overlay.failure, f.errno, report_fd),
            None => StepFail {
                action: None,
                what: &source.what,
                hint: Some("the bind source disappeared or was replaced by a symlink after it was checked")
                    .filter(|_| f.errno == Errno::ENOENT || f.errno == Errno::ELOOP),
                fail: f,
            },
        }
    })
}

/// Step 6: once cloned, the descriptors a nested sandbox's sources were
/// opened through are of no more use here.
fn close_source_fds(plan: &Plan) {
    if let Some(nested) = &plan.nested {
        for &fd in &nested.source_fds {
            // SAFETY: the plan's descriptors, closed once, here.
            let _ = unsafe { sys::close(fd) };
        }
    }
}

/// Step 6, for a nested sandbox: its sources are descriptors the worker
/// opened in its mount namespace, which a clone (or an overlay layer) must
/// be made in: they are, and this process has a namespace of its own only
/// now, whose copy of the pool hands out its directories.
fn enter_own_mount_namespace<'a>(
    host: &mut OwnedFd,
    pool: &mut mounts::Pool,
    pool_rel: Option<&'a CStr>,
) -> Result<(), StepFail<'a>> {
    sys::unshare(libc::CLONE_NEWNS).map_err(|e| fail(ROOT_WHAT, "unshare(CLONE_NEWNS)", c"", e))?;
    make_mounts_slave()?;
    *host = open_host_root()?;
    pool.reopen(host.as_fd(), pool_rel).map_err(pool_fail)
}

/// Step 6, last: every namespace of ours exists now. Sends their ids for
/// bubblewrap's status lines, which only we may read, then waits until the
/// launcher has written those (and read `--userns-block-fd`). End-of-file:
/// it gave up, and so do we.
fn send_namespace_ids(plan: &Plan, ns_ids: RawFd) {
    if ns_ids < 0 {
        return;
    }
    let ids = crate::ns_ids::namespace_ids(c"/proc/self/ns", plan.clone_flags);
    let mut go = [0u8; 1];
    if sys::write_all(ns_ids, &crate::ns_ids::namespace_ids_bytes(&ids)).is_err()
        || sys::read(ns_ids, &mut go) != Ok(1)
    {
        sys::exit_now(EXIT_SETUP_FAILED as i32);
    }
    // SAFETY: the launcher's socket for this exchange, ours, done with.
    let _ = unsafe { sys::close(ns_ids) };
}

/// Step 7. A fresh tmpfs (for a nested sandbox, a directory of the pool),
/// stacked on top of `/` in our namespace, becomes the new root, built
/// step by step, in the planned order, through its descriptor, which is
/// returned. `host` and `pool` are closed once it is built.
fn build_new_root<'a>(
    plan: &'a Plan,
    host: OwnedFd,
    mut pool: mounts::Pool,
    clones: &mut Clones,
    report_fd: RawFd,
) -> Result<OwnedFd, StepFail<'a>> {
    let mut new = match pool.is_some() {
        true => pool
            .tmpfs(0o755, &[], libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV)
            .map_err(|f| fail(ROOT_WHAT, f.call, c"the pool", f.errno))?,
        false => new_root(&plan.root_tmpfs).map_err(|(call, e)| fail(ROOT_WHAT, call, c"tmpfs", e))?,
    };
    sys::move_mount_fd(new.as_fd(), host.as_fd()).map_err(|e| fail(ROOT_WHAT, "move_mount", c"/", e))?;
    // `host` still names the caller's tree below the new root: a mount on
    // `/` replaces the new root there, and a bind of the caller's /proc is
    // cloned from there when a fresh one is refused.
    let mut dirs = mounts::Dirs::new();
    for step in &plan.steps {
        dirs.set_parents(step.parents);
        mounts::run(&step.action, &mut new, host.as_fd(), clones, &mut dirs, &mut pool, report_fd).map_err(
            |f| StepFail {
                what: &step.what,
                hint: step_hint(&step.action, &f),
                fail: f,
                action: Some(&step.action),
            },
        )?;
    }
    drop(dirs);
    drop(pool);
    drop(host);
    // The idmapped trees are attached; PID 1 keeps no descriptor of them.
    for &fd in &plan.kept_fds {
        // SAFETY: the plan's descriptors are the launcher's; this copy of
        // the plan is never dropped in the child (it leaves with `_exit`),
        // so nothing closes these numbers a second time.
        let _ = unsafe { sys::close(fd) };
    }
    Ok(new)
}

/// Step 8. Enters the new root and detaches everything underneath it: the
/// host's whole tree goes with one lazy unmount.
fn enter_new_root<'a>(new: OwnedFd) -> Result<(), StepFail<'a>> {
    let enter_what = "enter the new root";
    sys::fchdir(new.as_fd()).map_err(|e| fail(enter_what, "fchdir", c"/", e))?;
    drop(new);
    sys::pivot_root(c".", c".").map_err(|e| fail(enter_what, "pivot_root", c".", e))?;
    sys::umount2(c".", libc::MNT_DETACH).map_err(|e| fail(enter_what, "umount2(MNT_DETACH)", c".", e))?;
    sys::chdir(c"/").map_err(|e| fail(enter_what, "chdir", c"/", e))
}

/// Step 9: the sandbox's hostname, if it has one.
fn set_hostname(plan: &Plan) -> Result<(), StepFail<'_>> {
    if let Some(hostname) = &plan.hostname {
        sys::sethostname(hostname).map_err(|e| match plan.nested {
            Some(_) => fail("Can't set hostname to ", "", hostname, e),
            None => fail("set the hostname", "sethostname", hostname, e),
        })?;
    }
    Ok(())
}

/// Step 9: in a private network namespace, loopback. A proxied network:
/// the egress listener, on the loopback just brought up, goes out to
/// whoever serves the proxy; PID 1 keeps neither it nor the socket it went
/// out on.
fn set_up_network<'a>(plan: &Plan, egress: RawFd) -> Result<(), StepFail<'a>> {
    if plan.network_off {
        sys::loopback_up().map_err(|e| fail("bring up loopback", "ioctl(SIOCSIFFLAGS)", c"lo", e))?;
    }
    if plan.egress {
        crate::egress::hand_out(egress)
            .map_err(|(call, e)| fail("hand out the egress listener", call, c"", e))?;
        // SAFETY: the caller's socket, inherited for this one message;
        // nothing else in this process uses or closes it.
        let _ = unsafe { sys::close(egress) };
    }
    Ok(())
}

/// Step 11. The command's working directory: the first candidate that
/// works; the first candidate's error if none does.
fn enter_working_directory(plan: &Plan) -> Result<(), StepFail<'_>> {
    let mut first_error = None;
    for dir in &plan.cwd {
        match sys::chdir(dir) {
            Ok(()) => {
                first_error = None;
                break;
            }
            Err(e) => {
                first_error.get_or_insert((dir, e));
            }
        }
    }
    if let Some((dir, e)) = first_error {
        return Err(match plan.nested {
            Some(_) => fail("Can't chdir to ", "", dir, e),
            None => fail("enter the working directory", "chdir", dir, e),
        });
    }
    Ok(())
}

/// Step 11: bubblewrap's `--lock-file`s, held by this process for the
/// sandbox's life (a read lock, as bubblewrap takes), opened from the
/// command's working directory as bubblewrap's reaper does.
fn take_lock_files(plan: &Plan) -> Result<(), StepFail<'_>> {
    if let Some(nested) = &plan.nested {
        for lock in &nested.lock_files {
            let fd =
                sys::open(&lock.path, libc::O_RDONLY, 0).map_err(|e| fail(&lock.open_fail, "", c"", e))?;
            sys::read_lock(fd.as_raw_fd()).map_err(|e| fail(&lock.lock_fail, "", c"", e))?;
            // Held until this process exits.
            std::mem::forget(fd);
        }
    }
    Ok(())
}

/// Step 11b. A nested sandbox asked for its own user namespace: made only
/// now, so that every mount above (a fresh /proc included) was made in the
/// outer sandbox's user namespace, where nothing is locked. `proc_self` is
/// closed before this returns. True when released user-namespace helpers
/// are left to reap.
fn enter_nested_userns(
    plan: &Plan,
    proc_self: Option<PrivateProc>,
    sync: RawFd,
) -> Result<bool, StepFail<'_>> {
    // bubblewrap's `--userns2`: the caller's other user namespace.
    if let Some(fd) = plan.nested.as_ref().and_then(|n| n.userns2_fd) {
        sys::setns(fd, libc::CLONE_NEWUSER).map_err(|e| fail("Setting userns2 failed", "", c"", e))?;
    }
    let mut helpers_left = false;
    if let (Some(nested), Some(proc_self), Some(holder)) = (&plan.nested, &proc_self, &plan.holder_filter) {
        enter_userns(nested, &holder.filter, proc_self.view(), sync)?;
        helpers_left = true;
    }
    drop(proc_self);
    Ok(helpers_left)
}

/// Step 11b. PID 1 holds the launcher's memory: out of the command's reach
/// from here on, whether Landlock is enforced or not (confine.rs). After
/// the last credential change, which may reset the flag (to the host's
/// `fs.suid_dumpable`); a nested sandbox's PID 1 has been non-dumpable all
/// along, a fork of the non-dumpable portal worker. A bwrap run on the host
/// leaves it as bubblewrap does: its caller reads `/proc/PID/ns` of the
/// `child-pid` it reports, and the command is the caller's anyway.
fn make_pid1_undumpable<'a>(plan: &Plan) -> Result<(), StepFail<'a>> {
    if !plan.nested.as_ref().is_some_and(|n| n.dumpable) {
        crate::confine::make_undumpable().map_err(|e| {
            fail("keep PID 1 out of the command's reach", "prctl(PR_SET_DUMPABLE, 0)", c"", e)
        })?;
    }
    Ok(())
}

/// Step 12. Drops privileges for good, in PID 1 before the fork, so the
/// command inherits nothing and the reaper keeps nothing while the command
/// runs: no_new_privs, then empty bounding, ambient, effective, permitted
/// and inheritable capability sets (a nested command's `--cap-add`s are
/// kept, inside its own user namespace). Then bubblewrap's checks and
/// descriptors of that moment.
fn drop_privileges_for_good<'a>(
    plan: &Plan,
    bwrap_host: Option<&HostChild>,
    report_fd: RawFd,
) -> Result<(), StepFail<'a>> {
    let keep_caps = plan.nested.as_ref().map_or(0, |n| n.keep_caps);
    match bwrap_host {
        Some(h) => bubblewrap_caps(h.caps).map_err(|(what, call, e)| fail(what, call, c"", e))?,
        None => {
            drop_privileges_keeping(keep_caps).map_err(|(call, e)| fail("drop privileges", call, c"", e))?
        }
    }
    if let Some(n) = &plan.nested {
        if (n.disable_userns || n.assert_userns_disabled) && sys::unshare(libc::CLONE_NEWUSER).is_ok() {
            report_and_exit("creation of new user namespaces was not disabled as requested", report_fd);
        }
        // `--block-fd`: wait for the caller's go (bubblewrap goes on after
        // a read error too), then close it.
        if let Some(fd) = n.block_fd {
            let mut byte = [0u8; 1];
            let _ = sys::read(fd, &mut byte);
            if bwrap_host.is_some_and(|h| h.held.contains(&fd)) {
                // SAFETY: a descriptor only PID 1 holds, closed once here.
                let _ = unsafe { sys::close(fd) };
            }
        }
    }
    for &fd in bwrap_host.map_or(&[][..], |h| &h.held_stdio) {
        // SAFETY: our own copy of the caller's standard descriptor, which
        // COMMAND must not inherit; nothing here uses it any more.
        let _ = unsafe { sys::close(fd) };
    }
    Ok(())
}

/// Step 13. Starts the command (PID 2), which shares our memory until its
/// `execve` while we wait; this process then becomes the reaper. From here
/// on the launcher relays signals instead of ending the setup; they stay
/// blocked here until the reaper relays them.
fn start_command<'a>(
    plan: &'a Plan,
    fds: &ChildFds,
    caller_umask: libc::mode_t,
    helpers_left: bool,
) -> Result<std::convert::Infallible, StepFail<'a>> {
    let _ = sys::write_all(fds.exit, &[crate::init::EXIT_STARTING]);
    if plan.nested.as_ref().is_some_and(|n| n.exec_in_pid1) {
        // bubblewrap's `--as-pid-1`: no reaper; the launcher waits for this
        // process itself. Every pipe of ours is close-on-exec. The released
        // user-namespace helpers (`join_made_userns`), our only children,
        // are reaped first: COMMAND must not inherit them.
        if helpers_left {
            while sys::waitpid(-1, 0).is_ok() {}
        }
        exec_command(plan, fds.report, caller_umask);
    }
    let start = CommandStart { plan, report: fds.report, umask: caller_umask };
    let start = &start as *const CommandStart as *mut _;
    // SAFETY: `command_main` only execs or `_exit`s, and changes nothing we
    // use afterwards (it resets its own signal dispositions, umask and
    // descriptors, which are its own: no CLONE_SIGHAND/FS/FILES). This
    // process is single-threaded and starts PID 2 once, on the stack the
    // plan holds for it; `start` outlives the child's use of it, since we
    // are suspended until the child execs or exits.
    let pid = unsafe { sys::spawn_vfork(&plan.command_stack, command_main, start) }
        .map_err(|e| fail("start the command", "clone(CLONE_VM|CLONE_VFORK)", c"", e))?;
    // The report pipe now belongs to the command: its close-on-exec end is
    // what tells the launcher the exec happened.
    for fd in [fds.report, fds.sync, fds.ack] {
        if fd >= 0 {
            // SAFETY: descriptors this process owns (the launcher made them
            // for it) and no longer uses; nothing else closes them.
            let _ = unsafe { sys::close(fd) };
        }
    }
    if let Some(nested) = &plan.nested {
        // The caller's descriptors are the command's now; the reaper keeps
        // neither them nor the capabilities it kept for the command.
        for &(_, source) in &nested.fds {
            // SAFETY: descriptors this process no longer uses, closed once.
            let _ = unsafe { sys::close(source) };
        }
        // bubblewrap's reaper keeps no capability either.
        if nested.keep_caps != 0 || nested.host.is_some() {
            let _ = drop_privileges();
        }
    }
    // Everything PID 1 does besides reaping is done by now: the reaper's
    // own seccomp filter (init.rs) allows nothing else.
    crate::confine::forget(&plan.exec.envp, &plan.command_stack);
    crate::init::reap(pid, fds.exit, &plan.reaper_filter.filter)
}

/// bubblewrap's report of a failed overlay mount (`failure` names it);
/// PID 1 ends.
fn overlay_failure(failure: &str, errno: Errno, report_fd: RawFd) -> ! {
    let mut report = Report::new();
    let _ = match errno {
        Errno::ELOOP => write!(report, "{failure}: Overlay directories may not overlap"),
        Errno::ENOSPC => write!(
            report,
            "{failure}: Limit exceeded (ENOSPC). (Hint: Check that /proc/sys/fs/mount-max is sufficient, typically 100000)"
        ),
        e => write!(report, "{failure}: {}", e.desc()),
    };
    report.send(report_fd, EXIT_SETUP_FAILED);
    sys::exit_now(EXIT_SETUP_FAILED as i32)
}

/// no_new_privs and no capabilities at all, in this process and whatever
/// it executes.
pub(crate) fn drop_privileges() -> Result<(), (&'static str, Errno)> {
    drop_privileges_keeping(0)
}

/// no_new_privs, and only the capabilities in `keep` (a bit mask), in every
/// set including the bounding and ambient ones, so they survive `execve`.
pub(crate) fn drop_privileges_keeping(keep: u64) -> Result<(), (&'static str, Errno)> {
    sys::prctl5(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).map_err(|e| ("prctl(PR_SET_NO_NEW_PRIVS)", e))?;
    // Every capability the kernel knows, until it says EINVAL past the last.
    for cap in 0..64u64 {
        if keep & (1 << cap) != 0 {
            continue;
        }
        match sys::prctl5(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) {
            Ok(_) => {}
            Err(Errno::EINVAL) if cap > 0 => break,
            Err(e) => return Err(("prctl(PR_CAPBSET_DROP)", e)),
        }
    }
    sys::prctl5(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0)
        .map_err(|e| ("prctl(PR_CAP_AMBIENT_CLEAR_ALL)", e))?;
    sys::capset_to(keep).map_err(|e| ("capset", e))?;
    for cap in (0..64u64).filter(|c| keep & (1 << c) != 0) {
        sys::prctl5(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
            cap as libc::c_ulong,
            0,
            0,
        )
        .map_err(|e| ("prctl(PR_CAP_AMBIENT_RAISE)", e))?;
    }
    Ok(())
}

/// bubblewrap's capabilities for COMMAND: no_new_privs; the bounding set
/// reduced to the requested ones in a user namespace it made; the sets
/// `capset` to them (a refusal ignored for root, whose sets then stay as
/// they were); the requested ones made ambient where the kernel lets it.
fn bubblewrap_caps(caps: crate::prepare::BwrapCaps) -> Result<(), (&'static str, &'static str, Errno)> {
    let what = "drop privileges";
    sys::prctl5(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        .map_err(|e| (what, "prctl(PR_SET_NO_NEW_PRIVS)", e))?;
    let kept = |cap: u64| caps.requested & (1 << cap) != 0;
    if caps.bound {
        for cap in (0..64u64).filter(|&c| !kept(c)) {
            match sys::prctl5(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) {
                Ok(_) | Err(Errno::EINVAL | Errno::EPERM) => {}
                Err(e) => return Err(("Dropping capability from bounds", "", e)),
            }
        }
    }
    if caps.set {
        match sys::capset_to(caps.requested) {
            Ok(()) => {}
            Err(Errno::EPERM) if caps.root => {}
            Err(e) => return Err(("capset failed", "", e)),
        }
    }
    for cap in (0..64u64).filter(|&c| kept(c)) {
        let raise = libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong;
        match sys::prctl5(libc::PR_CAP_AMBIENT, raise, cap as libc::c_ulong, 0, 0) {
            Ok(_) | Err(Errno::EPERM | Errno::EINVAL) => {}
            Err(e) => return Err(("Adding ambient capability", "", e)),
        }
    }
    Ok(())
}

/// A nested sandbox's own user namespaces, in order (`nested.userns`),
/// then its inner ids, with the parent-death signal re-armed (the
/// credential change may have cleared it).
///
/// PID 1 is never dumpable on the way. Its `/proc` files belong to the root
/// of the launcher's user namespace while it is not, and an unprivileged
/// owner is not that root: writing its own id maps would need it dumpable,
/// and for that moment the outer command, which owns the new namespace and
/// so holds `CAP_SYS_PTRACE` in it, could open `/proc/1/mem` and keep the
/// descriptor (a held descriptor outlives the moment: PID 1's code then
/// runs whatever was written there, with no filter). So each namespace is
/// made by a helper forked for it ([`hold_userns`]), which installs its own
/// allowlist filter before it becomes dumpable; PID 1 writes the helper's
/// maps, which it may as a process of the parent namespace with
/// `CAP_SETUID` there, joins the namespace with `setns`, and lets the
/// helper go. `proc` is a procfs in which the helper can be found (a fresh
/// one of the nested pid namespace, or a private copy of an ancestor's).
fn enter_userns<'a>(
    nested: &'a crate::prepare::NestedChild,
    holder: &[libc::sock_filter],
    proc: ProcView<'_>,
    sync: RawFd,
) -> Result<(), StepFail<'a>> {
    for userns in &nested.userns {
        if userns.limit_first {
            // In the namespace PID 1 is in now, the sandbox's own (made
            // above, or by the launcher on the host), never an outer one.
            let what = "disable user namespaces";
            let name = c"sys/user/max_user_namespaces";
            let file =
                sys::openat(proc.dir, name, libc::O_WRONLY, 0).map_err(|e| fail(what, "open", name, e))?;
            sys::write_all(file.as_raw_fd(), b"1").map_err(|e| fail(what, "write", name, e))?;
        }
        join_made_userns(&userns.maps, holder, proc)
            .map_err(|(call, arg, e)| fail("create the user namespace", call, arg, e))?;
    }
    let what = "create the user namespace";
    let (uid, gid) = nested.inner_ids;
    sys::setresgid(gid).map_err(|e| fail(what, "setresgid", c"", e))?;
    sys::setresuid(uid).map_err(|e| fail(what, "setresuid", c"", e))?;
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        .map_err(|e| fail(what, "prctl(PR_SET_PDEATHSIG)", c"", e))?;
    if launcher_gone(sync) {
        sys::exit_now(EXIT_SETUP_FAILED as i32);
    }
    Ok(())
}

/// What the user-namespace helper failed at, by the number it reports.
const HOLDER_STEPS: [&str; 4] = [
    "close_range",
    "unshare(CLONE_NEWUSER)",
    "seccomp(SECCOMP_SET_MODE_FILTER)",
    "prctl(PR_SET_DUMPABLE, 1)",
];

type SysFail = (&'static str, &'static CStr, Errno);

/// A new user namespace, a child of this process's, with `maps` written,
/// joined by this process. See [`enter_userns`].
fn join_made_userns(
    maps: &(CString, CString),
    filter: &[libc::sock_filter],
    proc: ProcView<'_>,
) -> Result<(), SysFail> {
    let (ready_r, ready_w) = sys::pipe().map_err(|e| ("pipe2", c"", e))?;
    let (done_r, done_w) = sys::pipe().map_err(|e| ("pipe2", c"", e))?;
    // SAFETY: PID 1 is single-threaded; the helper never returns here.
    let pid = match unsafe { sys::fork() } {
        Ok(0) => {
            drop((ready_r, done_w));
            hold_userns(ready_w, done_r, filter)
        }
        Ok(pid) => pid,
        Err(e) => return Err(("fork", c"", e)),
    };
    let holder = Holder { pid, done: Some(done_w) };
    drop((ready_w, done_r));
    let mut word = [0u8; 4];
    match sys::read(ready_r.as_raw_fd(), &mut word) {
        Ok(4) => {}
        Ok(_) => return Err(("read", c"the helper's report", Errno::EPIPE)),
        Err(e) => return Err(("read", c"the helper's report", e)),
    }
    let word = u32::from_ne_bytes(word);
    if word != 0 {
        let call = HOLDER_STEPS.get((word >> 16) as usize).copied().unwrap_or("the helper");
        return Err((call, c"", Errno::from_raw((word & 0xffff) as i32)));
    }
    let dir = proc_dir_of(proc, holder.pid)?;
    let open =
        |name: &'static CStr, flags| sys::openat(dir.as_fd(), name, flags, 0).map_err(|e| ("open", name, e));
    let setgroups = open(c"setgroups", libc::O_WRONLY)?;
    let uid_map = open(c"uid_map", libc::O_WRONLY)?;
    let gid_map = open(c"gid_map", libc::O_WRONLY)?;
    let userns = open(c"ns/user", libc::O_RDONLY)?;
    for (file, name, contents) in [
        (&setgroups, c"setgroups", c"deny"),
        (&uid_map, c"uid_map", maps.0.as_c_str()),
        (&gid_map, c"gid_map", maps.1.as_c_str()),
    ] {
        sys::write_all(file.as_raw_fd(), contents.to_bytes()).map_err(|e| ("write", name, e))?;
    }
    sys::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER).map_err(|e| ("setns(CLONE_NEWUSER)", c"", e))?;
    holder.release();
    Ok(())
}

/// The user-namespace helper: alone with its two pipes, it makes the
/// namespace, installs the holder's allowlist filter, and only then
/// becomes dumpable (so that PID 1, its parent, may open its `/proc`
/// files); reports, then waits for PID 1 to close `done`. Whatever is
/// written into its memory meanwhile can only read, write and leave.
fn hold_userns(ready: OwnedFd, done: OwnedFd, filter: &[libc::sock_filter]) -> ! {
    let steps = || -> Result<(), (u32, Errno)> {
        sys::close_all_except(&[ready.as_raw_fd(), done.as_raw_fd()], libc::c_uint::MAX)
            .map_err(|e| (0, e))?;
        sys::unshare(libc::CLONE_NEWUSER).map_err(|e| (1, e))?;
        sys::prctl5(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).map_err(|e| (2, e))?;
        sys::seccomp_set_filter(filter).map_err(|e| (2, e))?;
        sys::prctl(libc::PR_SET_DUMPABLE, 1).map_err(|e| (3, e))?;
        Ok(())
    };
    let word = match steps() {
        Ok(()) => 0,
        Err((step, e)) => step << 16 | (e as i32 as u32 & 0xffff),
    };
    let _ = sys::write_all(ready.as_raw_fd(), &word.to_ne_bytes());
    let mut byte = [0u8; 1];
    // End-of-file once PID 1 has joined the namespace (or given up).
    let _ = sys::read(done.as_raw_fd(), &mut byte);
    sys::exit_now(0)
}

/// The user-namespace helper, released (its `done` pipe closed) and reaped
/// when dropped (a setup that failed).
struct Holder {
    pid: libc::pid_t,
    done: Option<OwnedFd>,
}

impl Holder {
    /// Lets the helper go without waiting for it: it exits at once, on
    /// the other CPU, while PID 1 goes on, and the reaper (or, with
    /// `--as-pid-1`, PID 1 before its `execve`) reaps it. Until then it
    /// can only read, write and leave (docs/security.md).
    fn release(mut self) {
        drop(self.done.take());
        std::mem::forget(self);
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.done.take());
        while let Err(Errno::EINTR) = sys::waitpid(self.pid, 0) {}
    }
}

/// `pid`'s directory in `proc`. A fresh procfs of our pid namespace
/// numbers our child as `fork` did; the private copy of an ancestor's
/// `/proc` numbers it otherwise, which a pidfd's `fdinfo` tells, written in
/// that procfs's own pid namespace's numbers.
fn proc_dir_of(proc: ProcView<'_>, pid: libc::pid_t) -> Result<OwnedFd, SysFail> {
    if proc.own_numbers {
        let mut path = StackPath::new();
        let _ = write!(path, "{pid}");
        return sys::openat(proc.dir, path.as_c_str(), libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| ("open", c"/proc/PID", e));
    }
    let proc = proc.dir;
    let pidfd = sys::pidfd_open(pid).map_err(|e| ("pidfd_open", c"", e))?;
    let mut path = StackPath::new();
    let _ = write!(path, "self/fdinfo/{}", pidfd.as_raw_fd());
    let info = sys::openat(proc, path.as_c_str(), libc::O_RDONLY, 0).map_err(|e| ("open", c"fdinfo", e))?;
    let mut buf = [0u8; 1024];
    let n = sys::read(info.as_raw_fd(), &mut buf).map_err(|e| ("read", c"fdinfo", e))?;
    let seen = fdinfo_pid(&buf[..n]).ok_or(("read", c"fdinfo", Errno::ESRCH))?;
    let mut path = StackPath::new();
    let _ = write!(path, "{seen}");
    sys::openat(proc, path.as_c_str(), libc::O_PATH | libc::O_DIRECTORY, 0)
        .map_err(|e| ("open", c"/proc/PID", e))
}

/// The `Pid:` field of a pidfd's `fdinfo`.
fn fdinfo_pid(info: &[u8]) -> Option<u32> {
    let field = info.split(|&b| b == b'\n').find_map(|line| line.strip_prefix(b"Pid:\t"))?;
    let mut n: u32 = 0;
    for &d in field {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u32::from(d - b'0'))?;
    }
    (n > 0).then_some(n)
}

/// A short path formatted on the stack (the child does not allocate).
struct StackPath {
    buf: [u8; 64],
    len: usize,
}

impl StackPath {
    fn new() -> StackPath {
        StackPath { buf: [0; 64], len: 0 }
    }

    fn as_c_str(&self) -> &CStr {
        CStr::from_bytes_until_nul(&self.buf).unwrap_or(c"")
    }
}

impl std::fmt::Write for StackPath {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        // Room for the terminating NUL always stays.
        let end = self.len + s.len();
        if end >= self.buf.len() || s.contains('\0') {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// A writable procfs in which `self` is this process, detached: where a
/// nested sandbox writes its id maps. A fresh one of this pid namespace;
/// where the kernel refuses that (the outer sandbox's /proc is the bound
/// /proc of a container, procfs.rs), a private copy of the outer sandbox's
/// `/proc` below `host` made writable, in which `self` is this process too
/// (that pid namespace is an ancestor of ours). Nothing else is done
/// through it, and it is closed before the command starts.
/// `(failing call, errno)` on failure.
fn private_proc(host: std::os::fd::BorrowedFd<'_>) -> Result<PrivateProc, (&'static str, Errno)> {
    let fs = sys::fsopen(c"proc").map_err(|e| ("fsopen", e))?;
    let attrs = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC;
    // Refused where our user namespace does not own the pid namespace (a
    // bwrap run on the host without a new one): the caller's /proc then.
    let fresh = sys::fsconfig_create(fs.as_fd())
        .map_err(|e| ("fsconfig(FSCONFIG_CMD_CREATE)", e))
        .and_then(|()| sys::fsmount(fs.as_fd(), attrs).map_err(|e| ("fsmount", e)));
    let refused = match fresh {
        Ok(fresh) => return Ok(PrivateProc { dir: fresh, own_numbers: true }),
        Err((_, Errno::EPERM)) => Errno::EPERM,
        Err(e) => return Err(e),
    };
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_RECURSIVE as libc::c_uint
        | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint;
    let Ok(copy) = sys::open_tree(host, c"proc", flags) else { return Err(("fsmount", refused)) };
    if !sys::is_procfs(copy.as_fd()) {
        return Err(("fsmount", refused));
    }
    sys::mount_clearattr(copy.as_fd(), libc::MOUNT_ATTR_RDONLY)
        .map_err(|e| ("mount_setattr(proc, clear MOUNT_ATTR_RDONLY)", e))?;
    Ok(PrivateProc { dir: copy, own_numbers: false })
}

/// The procfs of [`private_proc`]: whether it numbers processes as this
/// one's pid namespace does (a fresh one) or as an ancestor's (a copy).
struct PrivateProc {
    dir: OwnedFd,
    own_numbers: bool,
}

impl PrivateProc {
    fn view(&self) -> ProcView<'_> {
        ProcView { dir: self.dir.as_fd(), own_numbers: self.own_numbers }
    }
}

/// A borrowed [`PrivateProc`].
#[derive(Clone, Copy)]
struct ProcView<'a> {
    dir: std::os::fd::BorrowedFd<'a>,
    own_numbers: bool,
}

/// Whether this process's user namespace maps both its uid and its gid
/// (`/proc/self/{uid,gid}_map` not empty).
fn ids_mapped() -> bool {
    [c"/proc/self/uid_map", c"/proc/self/gid_map"].iter().all(|path| {
        let mut byte = [0u8; 1];
        sys::open(path, libc::O_RDONLY, 0)
            .is_ok_and(|fd| matches!(sys::read(fd.as_raw_fd(), &mut byte), Ok(1)))
    })
}

/// A detached tmpfs for the new root: `(failing call, errno)` on failure.
fn new_root(options: &[(CString, Option<CString>)]) -> Result<OwnedFd, (&'static str, Errno)> {
    let fs = sys::fsopen(c"tmpfs").map_err(|e| ("fsopen", e))?;
    sys::fsconfig_set(fs.as_fd(), c"source", Some(c"tmpfs")).map_err(|e| ("fsconfig", e))?;
    sys::fsconfig_set(fs.as_fd(), c"mode", Some(c"755")).map_err(|e| ("fsconfig", e))?;
    for (key, value) in options {
        sys::fsconfig_set(fs.as_fd(), key, value.as_deref()).map_err(|e| ("fsconfig", e))?;
    }
    sys::fsconfig_create(fs.as_fd()).map_err(|e| ("fsconfig(FSCONFIG_CMD_CREATE)", e))?;
    sys::fsmount(fs.as_fd(), libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV).map_err(|e| ("fsmount", e))
}

/// True when the launcher's end of the sync pipe is closed.
fn launcher_gone(sync: RawFd) -> bool {
    sys::poll_now(sync, libc::POLLIN).is_some_and(|revents| revents & (libc::POLLHUP | libc::POLLIN) != 0)
}

/// What PID 2 needs, passed through `clone`'s argument pointer.
struct CommandStart<'a> {
    plan: &'a Plan,
    report: RawFd,
    umask: libc::mode_t,
}

extern "C" fn command_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `CommandStart` PID 1 passed to `spawn_vfork`,
    // alive while PID 1 waits for us.
    let start = unsafe { &*(arg as *const CommandStart<'_>) };
    // Never unwind onto a stack that is not ours to return on.
    let outcome =
        std::panic::catch_unwind(AssertUnwindSafe(|| exec_command(start.plan, start.report, start.umask)));
    let Err(_) = outcome;
    let mut report = Report::new();
    let _ = write!(report, "internal error: the sandbox command process panicked");
    report.send(start.report, EXIT_SETUP_FAILED);
    sys::exit_now(EXIT_SETUP_FAILED as i32)
}

/// PID 2: the last steps before `execve`, then the command itself.
fn exec_command(plan: &Plan, report_fd: RawFd, caller_umask: libc::mode_t) -> ! {
    // Signal dispositions and mask are inherited across exec; the command
    // must start with defaults (Rust's runtime ignores SIGPIPE, the
    // launcher blocks the forwarded signals).
    for sig in 1..libc::SIGRTMAX() {
        sys::reset_signal(sig);
    }
    let _ = sys::set_sigmask(libc::SIG_SETMASK, &sys::empty_sigset());
    sys::umask(caller_umask);

    harden_and_exec(
        &Hardening {
            new_session: plan.new_session,
            rlimits: &plan.limits.rlimits,
            fds: plan.nested.as_ref().map_or(&[], |n| &n.fds),
            landlock: plan.landlock.as_ref(),
            seccomp: plan.seccomp.as_ref(),
            extra_filters: plan.nested.as_ref().map_or(&[], |n| &n.extra_filters),
            exec: &plan.exec,
        },
        report_fd,
    )
}

/// What stands between a prepared process and its command: the same for
/// the sandbox's PID 2 and for a process joining a running sandbox.
pub(crate) struct Hardening<'a> {
    pub new_session: bool,
    pub rlimits: &'a [(libc::c_int, u64)],
    /// `(number in the command, descriptor now)`: the only descriptors
    /// above stderr the command gets.
    pub fds: &'a [(RawFd, RawFd)],
    pub landlock: Option<&'a crate::landlock::Plan>,
    pub seccomp: Option<&'a crate::seccomp::Program>,
    /// bubblewrap's `--seccomp` programs, after the runtime's own.
    pub extra_filters: &'a [crate::seccomp::Program],
    pub exec: &'a crate::prepare::ExecPlan,
}

/// setsid, rlimits, descriptors, Landlock, seccomp (last), then `execve`;
/// a failure is reported on `report_fd` and ends the process.
pub(crate) fn harden_and_exec(plan: &Hardening<'_>, report_fd: RawFd) -> ! {
    let mut report = Report::new();
    if let Err(Written) = harden(plan, &mut report) {
        report.send(report_fd, EXIT_SETUP_FAILED);
        sys::exit_now(EXIT_SETUP_FAILED as i32);
    }
    let code = exec_first_candidate(plan.exec, &mut report);
    report.send(report_fd, code);
    sys::exit_now(code as i32)
}

/// A step failed and its line is in the report.
struct Written;

/// Writes one failure line into `report`.
fn say(report: &mut Report, line: std::fmt::Arguments<'_>) -> Written {
    let _ = report.write_fmt(line);
    Written
}

/// Everything [`harden_and_exec`] does before `execve`, in its order.
fn harden(plan: &Hardening<'_>, report: &mut Report) -> Result<(), Written> {
    if plan.new_session {
        sys::setsid()
            .map_err(|e| say(report, format_args!("start a new session: setsid() => {}", ErrnoText(e))))?;
    }
    // Resource limits that are rlimits (only lowered, which needs no privilege).
    for (resource, value) in plan.rlimits {
        sys::setrlimit(*resource, *value).map_err(|e| {
            let e = ErrnoText(e);
            say(report, format_args!("apply resource limits: setrlimit({resource}, {value}) => {e}"))
        })?;
    }
    // Nothing the launcher had open may reach the command, except what a
    // nested sandbox's caller passed, at the numbers it had there (dup2
    // leaves the new number open across exec). The sources are numbered
    // above every target, so no target overwrites a source still needed.
    sys::close_range_cloexec(3).map_err(|e| {
        let e = ErrnoText(e);
        say(
            report,
            format_args!("close inherited descriptors: close_range(3, ~0, CLOSE_RANGE_CLOEXEC) => {e}"),
        )
    })?;
    for &(target, source) in plan.fds {
        sys::dup2(source, target)
            .map_err(|e| say(report, format_args!("pass descriptor {target}: dup2 => {}", ErrnoText(e))))?;
    }
    // Landlock, on the sandbox's own paths (we are past the final pivot).
    if let Some(ruleset) = plan.landlock {
        crate::landlock::apply(ruleset).map_err(|(call, path, e)| {
            let _ = write!(report, "apply Landlock: {call}");
            if let Some(path) = path {
                let _ = write!(report, "(\"{}\")", Lossy(path.to_bytes()));
            }
            say(report, format_args!(" => {}", ErrnoText(e)))
        })?;
    }
    // Seccomp last: everything above ran unfiltered; from here on only
    // `execve` (and, on failure, the report's `write`) remain.
    if let Some(program) = plan.seccomp {
        sys::seccomp_set_filter(&program.filter).map_err(|e| {
            let e = ErrnoText(e);
            say(report, format_args!("install the seccomp filter: seccomp(SECCOMP_SET_MODE_FILTER) => {e}"))
        })?;
    }
    for program in plan.extra_filters {
        // bubblewrap's words.
        sys::seccomp_prctl_filter(&program.filter).map_err(|e| match e {
            Errno::EINVAL => say(
                report,
                format_args!(
                    "Unable to set up system call filtering as requested: prctl(PR_SET_SECCOMP) reported EINVAL. \
                     (Hint: this requires a kernel configured with CONFIG_SECCOMP and CONFIG_SECCOMP_FILTER.)"
                ),
            ),
            e => say(report, format_args!("prctl(PR_SET_SECCOMP): {}", e.desc())),
        })?;
    }
    Ok(())
}

/// `execve` of each candidate path in turn; when none runs, the reason in
/// `report` and the exit code to end with.
fn exec_first_candidate(exec: &crate::prepare::ExecPlan, report: &mut Report) -> u8 {
    let mut denied = false;
    let mut other: Option<(Errno, &CStr)> = None;
    for candidate in &exec.candidates {
        match sys::execve(candidate, &exec.argv_ptrs, &exec.envp_ptrs) {
            Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::ENAMETOOLONG => {}
            Errno::EACCES => denied = true,
            e => {
                other = Some((e, candidate));
                break;
            }
        }
    }
    let program = Lossy(exec.program.as_bytes());
    match other {
        Some((e, path)) => {
            let _ = write!(
                report,
                "execve(\"{}\") => {}: cannot execute the command",
                Lossy(path.to_bytes()),
                ErrnoText(e)
            );
            EXIT_CANNOT_EXECUTE
        }
        None if denied => {
            let _ = write!(
                report,
                "execve(\"{program}\") => {}: the command is not executable",
                ErrnoText(Errno::EACCES)
            );
            EXIT_CANNOT_EXECUTE
        }
        None if exec.program.contains('/') => {
            let _ =
                write!(report, "execve(\"{program}\") => {}: command not found", ErrnoText(Errno::ENOENT));
            EXIT_NOT_FOUND
        }
        None => {
            let _ = write!(
                report,
                "execve(\"{program}\") => {}: command not found in PATH={}",
                ErrnoText(Errno::ENOENT),
                Lossy(exec.search_path.as_bytes())
            );
            EXIT_NOT_FOUND
        }
    }
}

/// Hints for failures of a particular kind of step.
fn step_hint(action: &Action, f: &Fail<'_>) -> Option<&'static str> {
    match (action, f.errno) {
        (Action::Proc(proc), errno) => crate::procfs::hint(proc, errno),
        (Action::Fs { .. } | Action::Bind { .. } | Action::WriteFile { .. }, Errno::EROFS) => {
            Some("the destination lies inside a read-only mount; bind a writable directory there first")
        }
        _ => None,
    }
}

/// Hints that depend only on the call and errno.
fn hint_for(call: &str, errno: Errno) -> Option<&'static str> {
    match errno {
        Errno::ENOSYS => Some(
            "this kernel lacks the new mount API (open_tree/mount_setattr/openat2): Linux 5.12 or newer is needed; \
             or a seccomp filter around the sandbox answers it with ENOSYS (systemd's RestrictSUIDSGID=)",
        ),
        Errno::ENOMEM | Errno::ENOSPC
            if call.starts_with("mount") || call == "fsmount" || call == "move_mount" =>
        {
            Some("too many mounts (fs.mount-max) or out of memory")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pidfds_pid_comes_from_its_own_line() {
        let info = b"pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nPid:\t4242\nNSpid:\t4242\t7\n";
        assert_eq!(fdinfo_pid(info), Some(4242));
        assert_eq!(fdinfo_pid(b"Pid:\t17\n"), Some(17));
        assert_eq!(fdinfo_pid(b"NSpid:\t17\n"), None, "NSpid is another field");
        assert_eq!(fdinfo_pid(b"NSpid:\t3\nPid:\t9\n"), Some(9));
        assert_eq!(fdinfo_pid(b"Pid:\t-1\n"), None, "a pidfd of a process gone");
        assert_eq!(fdinfo_pid(b"Pid:\t0\n"), None, "a process outside this procfs's namespace");
    }

    #[test]
    fn stack_paths_hold_short_paths_and_refuse_the_rest() {
        let mut p = StackPath::new();
        write!(p, "self/fdinfo/{}", 12).unwrap();
        assert_eq!(p.as_c_str(), c"self/fdinfo/12");
        let mut p = StackPath::new();
        assert!(write!(p, "{}", "x".repeat(64)).is_err());
        assert!(write!(p, "a\0b").is_err());
    }
}
