//! A checked [`Request`] → the runtime's own description of a sandbox: a
//! [`SandboxSpec`] whose mounts are the request's operations in order, and
//! the nested parts of its [`Plan`]. Sources are resolved here, in the
//! outer sandbox's view (the worker has entered its mount namespace), so a
//! path that the outer sandbox does not show does not exist for a nested one.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use libc::c_ulong;

use super::request::{BindMode, DataKind, Op, OverlayKind, Request, RequestError, dest};
use crate::prepare::{BwrapCaps, HostChild, LockFile, NestedChild, NestedParts, Plan, UserNs};
use crate::seccomp::{Program, SeccompPolicy};
use crate::spec::{Access, MountOp, NestedUserns, Network, SandboxSpec};

/// The filter every nested command of the sandbox of `spec` runs under:
/// the sandbox's own program (`outer`), or, with `--nested-userns on` and
/// a built-in profile, that profile with the command's own user, mount and
/// pid namespaces let through (`seccomp::compile_nested`). A profile file
/// is taken as written (its author decides), and `unconfined` stays
/// without a filter. Compiled once per sandbox, by the portal's server.
pub(crate) fn command_filter(spec: &SandboxSpec, outer: Option<&Program>) -> Option<Program> {
    let security = &spec.security;
    if security.nested_userns == NestedUserns::Off || !matches!(security.seccomp, SeccompPolicy::Builtin(_)) {
        return outer.cloned();
    }
    let sockets = spec.sockets();
    // A built-in profile compiled when the sandbox started: this cannot
    // fail but for memory, and the sandbox's own filter is then the answer.
    crate::seccomp::compile_nested(&security.seccomp, security.allow_ptrace, sockets)
        .unwrap_or_else(|_| outer.cloned())
}

/// Builds the nested sandbox's plan. `fds` came with the request; they are
/// renumbered above every number the command will see them at, where the
/// nested sandbox's PID 1 keeps them (the caller closes its copies once
/// that process exists, see [`crate::launch`]). COMMAND runs under
/// `seccomp` ([`command_filter`]).
pub(crate) fn prepare(
    req: &Request,
    fds: Vec<OwnedFd>,
    floor: RawFd,
    outer_spec: &SandboxSpec,
    (outer, seccomp): (&Plan, Option<&Program>),
    pool: &str,
) -> Result<Plan, RequestError> {
    req.check_served(fds.len(), outer.user_is_host_root)?;
    let proc_mode = outer_proc_mode(outer_spec);
    let opened = open_sources(req, &outer.masked)?;
    let highest = opened.iter().flatten().map(AsRawFd::as_raw_fd).fold(floor, RawFd::max);
    let (targets, fd_base) =
        renumber(&req.fds, fds, highest).map_err(|e| RequestError::Invalid(format!("descriptors: {e}")))?;
    let (source_fds, mut paths) = move_sources(opened, fd_base, targets.len())?;

    // No nested tmpfs may be larger than the outer sandbox's own (each is
    // memory the outer limits may not count, docs/security.md).
    let tmpfs_cap = tmpfs_cap(outer_spec);
    let view = View { proc_mode, tmpfs_cap: Some(tmpfs_cap), portal: true };
    let mounts = mounts(req, &view, &mut |_, _| Ok(paths.pop_front().flatten()))?;

    // The mount namespace is made by the nested PID 1 itself, once it has
    // cloned the sources (child.rs).
    let mut flags = libc::CLONE_NEWPID as c_ulong;
    flags |= unshare_flags(req);
    // Inside the outer sandbox's user namespace we are its user.
    let (outer_uid, outer_gid) = (outer_spec.user.uid, outer_spec.user.gid);
    let inner = (req.uid.unwrap_or(outer_uid), req.gid.unwrap_or(outer_gid));
    let userns = nested_userns(req, inner, (outer_uid, outer_gid));
    let block_fd = source_of(req.block_fd, &targets);
    let userns2_fd = source_of(req.userns2_fd, &targets);

    let mut spec = spec(req, mounts, outer_spec.user.clone());
    spec.security = outer_spec.security.clone();
    let parts = NestedParts {
        clone_flags: flags,
        program: req.command[0].clone(),
        hostname: req.hostname.clone(),
        cwd: cwd(req),
        pool: Some(pool.to_string()),
        fd_sources: true,
        new_session: true,
        ids: None,
        seccomp: seccomp.cloned(),
        rlimits: outer.limits.rlimits.clone(),
        landlock: outer_spec.security.landlock,
        landlock_fs: outer_spec.security.nested_userns == NestedUserns::Off,
        overlay_userxattr: true,
        file_label: None,
        child: NestedChild {
            userns,
            inner_ids: if req.unshare.user { inner } else { (outer_uid, outer_gid) },
            keep_caps: req.caps.unwrap_or(0),
            host: None,
            fds: targets,
            fd_base,
            source_fds,
            extra_filters: programs(req),
            exec_in_pid1: req.as_pid_1,
            block_fd,
            userns2_fd,
            lock_files: lock_files(req)?,
            disable_userns: req.disable_userns,
            assert_userns_disabled: req.assert_userns_disabled,
            dumpable: false,
            exec_label: None,
        },
    };
    Plan::prepare_nested(&spec, parts).map_err(|e| RequestError::Invalid(e.to_string()))
}

/// `--proc` as the outer sandbox's /proc was asked for: where the kernel
/// refused the outer one a fresh procfs (inside a container) it refuses
/// the nested one too, and `auto` then binds the outer /proc read-only,
/// which shows no more than the outer sandbox already sees.
fn outer_proc_mode(outer_spec: &SandboxSpec) -> crate::ProcMode {
    outer_spec
        .mounts
        .iter()
        .find_map(|op| match op {
            MountOp::Proc { mode, .. } => Some(*mode),
            _ => None,
        })
        .unwrap_or_default()
}

/// Every source of the request's operations, in order (`None` for a
/// missing optional one). Each is opened once, here, in the outer
/// sandbox's view (this process's, in which the portal is not mounted:
/// pool.rs), and what it is open on is what the nested PID 1 clones:
/// nothing is looked up by path again. An overlay layer must not be one of
/// the outer sandbox's `masked` paths.
fn open_sources(req: &Request, masked: &[String]) -> Result<Vec<Option<OwnedFd>>, RequestError> {
    let pool_devs = super::pool::devs();
    let mut opened = Vec::new();
    for op in &req.ops {
        for (src, optional, layer) in sources_of(op) {
            let fd = open_source(&req.cwd, src, optional, &pool_devs)?;
            if let (Some(fd), true) = (&fd, layer) {
                unmasked(fd, src, masked)?;
            }
            opened.push(fd);
        }
    }
    Ok(opened)
}

/// Moves the opened sources right after the command's `targets`
/// descriptors (from `fd_base`): their numbers, and the
/// `/proc/self/fd/N` path each source is then known by, in order.
fn move_sources(
    opened: Vec<Option<OwnedFd>>,
    fd_base: RawFd,
    targets: usize,
) -> Result<(Vec<RawFd>, VecDeque<Option<PathBuf>>), RequestError> {
    let mut source_fds = Vec::new();
    let mut paths = VecDeque::new();
    for fd in opened {
        paths.push_back(match fd {
            Some(fd) => {
                let want = fd_base + (targets + source_fds.len()) as RawFd;
                let moved =
                    move_to(fd, want).map_err(|e| RequestError::Invalid(format!("descriptors: {e}")))?;
                source_fds.push(moved);
                Some(PathBuf::from(format!("/proc/self/fd/{moved}")))
            }
            None => None,
        });
    }
    Ok((source_fds, paths))
}

/// The nested command's own user namespace, made after the mounts; with
/// `--disable-userns`, the limit is set in that one and one more is made
/// inside it (bubblewrap's order): the outer sandbox's own limit is never
/// touched.
fn nested_userns(req: &Request, inner: (u32, u32), outer: (u32, u32)) -> Vec<UserNs> {
    let mut userns = Vec::new();
    if req.unshare.user || req.disable_userns {
        userns.push(UserNs { maps: id_maps(inner, outer), limit_first: false });
    }
    if req.disable_userns {
        userns.push(UserNs { maps: id_maps(inner, inner), limit_first: true });
    }
    userns
}

/// What a bwrap run on the host (`tuixiu-sandbox bwrap` outside any
/// sandbox of ours) takes besides the request: bubblewrap's options that
/// only the process starting the sandbox can serve, and our extras.
#[derive(Clone, Debug, Default)]
pub struct HostOptions {
    /// `--userns FD`: use this user namespace instead of making one.
    pub userns_fd: Option<RawFd>,
    /// `--pidns FD`: start in this pid namespace (a new one inside it
    /// only with `--unshare-pid`).
    pub pidns_fd: Option<RawFd>,
    /// `--tx-seccomp`: the runtime's seccomp profile for COMMAND (none
    /// by default, as bubblewrap).
    pub seccomp: Option<crate::SeccompPolicy>,
    /// `--tx-landlock`: Landlock on the sandbox's view (off by default).
    pub landlock: crate::LandlockMode,
    /// The caller is root: its effective capability set, which COMMAND
    /// keeps (left untouched) when `Request::caps` is not given.
    pub root_caps: Option<u64>,
    /// `--sync-fd`: held by the sandbox's PID 1, not COMMAND's (unless
    /// `--as-pid-1` makes COMMAND PID 1).
    pub sync_fd: Option<RawFd>,
    /// `--userns-block-fd`: the caller writes the id maps.
    pub caller_maps: bool,
    /// bubblewrap's `--exec-label` and `--file-label` (SELinux contexts,
    /// checked by the front end where SELinux is enabled, selinux.rs).
    pub exec_label: Option<String>,
    pub file_label: Option<String>,
}

// Just over ~80 lines: after the few decisions at its top it is a single
// literal of the nested parts, field by field, each with the bubblewrap
// rule it follows; split up, the rules would lose their neighbours.
/// The plan of a bwrap run on the host: the request's view from the
/// caller's own, bubblewrap's namespaces and id map, no hardening beyond
/// bubblewrap's unless asked. `fds` are the caller's descriptors COMMAND
/// gets (`req.fds`, same order), `floor` the highest other one open.
pub(crate) fn prepare_host(
    req: &Request,
    fds: Vec<OwnedFd>,
    floor: RawFd,
    host: &HostOptions,
) -> Result<Plan, RequestError> {
    req.check(fds.len())?;
    // bubblewrap's pid namespace: with `--unshare-pid`; here also where a
    // reaper must hold `--lock-file`s or `--sync-fd` (ours is its PID 1).
    let needs_reaper = !req.lock_files.is_empty() || host.sync_fd.is_some();
    let new_pid = req.unshare.pid || (host.pidns_fd.is_none() && needs_reaper);
    // Without one, `--proc` is the caller's, as bubblewrap binds it.
    let proc_mode =
        if new_pid || host.pidns_fd.is_some() { crate::ProcMode::Fresh } else { crate::ProcMode::Caller };
    let view = View { proc_mode, tmpfs_cap: None, portal: false };
    let mounts = mounts(req, &view, &mut |src, optional| source(&req.cwd, src, optional))?;

    let (own_uid, own_gid) = crate::prepare::own_ids();
    let new_user = req.unshare.user && host.userns_fd.is_none();
    let inner = (req.uid.unwrap_or(own_uid), req.gid.unwrap_or(own_gid));
    let flags = host_clone_flags(req, new_pid, new_user);
    let (mut targets, fd_base) =
        renumber(&req.fds, fds, floor).map_err(|e| RequestError::Invalid(format!("descriptors: {e}")))?;
    let block_fd = source_of(req.block_fd, &targets);
    let userns2_fd = source_of(req.userns2_fd, &targets);
    let (held, held_stdio) = hold_consumed(req, host, &mut targets);
    let seccomp = host_seccomp(host)?;
    let spec = spec(req, mounts, bwrap_user(inner));
    let caps = bwrap_caps(req, host, new_user);
    let parts = NestedParts {
        clone_flags: flags,
        program: req.command[0].clone(),
        hostname: req.hostname.clone(),
        cwd: cwd(req),
        pool: None,
        fd_sources: false,
        new_session: req.new_session,
        ids: new_user.then_some((inner.0, inner.1, own_uid, own_gid)),
        seccomp,
        rlimits: Vec::new(),
        landlock: host.landlock,
        landlock_fs: true,
        overlay_userxattr: new_user || !in_initial_userns(),
        file_label: file_label(host)?,
        child: NestedChild {
            // `--disable-userns`: one more user namespace, mapping the
            // sandbox's ids onto themselves, once the limit is set.
            userns: req
                .disable_userns
                .then(|| UserNs { maps: id_maps(inner, inner), limit_first: true })
                .into_iter()
                .collect(),
            inner_ids: inner,
            keep_caps: 0,
            host: Some(HostChild {
                caps,
                held,
                held_stdio,
                caller_maps: host.caller_maps && new_user,
                fail_at_start: None,
            }),
            fds: targets,
            fd_base,
            source_fds: Vec::new(),
            extra_filters: programs(req),
            exec_in_pid1: req.as_pid_1 || !new_pid,
            block_fd,
            userns2_fd,
            lock_files: lock_files(req)?,
            disable_userns: req.disable_userns,
            assert_userns_disabled: req.assert_userns_disabled,
            // bubblewrap's PID 1 is dumpable: its caller opens
            // /proc/CHILD-PID/ns/*. With our hardening asked for, a dumpable
            // PID 1 outside the command's filter would be the way around
            // it (its memory is writable through /proc/1/mem): not dumpable
            // then, as in `run` (docs/security.md).
            dumpable: host.seccomp.is_none() && host.landlock == crate::LandlockMode::Off,
            exec_label: exec_label(req, host)?,
        },
    };
    Plan::prepare_nested(&spec, parts).map_err(invalid)
}

/// bubblewrap's namespaces: a mount namespace, the ones `--unshare-*`
/// asks for, a pid namespace and a user namespace where decided.
fn host_clone_flags(req: &Request, new_pid: bool, new_user: bool) -> c_ulong {
    let mut flags = libc::CLONE_NEWNS as c_ulong | unshare_flags(req);
    if new_pid {
        flags |= libc::CLONE_NEWPID as c_ulong;
    }
    if new_user {
        flags |= libc::CLONE_NEWUSER as c_ulong;
    }
    flags
}

/// `--tx-seccomp`'s profile, compiled (none by default, as bubblewrap).
fn host_seccomp(host: &HostOptions) -> Result<Option<Program>, RequestError> {
    match &host.seccomp {
        Some(policy) => {
            crate::seccomp::compile(policy, false, crate::seccomp::Sockets::Profile).map_err(invalid)
        }
        None => Ok(None),
    }
}

/// The capabilities COMMAND keeps: `--cap-add`/`--cap-drop`'s set, or a
/// root caller's own.
fn bwrap_caps(req: &Request, host: &HostOptions, new_user: bool) -> BwrapCaps {
    let root = host.root_caps.is_some();
    BwrapCaps {
        requested: req.caps.or(host.root_caps).unwrap_or(0),
        set: req.caps.is_some() || !root,
        bound: new_user || host.userns_fd.is_some(),
        root,
    }
}

/// What bubblewrap consumes itself COMMAND does not get: `--block-fd`
/// (closed once read) and `--sync-fd` (its reaper's). Takes them out of
/// `targets`: the sources PID 1 holds instead, and which of the numbers
/// COMMAND would have had them at are standard streams.
fn hold_consumed(
    req: &Request,
    host: &HostOptions,
    targets: &mut Vec<(RawFd, RawFd)>,
) -> (Vec<RawFd>, Vec<RawFd>) {
    let sync_fd = host.sync_fd.filter(|_| !req.as_pid_1);
    let consumed = |target: &RawFd| Some(*target) == req.block_fd || Some(*target) == sync_fd;
    let held: Vec<RawFd> = targets.iter().filter(|(t, _)| consumed(t)).map(|&(_, source)| source).collect();
    let held_stdio: Vec<RawFd> = targets.iter().map(|&(t, _)| t).filter(|t| consumed(t) && *t < 3).collect();
    targets.retain(|(_, source)| !held.contains(source));
    (held, held_stdio)
}

/// bubblewrap's sandbox user: `inner`'s ids, no name of the caller's.
fn bwrap_user(inner: (u32, u32)) -> crate::UserView {
    crate::UserView {
        name: "bwrap".into(),
        uid: inner.0,
        gid: inner.1,
        home: "/".into(),
        shell: "/bin/sh".into(),
    }
}

/// `--file-label`, as the mount option it becomes.
fn file_label(host: &HostOptions) -> Result<Option<std::ffi::CString>, RequestError> {
    host.file_label
        .as_deref()
        .map(|l| std::ffi::CString::new(l).map_err(|_| RequestError::Invalid("--file-label".into())))
        .transpose()
}

/// `--exec-label`: the bytes written to the exec attribute, and what the
/// write is called in an error.
fn exec_label(req: &Request, host: &HostOptions) -> Result<Option<(Vec<u8>, String)>, RequestError> {
    match &host.exec_label {
        Some(label) => Ok(Some((
            crate::selinux::attr_bytes(label).map_err(|_| RequestError::Invalid("--exec-label".into()))?,
            format!("label_exec {}", req.command[0]),
        ))),
        None => Ok(None),
    }
}

fn invalid(e: crate::SpecError) -> RequestError {
    RequestError::Invalid(e.to_string())
}

/// Where the request's view comes from.
struct View {
    proc_mode: crate::ProcMode,
    /// The largest tmpfs allowed (an outer sandbox's own size).
    tmpfs_cap: Option<u64>,
    /// A nested sandbox's view (the runtime's `/dev`), not bwrap on the
    /// host (bubblewrap's).
    portal: bool,
}

/// Resolves a source (`src`, and whether it is optional) to what the
/// runtime binds: `None` for a missing optional one.
type Resolve<'a> = dyn FnMut(&str, bool) -> Result<Option<PathBuf>, RequestError> + 'a;

/// The sources an operation names, in the order [`mounts`] resolves them:
/// `(path, optional, an overlay layer)`.
fn sources_of(op: &Op) -> Vec<(&str, bool, bool)> {
    match op {
        Op::Bind { src, optional, .. } => vec![(src.as_str(), *optional, false)],
        Op::Overlay { sources, kind, .. } => {
            let mut all: Vec<(&str, bool, bool)> =
                sources.iter().map(|s| (s.as_str(), false, true)).collect();
            if let OverlayKind::Rw { upper, work } = kind {
                all.push((upper.as_str(), false, true));
                all.push((work.as_str(), false, true));
            }
            all
        }
        _ => Vec::new(),
    }
}

/// The request's operations as the runtime's mount operations, in order;
/// `resolve` is called for each source [`sources_of`] names, in order.
fn mounts(req: &Request, view: &View, resolve: &mut Resolve<'_>) -> Result<Vec<MountOp>, RequestError> {
    let mut mounts = Vec::with_capacity(req.ops.len());
    for op in &req.ops {
        let dst = dest(op.dst())?;
        let mount = match op {
            Op::Bind { src, mode, optional, .. } => {
                let Some(real) = resolve(src, *optional)? else { continue };
                match mode {
                    BindMode::Rw => MountOp::Bind { src: real, dst, access: Access::Rw },
                    BindMode::Ro => MountOp::Bind { src: real, dst, access: Access::Ro },
                    BindMode::Dev => MountOp::DevBind { src: real, dst },
                }
            }
            Op::RemountRo { .. } => MountOp::RemountRo { dst },
            // bubblewrap's `--size`, at most the outer sandbox's tmpfs size;
            // without it, that size (Plan::prepare_nested).
            Op::Tmpfs { mode, size, .. } => MountOp::Tmpfs {
                dst,
                mode: *mode,
                owned_by_user: false,
                size: match view.tmpfs_cap {
                    Some(cap) => size.map(|s| s.min(cap)),
                    None => *size,
                },
            },
            Op::Dir { mode, .. } => MountOp::Dir { dst, mode: *mode },
            Op::Symlink { target, .. } => MountOp::Symlink { target: target.clone(), dst },
            Op::Proc { .. } => MountOp::Proc { dst, mode: view.proc_mode },
            // bubblewrap's own layout on the host (a nested sandbox keeps
            // the runtime's read-only one).
            Op::Dev { .. } => MountOp::Dev { dst, bwrap: !view.portal },
            Op::Mqueue { .. } => MountOp::Mqueue { dst },
            Op::Data { contents, mode, how, .. } => match how {
                DataKind::File => MountOp::CreateFile { dst, contents: contents.clone(), mode: *mode },
                DataKind::Bind | DataKind::RoBind => MountOp::BindData {
                    dst,
                    contents: contents.clone(),
                    mode: *mode,
                    access: if *how == DataKind::Bind { Access::Rw } else { Access::Ro },
                },
            },
            Op::Chmod { mode, .. } => MountOp::Chmod { dst, mode: *mode },
            Op::Overlay { sources, kind, .. } => {
                let mut lower = Vec::with_capacity(sources.len());
                for src in sources {
                    lower.extend(resolve(src, false)?);
                }
                let upper = match kind {
                    OverlayKind::Rw { upper, work } => Some((
                        resolve(upper, false)?.unwrap_or_default(),
                        resolve(work, false)?.unwrap_or_default(),
                    )),
                    _ => None,
                };
                MountOp::Overlay { lower, upper, tmp: *kind == OverlayKind::Tmp, dst }
            }
        };
        mounts.push(mount);
    }
    Ok(mounts)
}

/// The size no nested tmpfs exceeds, and the pool's: the outer sandbox's
/// `--tmpfs-size`.
fn tmpfs_cap(outer_spec: &SandboxSpec) -> u64 {
    outer_spec.security.limits.tmpfs_size.unwrap_or(crate::limits::DEFAULT_TMPFS_SIZE)
}

/// The bytes a request's tmpfs of their own (bubblewrap's `--size`) take
/// from the pool while it runs: each its size, at least what its inodes
/// stand for (one per 4 KiB, at least 1024: `limits::tmpfs_sized`).
pub(crate) fn reserved_tmpfs(req: &Request, outer_spec: &SandboxSpec) -> u64 {
    let cap = tmpfs_cap(outer_spec);
    req.ops
        .iter()
        .filter_map(|op| match op {
            Op::Tmpfs { size: Some(size), .. } => {
                let (size, inodes) = crate::limits::tmpfs_sized((*size).min(cap));
                Some(size.max(inodes * 4096))
            }
            _ => None,
        })
        .sum()
}

/// The namespaces asked for besides mount, pid and user.
fn unshare_flags(req: &Request) -> c_ulong {
    let mut flags = 0;
    for (wanted, flag) in [
        (req.unshare.net, libc::CLONE_NEWNET),
        (req.unshare.ipc, libc::CLONE_NEWIPC),
        (req.unshare.uts, libc::CLONE_NEWUTS),
        (req.unshare.cgroup, libc::CLONE_NEWCGROUP),
    ] {
        if wanted {
            flags |= flag as c_ulong;
        }
    }
    flags
}

/// One-line `uid_map` and `gid_map` contents: `inner` onto `outer`.
fn id_maps(inner: (u32, u32), outer: (u32, u32)) -> (std::ffi::CString, std::ffi::CString) {
    let line =
        |inner: u32, outer: u32| std::ffi::CString::new(format!("{inner} {outer} 1\n")).expect("digits");
    (line(inner.0, outer.0), line(inner.1, outer.1))
}

/// The working directory candidates: --chdir, else the caller's own when
/// the new root has it, else $HOME, else /. As in bubblewrap, they are
/// entered from the new root's `/` (a relative one is relative to it).
fn cwd(req: &Request) -> Vec<String> {
    let home = req.env.iter().rev().find(|(k, _)| k == "HOME").map(|(_, v)| v.clone());
    match &req.chdir {
        Some(dir) => vec![dir.clone()],
        None => [Some(req.cwd.clone()), home, Some("/".into())].into_iter().flatten().collect(),
    }
}

/// The spec the plan is made from: COMMAND, its environment (`PWD` set)
/// and the mounts.
fn spec(req: &Request, mounts: Vec<MountOp>, user: crate::UserView) -> SandboxSpec {
    let cwd = cwd(req);
    let mut env = req.env.clone();
    crate::builder::set_var(&mut env, "PWD".into(), cwd[0].clone());
    let mut argv = req.command.clone();
    if let Some(argv0) = &req.argv0 {
        argv[0] = argv0.clone();
    }
    SandboxSpec {
        argv,
        env,
        cwd: cwd[0].clone(),
        user,
        host_ids: None,
        network: if req.unshare.net { Network::Off } else { Network::On },
        hostname: req.hostname.clone().unwrap_or_default(),
        mounts,
        new_session: req.new_session,
        deferred_binds: Vec::new(),
        security: crate::Security::default(),
        nested: false,
    }
}

fn programs(req: &Request) -> Vec<crate::seccomp::Program> {
    req.seccomp
        .iter()
        .map(|bytes| crate::seccomp::Program {
            filter: bytes
                .chunks_exact(8)
                .map(|c| libc::sock_filter {
                    code: u16::from_ne_bytes([c[0], c[1]]),
                    jt: c[2],
                    jf: c[3],
                    k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
                })
                .collect(),
        })
        .collect()
}

/// The lock files, opened as bubblewrap's reaper opens them: from
/// COMMAND's working directory, inside the new root.
fn lock_files(req: &Request) -> Result<Vec<LockFile>, RequestError> {
    req.lock_files
        .iter()
        .map(|path| {
            Ok(LockFile {
                open_fail: format!("Unable to open lock file {path}"),
                lock_fail: format!("Unable to lock file {path}"),
                path: std::ffi::CString::new(path.as_str())
                    .map_err(|_| RequestError::Invalid(format!("lock file {path:?}")))?,
            })
        })
        .collect()
}

/// The number a passed descriptor has after renumbering.
fn source_of(fd: Option<i32>, targets: &[(RawFd, RawFd)]) -> Option<RawFd> {
    let fd = fd?;
    targets.iter().find(|(t, _)| *t == fd).map(|&(_, s)| s)
}

/// Whether this process is in the initial user namespace.
fn in_initial_userns() -> bool {
    std::fs::read_to_string("/proc/self/uid_map")
        .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
}

/// A bind source in the caller's view (bwrap on the host), canonical;
/// `None` for a missing optional one.
fn source(cwd: &str, src: &str, optional: bool) -> Result<Option<PathBuf>, RequestError> {
    // `realpath("")` finds nothing.
    let found = if src.is_empty() {
        Err(std::io::Error::from_raw_os_error(libc::ENOENT))
    } else {
        std::fs::canonicalize(absolute(cwd, src))
    };
    match found {
        Ok(real) => Ok(Some(real)),
        Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => {
            let reason = crate::error::strerror(e.raw_os_error().unwrap_or(libc::EIO));
            Err(RequestError::Source { src: src.to_string(), reason })
        }
    }
}

/// A nested request's source, opened (`O_PATH`, following symlinks as the
/// outer sandbox sees them); `None` for a missing optional one. The
/// portal's pool and its fence (devices `portal`) are never a source.
fn open_source(
    cwd: &str,
    src: &str,
    optional: bool,
    portal: &[u64],
) -> Result<Option<OwnedFd>, RequestError> {
    let refused =
        |errno| RequestError::Source { src: src.to_string(), reason: crate::error::strerror(errno) };
    let path = std::ffi::CString::new(absolute(cwd, src)).map_err(|_| refused(libc::EINVAL))?;
    // `realpath("")` finds nothing, as on the host.
    let opened = match src.is_empty() {
        true => Err(nix::errno::Errno::ENOENT),
        false => crate::sys::open(&path, libc::O_PATH | libc::O_CLOEXEC, 0),
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) if optional => return Ok(None),
        Err(e) => return Err(refused(e as i32)),
    };
    if crate::sys::dev_of(&fd).is_some_and(|dev| portal.contains(&dev)) {
        return Err(refused(libc::EACCES));
    }
    Ok(Some(fd))
}

/// An overlay layer must not hold a path the outer sandbox masks:
/// overlayfs shows a layer's own files, not the mounts on them, so what a
/// mask covers would show through (docs/security.md). What the descriptor
/// is open on is read back from it; the masks are in the read-only system
/// view, whose directories cannot be renamed meanwhile.
fn unmasked(fd: &OwnedFd, src: &str, masked: &[String]) -> Result<(), RequestError> {
    if masked.is_empty() {
        return Ok(());
    }
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let real = std::fs::read_link(&link).map_err(|e| RequestError::Source {
        src: src.to_string(),
        reason: crate::error::strerror(e.raw_os_error().unwrap_or(libc::EIO)),
    })?;
    let real = real.to_string_lossy();
    let below =
        |path: &str| real == "/" || path.strip_prefix(real.as_ref()).is_some_and(|r| r.starts_with('/'));
    if masked.iter().any(|m| below(m)) {
        return Err(RequestError::Masked { src: src.to_string() });
    }
    Ok(())
}

/// `path` made absolute against `cwd` (no normalization: the kernel does it).
fn absolute(cwd: &str, path: &str) -> String {
    if path.starts_with('/') { path.to_string() } else { format!("{}/{path}", cwd.trim_end_matches('/')) }
}

/// `fd` moved to the number `want` (close-on-exec), as a raw descriptor
/// for the plan: see [`renumber`].
fn move_to(fd: OwnedFd, want: RawFd) -> Result<RawFd, nix::errno::Errno> {
    let moved = crate::sys::dup_cloexec(fd.as_raw_fd(), want)?;
    if moved.as_raw_fd() != want {
        return Err(nix::errno::Errno::EBADF);
    }
    Ok(moved.into_raw_fd())
}

/// Moves the received descriptors to consecutive numbers well above
/// `floor` (the highest other descriptor the worker has) and every target;
/// returns `(target, source)` pairs and the first source number. The moved
/// copies are raw: whoever starts the sandbox closes them once its PID 1
/// has its own.
fn renumber(
    targets: &[i32],
    fds: Vec<OwnedFd>,
    floor: RawFd,
) -> Result<(Vec<(RawFd, RawFd)>, RawFd), nix::errno::Errno> {
    let highest =
        fds.iter().map(AsRawFd::as_raw_fd).chain(targets.iter().copied()).fold(floor.max(2), RawFd::max);
    // Room below the base for what the launch still opens (its pipes take
    // the lowest free numbers and must stay below).
    let base = (highest + 33).max(64);
    let mut pairs = Vec::with_capacity(fds.len());
    for (i, (fd, &target)) in fds.into_iter().zip(targets).enumerate() {
        // `fd`, the received number, closes once moved.
        pairs.push((target, move_to(fd, base + i as RawFd)?));
    }
    Ok((pairs, base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_move_above_every_target_with_room_below() {
        let (r, w) = crate::sys::pipe().unwrap();
        let floor = w.as_raw_fd();
        let (pairs, base) = renumber(&[0, 1000], vec![r, w], floor).unwrap();
        assert!(base > 1000 && base >= floor + 33, "{base}");
        assert_eq!(pairs, [(0, base), (1000, base + 1)]);
        for (_, source) in pairs {
            // SAFETY: the moved copies are ours to close, closed once.
            assert_eq!(unsafe { crate::sys::close(source) }, Ok(()));
        }
    }

    #[test]
    fn labels_reach_the_tmpfs_mounts_and_pid_1() {
        use crate::prepare::Action;
        let label = "system_u:object_r:container_file_t:s0:c1,c2";
        let req = Request {
            command: vec!["true".into()],
            argv0: Some("renamed".into()),
            cwd: "/".into(),
            umask: 0o22,
            ops: vec![
                Op::Tmpfs { dst: "/tmp".into(), mode: 0o700, size: None },
                Op::Dev { dst: "/dev".into() },
                Op::Mqueue { dst: "/mq".into() },
            ],
            ..Request::default()
        };
        let host = HostOptions {
            exec_label: Some("system_u:system_r:container_t:s0".into()),
            file_label: Some(label.into()),
            ..HostOptions::default()
        };
        let plan = prepare_host(&req, Vec::new(), 2, &host).unwrap();
        let context = (c"context".to_owned(), Some(std::ffi::CString::new(label).unwrap()));
        let mut labelled = Vec::new();
        for step in &plan.steps {
            if let Action::Fs { fstype, options, .. } = &step.action {
                // bubblewrap labels the tmpfs mounts it makes (`--tmpfs`,
                // `--dev`, whose `shm` is a directory in it), not mqueue or
                // devpts.
                let has = options.contains(&context);
                assert_eq!(has, fstype.as_c_str() == c"tmpfs", "{}", step.what);
                if has {
                    labelled.push(step.what.as_str());
                }
            }
        }
        assert_eq!(labelled, ["mount tmpfs on /tmp", "mount tmpfs on /dev"]);
        let nested = plan.nested.as_ref().unwrap();
        let (bytes, what) = nested.exec_label.as_ref().unwrap();
        assert_eq!(bytes.as_slice(), b"system_u:system_r:container_t:s0\0");
        assert_eq!(what, "label_exec true", "bubblewrap names COMMAND, not --argv0");
        // Without labels nothing changes.
        let plan = prepare_host(&req, Vec::new(), 2, &HostOptions::default()).unwrap();
        assert!(plan.nested.as_ref().unwrap().exec_label.is_none());
        assert!(plan.steps.iter().all(|s| !matches!(&s.action, Action::Fs { options, .. } if options.iter().any(|(k, _)| k.as_c_str() == c"context"))));
    }

    #[test]
    fn relative_sources_are_the_callers() {
        assert_eq!(absolute("/ws", "a/b"), "/ws/a/b");
        assert_eq!(absolute("/", "a"), "/a");
        assert_eq!(absolute("/ws", "/x"), "/x");
    }
}
