//! Turns a [`SandboxSpec`] into a [`Plan`]: every C string, byte buffer and
//! pointer array the sandbox child will need, computed in the launcher
//! before `clone`. After `clone` the child only walks this plan and issues
//! syscalls; it allocates nothing.
//!
//! Host paths are checked here (canonicalized, their type recorded), so a
//! missing bind source is a clear error before any namespace exists.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use libc::{c_char, c_ulong};

use crate::error::{SpecError, io_error_text};
use crate::guest_path;
use crate::idmap;
use crate::landlock::{self, Grant};
use crate::limits;
use crate::procfs;
use crate::seccomp;
use crate::spec::{Access, MountOp, Network, SandboxSpec, UserView};
use crate::splice::{self, Splicer};

const MOUNT_NOSUID: u64 = libc::MOUNT_ATTR_NOSUID;
const MOUNT_NODEV: u64 = libc::MOUNT_ATTR_NODEV;
const MOUNT_NOEXEC: u64 = libc::MOUNT_ATTR_NOEXEC;
const MOUNT_RDONLY: u64 = libc::MOUNT_ATTR_RDONLY;

/// Device nodes bound from the host into the minimal `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// `PATH` used for the command lookup when the environment has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// Directory in the new root holding generated files until they are bound
/// into place; removed before `/` is made read-only.
const STAGING_DIR: &str = ".tuixiu-staging";
/// Most host sources (binds and deferred binds) one sandbox may have; their
/// clones are kept in a fixed array in the child.
/// bwrap's 9000 arguments make at most 3000 binds.
pub(crate) const MAX_HOST_SOURCES: usize = 4096;
/// Most deferred binds one sandbox may hold.
pub(crate) const MAX_DEFERRED: usize = 64;

/// An overlay filesystem's `fsconfig` options (absolute host paths); a
/// `tmp` one gets its upper and work directories on a private tmpfs.
pub(crate) struct OverlayFs {
    pub options: Vec<(CString, Option<CString>)>,
    pub tmp: bool,
    /// bubblewrap's words for a failure: `Can't make overlay mount on
    /// /newroot/DEST with options OPTIONS` (its own option string).
    pub failure: String,
}

/// What to create at a bind destination that does not exist yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir,
    File,
}

/// Where a bind's mount tree comes from.
pub(crate) enum Source {
    /// Host source number `n` of [`Plan::host_sources`]. Every host source is
    /// cloned (with its mount attributes) at the start of setup, while the
    /// host's tree is still the child's root.
    Host(usize),
    /// A path already inside the new root (a `/proc` entry, a generated file).
    New { path: CString, attrs: u64, optional: bool },
}

/// One primitive the child executes. Paths are relative to the new root.
pub(crate) enum Action {
    /// Attach a recursive copy of `source` at `dst`.
    Bind {
        source: Source,
        dst: CString,
        kind: Kind,
    },
    /// Create the file `dst` with these bytes (bubblewrap's `--file`).
    CreateFile {
        dst: CString,
        contents: Vec<u8>,
        mode: u32,
    },
    /// A private file with these bytes on a tmpfs of its own, bound at
    /// `dst` with `attrs` (bubblewrap's `--bind-data`: nothing is written
    /// into the new root, which may be a host directory).
    BindData {
        dst: CString,
        contents: Vec<u8>,
        mode: u32,
        attrs: u64,
    },
    /// Change the mode of what `dst` names.
    Chmod {
        dst: CString,
        mode: u32,
    },
    /// Mount a fresh filesystem at `dst` (created as a directory). A
    /// `pooled` tmpfs of a nested sandbox is a new directory of its outer
    /// sandbox's pool instead, with the mode of `options` (mounts.rs).
    Fs {
        fstype: CString,
        options: Vec<(CString, Option<CString>)>,
        attrs: u64,
        dst: CString,
        pooled: bool,
    },
    /// Create the generated file `path` (inside [`STAGING_DIR`]) with these bytes.
    WriteFile {
        path: CString,
        contents: Vec<u8>,
        mode: u32,
    },
    /// Remove the staging directory and the names of the generated files
    /// (the binds keep the files themselves alive).
    RemoveStaging {
        files: Vec<CString>,
        dir: CString,
    },
    /// Attach a detached mount tree the launcher prepared (an idmapped
    /// system bind) at `dst`.
    AttachTree {
        tree: OwnedFd,
        dst: CString,
        kind: Kind,
    },
    Symlink {
        target: CString,
        dst: CString,
    },
    Dir {
        dst: CString,
        mode: u32,
    },
    /// Add `attrs` to the single mount at `dst` (not its submounts).
    Remount {
        dst: CString,
        attrs: u64,
    },
    /// `/proc`: fresh, or the caller's bound (procfs.rs).
    Proc(procfs::Prepared),
    /// Move the mount at `from` (with its submounts) onto `dst`.
    Move {
        from: CString,
        dst: CString,
    },
    /// Bind the (launcher-created) unix socket `socket` as `name` in the
    /// directory `dir`, and listen on it: the nested-sandbox portal.
    Listen {
        socket: std::os::fd::RawFd,
        dir: CString,
        name: CString,
    },
}

/// A primitive with the words used when it fails.
pub(crate) struct Step {
    pub what: String,
    pub action: Action,
    /// The mode of the missing parent directories it creates.
    pub parents: u32,
}

/// How to execute the command: argv/envp as C arrays and the candidate
/// paths of a `PATH` lookup done with the sandbox's own `PATH`.
pub(crate) struct ExecPlan {
    pub program: String,
    pub candidates: Vec<CString>,
    pub search_path: String,
    // The pointer arrays point into these; their buffers never move.
    _argv: Vec<CString>,
    /// The environment strings, wiped by PID 1 once the command runs.
    pub envp: crate::confine::EnvBlock,
    pub argv_ptrs: Vec<*const c_char>,
    pub envp_ptrs: Vec<*const c_char>,
}

/// A host bind source, checked and canonicalized before clone.
pub(crate) struct HostSource {
    pub what: String,
    /// An overlay made of host directories instead of a copy of `src`,
    /// set up while the host's tree is still the child's root.
    pub overlay: Option<OverlayFs>,
    /// Canonical path relative to the host root ("." for `/`).
    pub src: CString,
    /// Or the descriptor it was opened through, cloned as it is: a nested
    /// request's source, resolved once by the portal's worker (its
    /// `/proc/self/fd/N`), never looked up by path again.
    pub fd: Option<std::os::fd::RawFd>,
    pub kind: Kind,
    /// `MOUNT_ATTR_*` added to every mount of the clone.
    pub attrs: u64,
}

/// A bind attached only when the apply phase asks for it.
pub(crate) struct Deferred {
    /// Index into [`Plan::host_sources`].
    pub source: usize,
    pub dst: CString,
}

pub(crate) struct Plan {
    pub clone_flags: c_ulong,
    pub uid: u32,
    pub gid: u32,
    pub host_uid: u32,
    pub host_gid: u32,
    /// The sandbox user is host root (uid 0 of the initial user namespace).
    pub user_is_host_root: bool,
    pub host_sources: Vec<HostSource>,
    pub steps: Vec<Step>,
    /// `None` keeps the UTS namespace's name (a nested sandbox that shares it).
    pub hostname: Option<CString>,
    pub network_off: bool,
    /// PID 1 makes the egress listener and hands it out (`egress.rs`).
    pub egress: bool,
    /// Working directories to try, in order; the first that works is used.
    pub cwd: Vec<CString>,
    pub new_session: bool,
    pub exec: ExecPlan,
    pub deferred: Vec<Deferred>,
    /// Pause after setup for the launcher's apply phase.
    pub apply_phase: bool,
    /// The compiled seccomp filter, installed last before `execve`.
    pub seccomp: Option<seccomp::Program>,
    /// The Landlock ruleset, applied by PID 2 after the final pivot.
    pub landlock: Option<landlock::Plan>,
    /// Limits: the cgroup (removed when the plan is dropped), rlimits for
    /// PID 2, the timeout the launcher keeps.
    pub limits: limits::Prepared,
    /// The idmap helper process (already killed): the launcher reaps it
    /// once the sandbox's child runs, or the plan's drop does. A cell: the
    /// launcher starts the sandbox from a shared plan (the nested-sandbox
    /// portal borrows it too).
    pub idmap_helper: std::cell::Cell<Option<idmap::Helper>>,
    /// Descriptors the child must keep open (the idmapped trees).
    pub kept_fds: Vec<std::os::fd::RawFd>,
    /// The stack PID 2 starts on (it shares PID 1's memory until `execve`).
    pub command_stack: crate::sys::ChildStack,
    /// PID 1's own seccomp filter, installed once the command runs.
    pub reaper_filter: seccomp::Program,
    /// The filter of the helper that makes a nested user namespace
    /// (`seccomp::userns_holder`), when the plan makes one.
    pub holder_filter: Option<seccomp::Program>,
    /// The nested-sandbox portal's listening socket (bound and listened on
    /// by the child during setup, served by the launcher).
    pub portal: Option<OwnedFd>,
    /// What PID 1 of a nested sandbox does besides the checklist.
    pub nested: Option<NestedChild>,
    /// A nested sandbox's directory in its outer sandbox's tmpfs pool
    /// (relative to the root PID 1 starts in): its new root and every
    /// tmpfs without a size of its own are new directories there.
    pub pool: Option<CString>,
    /// The guest paths the secret masks cover (the fallback without
    /// idmapped mounts): a nested overlay must not show what is below them.
    pub masked: Vec<String>,
    /// Options of the new root's tmpfs besides its mode (`size`,
    /// `nr_inodes` for a nested sandbox, whose root stays writable).
    pub root_tmpfs: Vec<(CString, Option<CString>)>,
}

/// What [`Plan::prepare_nested`] takes besides the spec.
pub(crate) struct NestedParts {
    pub clone_flags: c_ulong,
    /// The program to execute (the spec's `argv[0]` may be `--argv0`'s).
    pub program: String,
    pub hostname: Option<String>,
    pub cwd: Vec<String>,
    /// The outer sandbox's pool directory for this one (see [`Plan::pool`]).
    pub pool: Option<String>,
    /// Bind and overlay sources are `/proc/self/fd/N` of descriptors the
    /// caller opened (see [`HostSource::fd`]).
    pub fd_sources: bool,
    pub child: NestedChild,
    /// `setsid` before COMMAND.
    pub new_session: bool,
    /// `(uid, gid, host uid, host gid)` when `clone_flags` make the user
    /// namespace (a bwrap run on the host): the launcher maps the first
    /// onto the second.
    pub ids: Option<(u32, u32, u32, u32)>,
    /// The runtime's filter and rlimits for COMMAND (an outer sandbox's).
    pub seccomp: Option<seccomp::Program>,
    pub rlimits: Vec<(libc::c_int, u64)>,
    /// Landlock on the nested view.
    pub landlock: crate::LandlockMode,
    /// Landlock's filesystem rules too (without them, only its scoping:
    /// a nested command that may make its own mount namespace must be
    /// able to mount in it, which any filesystem rule forbids).
    pub landlock_fs: bool,
    /// Overlays need `userxattr` (made inside a user namespace).
    pub overlay_userxattr: bool,
    /// bubblewrap's `--file-label` (selinux.rs).
    pub file_label: Option<CString>,
}

/// The parts of PID 1's work that follow bubblewrap's rules on the host
/// (docs/bwrap.md), where a nested sandbox follows the runtime's.
pub(crate) struct HostChild {
    /// The capabilities COMMAND ends with (instead of `keep_caps`).
    pub caps: BwrapCaps,
    /// Descriptors PID 1 holds that COMMAND does not get: `--sync-fd`,
    /// held by the reaper for the sandbox's life; `--block-fd` is one of
    /// them too, closed once read.
    pub held: Vec<std::os::fd::RawFd>,
    /// Standard descriptors among those (their numbers in COMMAND), which
    /// PID 1 closes so that COMMAND does not inherit them either.
    pub held_stdio: Vec<std::os::fd::RawFd>,
    /// `--userns-block-fd`: the caller writes the id maps while the
    /// launcher waits; PID 1 keeps whatever ids they give it.
    pub caller_maps: bool,
    /// A failure bubblewrap meets only inside the sandbox it has made (a
    /// missing source, a destination it cannot use): reported by PID 1 as
    /// soon as it runs, after the status descriptors have had the
    /// sandbox's pid, as bubblewrap's do.
    pub fail_at_start: Option<String>,
}

/// bubblewrap's capability rule for COMMAND: `requested` (the caller's
/// effective set for root, else empty, then `--cap-add`/`--cap-drop`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BwrapCaps {
    pub requested: u64,
    /// `capset` to `requested`; not for root without `--cap-add` or
    /// `--cap-drop`, whose sets are left as they are.
    pub set: bool,
    /// Reduce the bounding set to `requested`: only in a user namespace
    /// bubblewrap made or joined.
    pub bound: bool,
    /// The caller is root: a `capset` refused with EPERM is ignored.
    pub root: bool,
}

/// A `--lock-file` and bubblewrap's words for its failures.
pub(crate) struct LockFile {
    pub path: CString,
    pub open_fail: String,
    pub lock_fail: String,
}

/// The parts of a nested sandbox's setup that an outer one has not.
pub(crate) struct NestedChild {
    /// After the mounts, enter these user namespaces, each a child of the
    /// one before (bwrap's `--unshare-user`; `--disable-userns` adds one).
    pub userns: Vec<UserNs>,
    /// The ids to become inside that user namespace.
    pub inner_ids: (u32, u32),
    /// Capabilities the command keeps (only inside its own user namespace).
    pub keep_caps: u64,
    /// `(number in the command, descriptor here)` for every descriptor the
    /// caller passed; the sources are numbered from `fd_base` up.
    pub fds: Vec<(std::os::fd::RawFd, std::os::fd::RawFd)>,
    pub fd_base: std::os::fd::RawFd,
    /// What a bwrap run on the host does besides (bubblewrap's own rules).
    pub host: Option<HostChild>,
    /// The descriptors its sources were opened through (numbered from
    /// `fd_base` up, after `fds`), closed once they are cloned.
    pub source_fds: Vec<std::os::fd::RawFd>,
    /// `--seccomp`/`--add-seccomp-fd` programs, installed after the runtime's.
    pub extra_filters: Vec<seccomp::Program>,
    /// `--as-pid-1` (or no new pid namespace): PID 1 executes COMMAND
    /// itself, without a reaper.
    pub exec_in_pid1: bool,
    /// `--userns2` (its number here): switched to after setup.
    pub userns2_fd: Option<std::os::fd::RawFd>,
    /// `--block-fd` (its number here): COMMAND waits for it.
    pub block_fd: Option<std::os::fd::RawFd>,
    /// `--lock-file` paths, read-locked by PID 1 for the sandbox's life.
    pub lock_files: Vec<LockFile>,
    /// `--disable-userns`: `user.max_user_namespaces` = 1 in the sandbox's
    /// own user namespace, then one more (the last of `userns`): none can
    /// be made inside.
    pub disable_userns: bool,
    /// `--assert-userns-disabled`.
    pub assert_userns_disabled: bool,
    /// PID 1 stays dumpable (a bwrap run on the host, as bubblewrap's).
    pub dumpable: bool,
    /// bubblewrap's `--exec-label` (with its NUL, selinux.rs) and its words
    /// for a failure (`label_exec COMMAND`).
    pub exec_label: Option<(Vec<u8>, String)>,
}

/// A user namespace the sandbox's PID 1 enters after its mounts. It is
/// made by a short-lived helper process and joined, so that PID 1 itself is
/// never dumpable (child.rs, docs/security.md).
pub(crate) struct UserNs {
    /// One-line `uid_map` and `gid_map` contents, written by PID 1.
    pub maps: (CString, CString),
    /// Set `user.max_user_namespaces` to 1 in the user namespace PID 1 is
    /// in before this one is made (bubblewrap's `--disable-userns`: the
    /// limit lives in the sandbox's own namespace, this one uses it up).
    pub limit_first: bool,
}

fn cstring(what: &str, s: impl Into<Vec<u8>>) -> Result<CString, SpecError> {
    CString::new(s).map_err(|_| SpecError::new(format!("{what} contains a NUL byte")))
}

/// Normalized guest path relative to the new root ("" for the root itself).
fn guest_rel(what: &str, path: &str) -> Result<(String, CString), SpecError> {
    let norm = guest_path::normalize(path).map_err(|why| SpecError::new(format!("{what} {path:?} {why}")))?;
    let rel = cstring(what, norm.trim_start_matches('/'))?;
    Ok((norm, rel))
}

/// The `(uid, gid)` the launcher runs as.
pub(crate) fn own_ids() -> (u32, u32) {
    (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw())
}

/// The host ids the sandbox user maps onto: the spec's, or the caller's
/// own. Only root may map onto ids other than its own.
fn host_ids(spec: &SandboxSpec) -> Result<(u32, u32), SpecError> {
    let (own_uid, own_gid) = own_ids();
    let (host_uid, host_gid) = match spec.host_ids {
        Some(ids) => (ids.uid, ids.gid),
        None => (own_uid, own_gid),
    };
    if (host_uid, host_gid) != (own_uid, own_gid) && own_uid != 0 {
        return Err(SpecError::new(format!(
            "mapping the sandbox user onto host ids {host_uid}:{host_gid} needs root; \
             an unprivileged caller's sandbox user maps onto its own ids {own_uid}:{own_gid}"
        )));
    }
    Ok((host_uid, host_gid))
}

/// The namespaces the sandbox is cloned into: a private network
/// namespace only when its network is private.
fn clone_flags(spec: &SandboxSpec) -> c_ulong {
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    if spec.network.is_private() {
        flags |= libc::CLONE_NEWNET;
    }
    flags as c_ulong
}

/// The nested sandboxes' portal (its listening socket and the `bwrap`
/// front end that serves it) when the spec asks for nesting and a front
/// end is given; says which in the log.
fn nested_portal<'a>(
    spec: &SandboxSpec,
    front_end: Option<&'a Path>,
) -> Result<Option<(OwnedFd, &'a Path)>, SpecError> {
    let portal = match front_end.filter(|_| spec.nested) {
        Some(exe) => Some((crate::portal::socket()?, exe)),
        None => None,
    };
    match (&portal, spec.nested) {
        (Some(_), _) => tracing::info!(
            "nested sandboxes: on (`bwrap` is {}, first on PATH, served by this launcher; \
             their commands' own user, mount and pid namespaces: {})",
            crate::portal::PORTAL_BIN,
            if spec.security.nested_userns == crate::NestedUserns::On {
                "on"
            } else {
                "off (--nested-userns)"
            }
        ),
        (None, true) => tracing::info!("nested sandboxes: not available (no bwrap front end given)"),
        (None, false) => tracing::info!("nested sandboxes: off"),
    }
    Ok(portal)
}

/// Denying IP sockets leaves a shared network namespace usable: refused.
fn check_no_ip(spec: &SandboxSpec) -> Result<(), SpecError> {
    if spec.security.no_ip && spec.network != Network::Off {
        return Err(SpecError::new(
            "denying IP sockets (network none) needs a private network namespace (network off)",
        ));
    }
    Ok(())
}

fn check_hostname(hostname: &str) -> Result<(), SpecError> {
    if hostname.is_empty() || hostname.len() > 64 || hostname.contains(['\0', '/']) {
        return Err(SpecError::new(format!("hostname {hostname:?} must be 1-64 bytes without '/'")));
    }
    Ok(())
}

/// The spec's seccomp filter, compiled, and what it is in the log.
fn seccomp_filter(spec: &SandboxSpec) -> Result<Option<seccomp::Program>, SpecError> {
    let security = &spec.security;
    let seccomp = seccomp::compile(&security.seccomp, security.allow_ptrace, spec.sockets())?;
    match &seccomp {
        Some(p) => tracing::info!(
            "seccomp: {} ({} BPF instructions{})",
            security.seccomp.describe(),
            p.filter.len(),
            if security.allow_ptrace { ", ptrace allowed" } else { "" }
        ),
        None => {
            tracing::warn!("seccomp: unconfined: the command can make every syscall the namespaces allow")
        }
    }
    Ok(seccomp)
}

/// The spec's Landlock rules, and what the kernel will enforce of them in
/// the log (a warning when less than asked).
fn landlock_rules(spec: &SandboxSpec) -> Result<Option<landlock::Plan>, SpecError> {
    let security = &spec.security;
    let (landlock, enforcement) = landlock::plan(security.landlock, &landlock_paths(spec)?, security.no_ip)?;
    match &enforcement {
        landlock::Enforcement::Full { .. } => tracing::info!("landlock: {enforcement}"),
        landlock::Enforcement::Not { .. } if security.landlock == crate::LandlockMode::Off => {
            tracing::info!("landlock: {enforcement}")
        }
        _ => tracing::warn!("landlock: {enforcement}"),
    }
    Ok(landlock)
}

/// The descriptors the command's setup still needs after the launcher
/// closes the rest: the detached trees to attach, and the portal's socket.
fn kept_fds(steps: &[Step], portal: Option<&OwnedFd>) -> Vec<std::os::fd::RawFd> {
    use std::os::fd::AsRawFd;
    let trees = steps.iter().filter_map(|step| match &step.action {
        Action::AttachTree { tree, .. } => Some(tree.as_raw_fd()),
        _ => None,
    });
    trees.chain(portal.map(AsRawFd::as_raw_fd)).collect()
}

impl Plan {
    /// `front_end` is the binary bound as `bwrap` when the spec asks for
    /// nested sandboxes (`None`: no portal).
    pub(crate) fn prepare(spec: &SandboxSpec, front_end: Option<&Path>) -> Result<Plan, SpecError> {
        spec.user.validate()?;
        let (host_uid, host_gid) = host_ids(spec)?;
        // Whether the sandbox's user and group are host root (uid/gid 0 of
        // the initial user namespace): secrets and RLIMIT_NPROC depend on it.
        let (root_uid, root_gid) = idmap::host_root(host_uid, host_gid);
        let mut plan = Expansion {
            overlay_userxattr: true,
            user: &spec.user,
            steps: Vec::new(),
            host_sources: Vec::new(),
            staged: Vec::new(),
            hiding: SecretHiding::decide(spec, root_uid, root_gid),
            user_is_host_root: root_uid,
            splicer: Splicer::default(),
            tmpfs: spec.security.limits.tmpfs_options(),
            file_label: None,
            parents: 0o755,
            bwrap: false,
            pool: false,
            fd_sources: false,
        };
        let portal = nested_portal(spec, front_end)?;
        plan.expand_view(&spec.mounts, portal.as_ref())?;
        let deferred = plan.deferred_binds(&spec.deferred_binds)?;
        plan.finish()?;
        plan.push(
            "make / read-only".into(),
            Action::Remount { dst: CString::default(), attrs: MOUNT_RDONLY },
        );

        check_hostname(&spec.hostname)?;
        let (cwd_text, _) = guest_rel("working directory", &spec.cwd)?;
        let security = &spec.security;
        check_no_ip(spec)?;
        let seccomp = seccomp_filter(spec)?;
        let landlock = landlock_rules(spec)?;
        let limits = limits::prepare(&security.limits, plan.user_is_host_root)?;
        let masked = match &plan.hiding {
            SecretHiding::Masks(masks) => masks.iter().map(|(path, _)| path.clone()).collect(),
            _ => Vec::new(),
        };
        let portal = portal.map(|(socket, _)| socket);
        let kept_fds = kept_fds(&plan.steps, portal.as_ref());
        let command_stack = crate::sys::ChildStack::new()
            .map_err(|e| SpecError::new(format!("allocate the command's stack: mmap => {e}")))?;
        Ok(Plan {
            command_stack,
            reaper_filter: seccomp::reaper(),
            holder_filter: None,
            kept_fds,
            idmap_helper: std::cell::Cell::new(plan.hiding.take_helper()),
            seccomp,
            landlock,
            limits,
            clone_flags: clone_flags(spec),
            uid: spec.user.uid,
            gid: spec.user.gid,
            host_uid,
            host_gid,
            user_is_host_root: plan.user_is_host_root,
            host_sources: plan.host_sources,
            steps: plan.steps,
            hostname: Some(cstring("hostname", spec.hostname.as_str())?),
            network_off: spec.network.is_private(),
            egress: spec.network == Network::Proxied,
            cwd: vec![cstring("working directory", cwd_text.as_str())?],
            new_session: spec.new_session,
            exec: ExecPlan::prepare(spec)?,
            deferred,
            apply_phase: false,
            portal,
            nested: None,
            pool: None,
            masked,
            // Read-only once built: nothing is written there but the
            // generated files.
            root_tmpfs: Vec::new(),
        })
    }

    /// The plan of a nested sandbox: `spec`'s mounts, command and
    /// environment, run with the outer sandbox's compiled seccomp filter
    /// and rlimits (`outer`), Landlock rules made from the nested view's
    /// own mounts, and no final read-only `/` (bubblewrap's root stays
    /// writable). The spec's other fields are ignored: `parts` says the rest.
    pub(crate) fn prepare_nested(spec: &SandboxSpec, parts: NestedParts) -> Result<Plan, SpecError> {
        let (own_uid, own_gid) = own_ids();
        let (uid, gid, host_uid, host_gid) = parts.ids.unwrap_or((own_uid, own_gid, own_uid, own_gid));
        let mut plan = Expansion {
            user: &spec.user,
            steps: Vec::new(),
            host_sources: Vec::new(),
            staged: Vec::new(),
            hiding: SecretHiding::NotNeeded,
            user_is_host_root: false,
            // Nothing to splice: a nested request has no system view, and a
            // target missing under a read-only bind fails as in bubblewrap.
            splicer: Splicer::default(),
            // The outer sandbox's size for every tmpfs without its own.
            tmpfs: spec.security.limits.tmpfs_options(),
            overlay_userxattr: parts.overlay_userxattr,
            file_label: parts.file_label,
            parents: 0o755,
            bwrap: true,
            pool: parts.pool.is_some(),
            fd_sources: parts.fd_sources,
        };
        for op in &spec.mounts {
            plan.parents = bwrap_parents(op);
            plan.expand(op)?;
        }
        plan.parents = 0o755;
        plan.finish()?;
        // bubblewrap's root stays writable: sized like every private tmpfs.
        let root_tmpfs = plan.tmpfs_size_options(None)?.to_vec();
        let (landlock, _) = landlock::plan(parts.landlock, &landlock_paths(spec)?, false)?;
        let landlock =
            if parts.landlock_fs { landlock } else { landlock.and_then(landlock::Plan::without_fs) };
        let cwd = parts
            .cwd
            .iter()
            .map(|dir| cstring("working directory", dir.as_str()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Plan {
            clone_flags: parts.clone_flags,
            uid,
            gid,
            host_uid,
            host_gid,
            user_is_host_root: false,
            host_sources: plan.host_sources,
            steps: plan.steps,
            hostname: parts.hostname.map(|h| cstring("hostname", h)).transpose()?,
            network_off: parts.clone_flags & libc::CLONE_NEWNET as c_ulong != 0,
            egress: false,
            cwd,
            new_session: parts.new_session,
            exec: ExecPlan::new(&parts.program, &spec.argv, &spec.env)?,
            deferred: Vec::new(),
            apply_phase: false,
            seccomp: parts.seccomp,
            landlock,
            limits: limits::Prepared { rlimits: parts.rlimits, ..limits::Prepared::default() },
            idmap_helper: std::cell::Cell::new(None),
            reaper_filter: seccomp::reaper(),
            holder_filter: (!parts.child.userns.is_empty()).then(seccomp::userns_holder),
            kept_fds: Vec::new(),
            command_stack: crate::sys::ChildStack::new()
                .map_err(|e| SpecError::new(format!("allocate the command's stack: mmap => {e}")))?,
            portal: None,
            nested: Some(parts.child),
            pool: parts.pool.map(|p| cstring("pool directory", p.trim_start_matches('/'))).transpose()?,
            masked: Vec::new(),
            root_tmpfs,
        })
    }

    pub(crate) fn uid_map(&self) -> String {
        crate::user::id_map_line(self.uid, self.host_uid)
    }

    pub(crate) fn gid_map(&self) -> String {
        crate::user::id_map_line(self.gid, self.host_gid)
    }
}

/// The spec's mount operations being turned into primitive steps.
struct Expansion<'a> {
    /// Overlays are made inside a user namespace (`userxattr`).
    overlay_userxattr: bool,
    user: &'a UserView,
    steps: Vec<Step>,
    host_sources: Vec<HostSource>,
    /// Generated files to unlink from the staging directory at the end.
    staged: Vec<CString>,
    /// How host secrets in the system view are hidden.
    hiding: SecretHiding,
    /// The sandbox user maps onto host root.
    user_is_host_root: bool,
    /// Destinations missing inside the read-only system view (splice.rs).
    splicer: Splicer,
    /// `(size, nr_inodes)` of a tmpfs that gives no size of its own.
    tmpfs: (u64, u64),
    /// bubblewrap's `--file-label`: the context of the tmpfs mounts made
    /// for the sandbox's content (`--tmpfs`, `--dev` and its `shm`).
    file_label: Option<CString>,
    /// The mode of missing parent directories the steps being planned create.
    parents: u32,
    /// A bwrap sandbox (bubblewrap's rules where they differ).
    bwrap: bool,
    /// A nested sandbox with a pool: tmpfs without a size of their own are
    /// directories of it.
    pool: bool,
    /// Sources are `/proc/self/fd/N` (see [`HostSource::fd`]).
    fd_sources: bool,
}

impl Expansion<'_> {
    fn push(&mut self, what: String, action: Action) {
        self.steps.push(Step { what, action, parents: self.parents });
    }

    /// A step of splice.rs as the action that does it.
    fn push_splice(&mut self, step: splice::Step) -> Result<(), SpecError> {
        const RO: u64 = MOUNT_RDONLY | MOUNT_NOSUID | MOUNT_NODEV;
        let path = |p: Vec<u8>| cstring("spliced path", p);
        let action = match step.op {
            splice::Op::Tmpfs { dst, mode } => Action::Fs {
                fstype: cstring("fstype", "tmpfs")?,
                options: vec![option("mode", &format!("{mode:o}"))?],
                attrs: MOUNT_NOSUID | MOUNT_NODEV,
                dst: path(dst)?,
                pooled: false,
            },
            splice::Op::Keep { src, dst, dir } => Action::Bind {
                source: Source::New { path: path(src)?, attrs: RO, optional: true },
                dst: path(dst)?,
                kind: if dir { Kind::Dir } else { Kind::File },
            },
            splice::Op::Symlink { target, dst } => Action::Symlink { target: path(target)?, dst: path(dst)? },
            splice::Op::Move { from, dst } => Action::Move { from: path(from)?, dst: path(dst)? },
            splice::Op::RemoveDir { dir } => Action::RemoveStaging { files: Vec::new(), dir: path(dir)? },
            splice::Op::ReadOnly { dst } => Action::Remount { dst: path(dst)?, attrs: MOUNT_RDONLY },
        };
        self.push(step.what, action);
        Ok(())
    }

    /// After the last mount: the limit on host sources, the staged files'
    /// names removed, and the spliced directories made read-only.
    fn finish(&mut self) -> Result<(), SpecError> {
        if self.host_sources.len() > MAX_HOST_SOURCES {
            return Err(SpecError::new(format!("at most {MAX_HOST_SOURCES} host binds are supported")));
        }
        if !self.staged.is_empty() {
            let files = std::mem::take(&mut self.staged);
            self.push(
                "remove the staging directory".into(),
                Action::RemoveStaging { files, dir: cstring("staging dir", STAGING_DIR)? },
            );
        }
        for step in self.splicer.finish() {
            self.push_splice(step)?;
        }
        Ok(())
    }

    /// Checks and canonicalizes a host bind source; returns its index.
    fn host_source(&mut self, src: &Path, access: Access, dst_text: &str) -> Result<usize, SpecError> {
        let ro = access == Access::Ro;
        let attrs = if ro { MOUNT_NOSUID | MOUNT_NODEV | MOUNT_RDONLY } else { MOUNT_NOSUID | MOUNT_NODEV };
        let what = format!("bind {} -> {dst_text} ({})", src.display(), if ro { "ro" } else { "rw" });
        self.host_source_with(src, attrs, what)
    }

    /// As [`Self::host_source`], with the mount attributes and step name given.
    fn host_source_with(&mut self, src: &Path, attrs: u64, what: String) -> Result<usize, SpecError> {
        let bad = |e: std::io::Error| {
            SpecError::new(format!("bind source {}: {}", src.display(), io_error_text(&e)))
        };
        if self.fd_sources {
            let fd = descriptor_of(src)?;
            // SAFETY: the caller's open descriptor (the plan keeps it until
            // PID 1 has cloned it), borrowed for one fstat.
            let stat = nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
                .map_err(|e| bad(e.into()))?;
            let dir = stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
            self.host_sources.push(HostSource {
                what,
                overlay: None,
                src: CString::default(),
                fd: Some(fd),
                kind: if dir { Kind::Dir } else { Kind::File },
                attrs,
            });
            return Ok(self.host_sources.len() - 1);
        }
        let canonical = std::fs::canonicalize(src).map_err(bad)?;
        let meta = std::fs::metadata(&canonical).map_err(bad)?;
        let rel = canonical
            .to_str()
            .ok_or_else(|| SpecError::new(format!("bind source {}: path is not UTF-8", src.display())))?
            .trim_start_matches('/');
        self.host_sources.push(HostSource {
            what,
            overlay: None,
            src: cstring("bind source", if rel.is_empty() { "." } else { rel })?,
            fd: None,
            kind: if meta.is_dir() { Kind::Dir } else { Kind::File },
            attrs,
        });
        Ok(self.host_sources.len() - 1)
    }

    /// The nested-sandbox portal: a small read-only tmpfs at
    /// [`crate::portal::PORTAL_DIR`] holding the listening socket and the
    /// front end as `bin/bwrap`, and the front end bound over the host's
    /// own `bwrap` where the system view shows one.
    fn push_portal(&mut self, front_end: &Path, socket: &OwnedFd, cover_host: bool) -> Result<(), SpecError> {
        use crate::portal::{PORTAL_BIN, PORTAL_DIR, SOCKET_NAME};
        let (dir_text, dir) = guest_rel("portal", PORTAL_DIR)?;
        self.push(
            format!("mount tmpfs on {dir_text}"),
            Action::Fs {
                fstype: cstring("fstype", "tmpfs")?,
                options: vec![option("mode", "755")?, option("size", "64k")?],
                attrs: MOUNT_NOSUID | MOUNT_NODEV | MOUNT_NOEXEC,
                dst: dir.clone(),
                pooled: false,
            },
        );
        let bin_dir = PORTAL_BIN.rsplit_once('/').map_or(PORTAL_BIN, |(dir, _)| dir);
        self.push(
            format!("create directory {bin_dir}"),
            Action::Dir { dst: cstring("portal", bin_dir.trim_start_matches('/'))?, mode: 0o755 },
        );
        let ro = MOUNT_NOSUID | MOUNT_NODEV | MOUNT_RDONLY;
        let mut targets = vec![PORTAL_BIN.to_string()];
        for host in ["/usr/bin/bwrap", "/bin/bwrap"].into_iter().filter(|_| cover_host) {
            let is_file = std::fs::metadata(host).is_ok_and(|m| m.is_file());
            let real = std::fs::canonicalize(host).ok().and_then(|p| p.to_str().map(str::to_string));
            if let (true, Some(real)) = (is_file, real)
                && !targets.contains(&real)
            {
                targets.push(real);
            }
        }
        for (i, target) in targets.iter().enumerate() {
            let index = self.host_source_with(
                front_end,
                ro,
                format!("bind {} -> {target} (ro, the nested-sandbox front end)", front_end.display()),
            )?;
            let (_, dst) = guest_rel("portal", target)?;
            let what = self.host_sources[index].what.clone();
            self.push(what, Action::Bind { source: Source::Host(index), dst, kind: Kind::File });
            if i == 0 {
                self.push(
                    format!("listen on {dir_text}/{SOCKET_NAME}"),
                    Action::Listen {
                        socket: std::os::fd::AsRawFd::as_raw_fd(socket),
                        dir: dir.clone(),
                        name: cstring("portal", SOCKET_NAME)?,
                    },
                );
                self.push(
                    format!("make {dir_text} read-only"),
                    Action::Remount { dst: dir.clone(), attrs: MOUNT_RDONLY },
                );
            }
        }
        Ok(())
    }

    /// Plans the spec's mounts in order. Destinations missing inside the
    /// read-only system view are spliced in first; right after the last
    /// system bind come the secret masks and the portal (which covers the
    /// system view's /usr/bin/bwrap), before everything the caller adds.
    fn expand_view(
        &mut self,
        mounts: &[MountOp],
        portal: Option<&(OwnedFd, &Path)>,
    ) -> Result<(), SpecError> {
        let last_system = mounts.iter().rposition(|op| matches!(op, MountOp::SystemBind { .. }));
        if last_system.is_none()
            && let Some((socket, exe)) = portal
        {
            self.push_portal(exe, socket, false)?;
        }
        for (i, op) in mounts.iter().enumerate() {
            if !matches!(op, MountOp::SystemBind { .. }) {
                for step in self.splicer.steps_for(op.dst())? {
                    self.push_splice(step)?;
                }
            }
            self.expand(op)?;
            self.splicer.planned(op);
            if Some(i) == last_system {
                self.push_masks()?;
                if let Some((socket, exe)) = portal {
                    self.push_portal(exe, socket, true)?;
                }
            }
        }
        Ok(())
    }

    /// The binds made after the command's setup, their sources opened now.
    fn deferred_binds(&mut self, binds: &[crate::spec::DeferredBind]) -> Result<Vec<Deferred>, SpecError> {
        if binds.len() > MAX_DEFERRED {
            return Err(SpecError::new(format!("at most {MAX_DEFERRED} deferred binds are supported")));
        }
        let mut deferred = Vec::with_capacity(binds.len());
        for bind in binds {
            let (dst_text, dst) = guest_rel("bind destination", &bind.dst)?;
            let source = self.host_source(&bind.src, bind.access, &dst_text)?;
            deferred.push(Deferred { source, dst });
        }
        Ok(deferred)
    }

    // Just over ~80 lines: one short arm per kind of mount operation, each
    // saying the step it plans; the longer ones are methods already.
    fn expand(&mut self, op: &MountOp) -> Result<(), SpecError> {
        let (dst_text, dst) = guest_rel("mount destination", op.dst())?;
        match op {
            MountOp::SystemBind { src, .. } => match self.hiding.take_tree() {
                Some(tree) => {
                    let kind =
                        if std::fs::metadata(src).is_ok_and(|m| m.is_dir()) { Kind::Dir } else { Kind::File };
                    self.push(
                        format!("bind {} -> {dst_text} (ro, idmapped)", src.display()),
                        Action::AttachTree { tree, dst, kind },
                    );
                }
                None => {
                    let index = self.host_source(src, Access::Ro, &dst_text)?;
                    self.push_host_bind(index, dst);
                }
            },
            MountOp::Bind { src, access, .. } => {
                let index = self.host_source(src, *access, &dst_text)?;
                self.push_host_bind(index, dst);
            }
            MountOp::Tmpfs { mode, owned_by_user, size, .. } => {
                self.push_tmpfs(*mode, *owned_by_user, *size, dst, &dst_text)?
            }
            MountOp::Proc { mode, .. } => {
                let prepared = procfs::prepare(&dst_text, dst, *mode, self.bwrap)?;
                self.push(format!("mount proc on {dst_text}"), Action::Proc(prepared));
            }
            MountOp::Dev { bwrap, .. } => self.expand_dev(&dst_text, *bwrap)?,
            MountOp::File { contents, mode, .. } => self.push_generated(contents, *mode, dst, &dst_text)?,
            MountOp::Symlink { target, .. } => self.push(
                format!("symlink {dst_text} -> {target}"),
                Action::Symlink { target: cstring("symlink target", target.as_str())?, dst },
            ),
            MountOp::Dir { mode, .. } => {
                self.push(format!("create directory {dst_text}"), Action::Dir { dst, mode: *mode })
            }
            MountOp::DevBind { src, .. } => {
                let what = format!("bind {} -> {dst_text} (rw, devices)", src.display());
                let index = self.host_source_with(src, MOUNT_NOSUID, what)?;
                self.push_host_bind(index, dst);
            }
            MountOp::Mqueue { .. } => self.push(
                format!("mount mqueue on {dst_text}"),
                Action::Fs {
                    fstype: cstring("fstype", "mqueue")?,
                    options: Vec::new(),
                    attrs: MOUNT_NOSUID | MOUNT_NODEV | MOUNT_NOEXEC,
                    dst,
                    pooled: false,
                },
            ),
            MountOp::CreateFile { contents, mode, .. } => self.push(
                format!("create file {dst_text}"),
                Action::CreateFile { dst, contents: contents.clone(), mode: *mode },
            ),
            MountOp::BindData { contents, mode, access, .. } => {
                let ro = if *access == Access::Ro { MOUNT_RDONLY } else { 0 };
                self.push(
                    format!("bind the data for {dst_text}"),
                    Action::BindData {
                        dst,
                        contents: contents.clone(),
                        mode: *mode,
                        attrs: ro | MOUNT_NOSUID | MOUNT_NODEV,
                    },
                );
            }
            MountOp::Chmod { mode, .. } => {
                self.push(format!("chmod {mode:o} {dst_text}"), Action::Chmod { dst, mode: *mode })
            }
            MountOp::Overlay { lower, upper, tmp, .. } => {
                self.overlay(lower, upper.as_ref(), *tmp, dst, &dst_text)?
            }
            MountOp::RemountRo { .. } => self.push(
                format!("remount {dst_text} read-only"),
                Action::Remount { dst, attrs: MOUNT_RDONLY | MOUNT_NOSUID | MOUNT_NODEV },
            ),
        }
        Ok(())
    }

    /// Binds the host source opened as `index` at `dst`.
    fn push_host_bind(&mut self, index: usize, dst: CString) {
        let source = &self.host_sources[index];
        let (what, kind) = (source.what.clone(), source.kind);
        self.push(what, Action::Bind { source: Source::Host(index), dst, kind });
    }

    /// A tmpfs at `dst`: its `mode`, its size (its own, or the sandbox's
    /// default), owned by the sandbox user if asked, with the file label.
    fn push_tmpfs(
        &mut self,
        mode: u32,
        owned_by_user: bool,
        size: Option<u64>,
        dst: CString,
        dst_text: &str,
    ) -> Result<(), SpecError> {
        let mut options = vec![option("mode", &format!("{mode:o}"))?];
        options.extend(self.tmpfs_size_options(size.map(limits::tmpfs_sized))?);
        if owned_by_user {
            // Interpreted in the sandbox's user namespace, where these ids are mapped.
            options.push(option("uid", &self.user.uid.to_string())?);
            options.push(option("gid", &self.user.gid.to_string())?);
        }
        options.extend(self.file_label.as_ref().map(crate::selinux::mount_option));
        self.push(
            format!("mount tmpfs on {dst_text}"),
            Action::Fs {
                fstype: cstring("fstype", "tmpfs")?,
                options,
                attrs: MOUNT_NOSUID | MOUNT_NODEV,
                dst,
                // bwrap's `--size` makes a tmpfs of its own (the
                // portal's worker reserves it from the pool).
                pooled: self.pool && size.is_none(),
            },
        );
        Ok(())
    }

    /// A generated read-only file at `dst`: staged, then bound.
    fn push_generated(
        &mut self,
        contents: &[u8],
        mode: u32,
        dst: CString,
        dst_text: &str,
    ) -> Result<(), SpecError> {
        let path = self.stage(&format!("the contents of {dst_text}"), contents.to_vec(), mode)?;
        self.push(
            format!("bind the generated {dst_text}"),
            Action::Bind {
                source: Source::New {
                    path,
                    attrs: MOUNT_RDONLY | MOUNT_NOSUID | MOUNT_NODEV,
                    optional: false,
                },
                dst,
                kind: Kind::File,
            },
        );
        Ok(())
    }

    /// Covers what a scan found (when no idmapped mount was possible): an
    /// empty mode-0 staged file bound over each file, an empty mode-0 tmpfs
    /// over each directory, all read-only.
    fn push_masks(&mut self) -> Result<(), SpecError> {
        let SecretHiding::Masks(masks) = &self.hiding else { return Ok(()) };
        let masks = masks.clone();
        let mut file: Option<CString> = None;
        for (path, dir) in masks {
            let (dst_text, dst) = guest_rel("masked path", &path)?;
            let ro = MOUNT_RDONLY | MOUNT_NOSUID | MOUNT_NODEV | MOUNT_NOEXEC;
            if dir {
                self.push(
                    format!("mask {dst_text}"),
                    Action::Fs {
                        fstype: cstring("fstype", "tmpfs")?,
                        options: vec![option("mode", "0")?],
                        attrs: ro,
                        dst,
                        pooled: false,
                    },
                );
                continue;
            }
            let source = match &file {
                Some(f) => f.clone(),
                None => {
                    let f = self.stage("an empty file for masking host secrets", Vec::new(), 0)?;
                    file = Some(f.clone());
                    f
                }
            };
            self.push(
                format!("mask {dst_text}"),
                Action::Bind {
                    source: Source::New { path: source, attrs: ro, optional: false },
                    dst,
                    kind: Kind::File,
                },
            );
        }
        Ok(())
    }

    /// An overlay of host directories, made with the host sources.
    fn overlay(
        &mut self,
        lower: &[PathBuf],
        upper: Option<&(PathBuf, PathBuf)>,
        tmp: bool,
        dst: CString,
        dst_text: &str,
    ) -> Result<(), SpecError> {
        let fd_sources = self.fd_sources;
        let path = |p: &Path| overlay_path(p, fd_sources);
        // overlayfs unescapes these (`\` before any byte), not `lowerdir+`.
        let escaped = |p: &Path| path(p).map(|p| p.replace('\\', "\\\\"));
        let mut options = Vec::new();
        for dir in lower {
            options.push(option("lowerdir+", &path(dir)?)?);
        }
        if let Some((up, work)) = upper {
            options.push(option("upperdir", &escaped(up)?)?);
            options.push(option("workdir", &escaped(work)?)?);
        }
        if self.overlay_userxattr {
            options.push((cstring("overlay option", "userxattr")?, None));
        }
        let kind = if tmp {
            "tmp-overlay"
        } else if upper.is_some() {
            "overlay"
        } else {
            "ro-overlay"
        };
        let tmp_overlays =
            self.host_sources.iter().filter(|s| s.overlay.as_ref().is_some_and(|o| o.tmp)).count();
        let shown = bwrap_overlay_options(lower, upper, tmp.then_some(tmp_overlays), fd_sources)?;
        let failure = format!("Can't make overlay mount on /newroot{dst_text} with options {shown}");
        let what = format!("mount {kind} on {dst_text}");
        let attrs = MOUNT_NOSUID | MOUNT_NODEV | if upper.is_none() && !tmp { MOUNT_RDONLY } else { 0 };
        self.host_sources.push(HostSource {
            what: what.clone(),
            overlay: Some(OverlayFs { options, tmp, failure }),
            src: CString::default(),
            fd: None,
            kind: Kind::Dir,
            attrs,
        });
        let index = self.host_sources.len() - 1;
        self.push(what, Action::Bind { source: Source::Host(index), dst, kind: Kind::Dir });
        Ok(())
    }

    /// Writes a generated file into the staging directory; returns its path.
    fn stage(&mut self, what: &str, contents: Vec<u8>, mode: u32) -> Result<CString, SpecError> {
        if self.staged.is_empty() {
            self.push(
                "create the staging directory".into(),
                Action::Dir { dst: cstring("staging dir", STAGING_DIR)?, mode: 0o700 },
            );
        }
        let path = cstring("file name", format!("{STAGING_DIR}/file-{}", self.steps.len()))?;
        self.staged.push(path.clone());
        self.push(format!("write {what}"), Action::WriteFile { path: path.clone(), contents, mode });
        Ok(path)
    }

    /// `size` and `nr_inodes` options: the mount's own, else the limit's.
    fn tmpfs_size_options(
        &self,
        own: Option<(u64, u64)>,
    ) -> Result<[(CString, Option<CString>); 2], SpecError> {
        let (size, inodes) = own.unwrap_or(self.tmpfs);
        Ok([option("size", &size.to_string())?, option("nr_inodes", &inodes.to_string())?])
    }

    // Just over ~80 lines: `/dev`'s steps as one ordered list, in
    // bubblewrap's order; split, the order would be spread over functions.
    /// The minimal `/dev`, as bubblewrap's `--dev` builds it; the
    /// runtime's (`bwrap` false) read-only and `noexec`, with a private
    /// tmpfs for `shm`.
    fn expand_dev(&mut self, dst_text: &str, bwrap: bool) -> Result<(), SpecError> {
        let exec = if bwrap { MOUNT_NODEV } else { MOUNT_NOEXEC };
        let at = |entry: &str| cstring("dev path", child_rel(dst_text, entry));
        let label = self.file_label.as_ref().map(crate::selinux::mount_option);
        let pooled = self.pool;
        let tmpfs = |dst: CString, mode: &str, attrs: u64| -> Result<Action, SpecError> {
            Ok(Action::Fs {
                fstype: cstring("fstype", "tmpfs")?,
                options: std::iter::once(option("mode", mode)?).chain(label.clone()).collect(),
                attrs,
                dst,
                pooled,
            })
        };
        self.push(format!("mount tmpfs on {dst_text}"), tmpfs(at("")?, "755", MOUNT_NOSUID | exec)?);
        for dev in DEVICES {
            let host = format!("/dev/{dev}");
            let is_char_device = std::fs::metadata(&host).is_ok_and(|m| m.file_type().is_char_device());
            if !is_char_device {
                continue;
            }
            self.host_sources.push(HostSource {
                overlay: None,
                what: format!("bind {host} -> {dst_text}/{dev}"),
                src: cstring("device", format!("dev/{dev}"))?,
                fd: None,
                kind: Kind::File,
                // Device nodes: no nodev, of course.
                attrs: MOUNT_NOSUID | if bwrap { 0 } else { MOUNT_NOEXEC },
            });
            let index = self.host_sources.len() - 1;
            self.push(
                format!("bind {host} -> {dst_text}/{dev}"),
                Action::Bind { source: Source::Host(index), dst: at(dev)?, kind: Kind::File },
            );
        }
        for (name, target) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
            ("core", "/proc/kcore"),
            ("ptmx", "pts/ptmx"),
        ] {
            self.push(
                format!("symlink {dst_text}/{name} -> {target}"),
                Action::Symlink { target: cstring("symlink", target)?, dst: at(name)? },
            );
        }
        self.push(
            format!("mount devpts on {dst_text}/pts"),
            Action::Fs {
                fstype: cstring("fstype", "devpts")?,
                options: vec![
                    (cstring("option", "newinstance")?, None),
                    option("ptmxmode", "0666")?,
                    option("mode", "620")?,
                ],
                attrs: MOUNT_NOSUID | MOUNT_NOEXEC,
                dst: at("pts")?,
                pooled: false,
            },
        );
        if bwrap {
            self.push(
                format!("create directory {dst_text}/shm"),
                Action::Dir { dst: at("shm")?, mode: 0o755 },
            );
            return Ok(());
        }
        let mut shm = tmpfs(at("shm")?, "1777", MOUNT_NOSUID | MOUNT_NODEV)?;
        if let Action::Fs { options, .. } = &mut shm {
            options.extend(self.tmpfs_size_options(None)?);
        }
        self.push(format!("mount tmpfs on {dst_text}/shm"), shm);
        self.push(
            format!("make {dst_text} read-only"),
            Action::Remount { dst: at("")?, attrs: MOUNT_RDONLY },
        );
        Ok(())
    }
}

/// How host secrets in the system view are kept from a sandbox user that
/// maps onto host root (see idmap.rs and secrets.rs).
enum SecretHiding {
    /// The sandbox user is not host root: host permissions already apply.
    NotNeeded,
    /// Idmapped clones of the system binds, in spec order, and the helper
    /// process to reap once the sandbox has ended.
    Idmapped(std::collections::VecDeque<OwnedFd>, Option<idmap::Helper>),
    /// Empty read-only files/directories over what a scan found.
    Masks(Vec<(String, bool)>),
}

impl SecretHiding {
    fn decide(spec: &SandboxSpec, root_uid: bool, root_gid: bool) -> SecretHiding {
        let system: Vec<(&std::path::PathBuf, &String)> = spec
            .mounts
            .iter()
            .filter_map(|op| match op {
                MountOp::SystemBind { src, dst } => Some((src, dst)),
                _ => None,
            })
            .collect();
        if system.is_empty() || !(root_uid || root_gid) {
            return SecretHiding::NotNeeded;
        }
        // The child keeps their descriptors through its descriptor sweep.
        let too_many = system.len() > crate::sys::MAX_KEPT_FDS - 6;
        let attempt = || -> Result<(std::collections::VecDeque<OwnedFd>, idmap::Helper), String> {
            let (userns, helper) = idmap::nobody_userns().map_err(|(call, e)| format!("{call} => {e}"))?;
            let mut trees = std::collections::VecDeque::with_capacity(system.len());
            for (src, _) in &system {
                let canonical = std::fs::canonicalize(src).map_err(|e| format!("{}: {e}", src.display()))?;
                let c = CString::new(canonical.as_os_str().as_encoded_bytes())
                    .map_err(|_| format!("{}: NUL in path", src.display()))?;
                let tree = idmap::clone_idmapped(&c, &userns)
                    .map_err(|(call, e)| format!("{call}(\"{}\") => {e}", canonical.display()))?;
                trees.push_back(tree);
            }
            Ok((trees, helper))
        };
        // Test-only: exercise the fallback on a host where idmapped mounts work.
        let attempt = || {
            if too_many {
                return Err(format!("{} system binds are more than can be idmapped", system.len()));
            }
            if crate::test_only::var(crate::idmap::TEST_NO_IDMAP_ENV).is_some() {
                return Err(format!("{} is set (test-only)", crate::idmap::TEST_NO_IDMAP_ENV));
            }
            attempt()
        };
        match attempt() {
            Ok((trees, helper)) => {
                tracing::debug!("system view: idmapped (host root's files shown as nobody's)");
                SecretHiding::Idmapped(trees, Some(helper))
            }
            Err(why) => {
                let dsts: Vec<String> = system.iter().map(|(_, d)| (*d).clone()).collect();
                let masks = crate::secrets::masks(&dsts);
                tracing::info!(
                    "system view: no idmapped mount ({why}); masking {} entries of {} that are not world-readable",
                    masks.len(),
                    crate::secrets::SCANNED.join(", ")
                );
                SecretHiding::Masks(masks)
            }
        }
    }

    fn take_tree(&mut self) -> Option<OwnedFd> {
        match self {
            SecretHiding::Idmapped(trees, _) => trees.pop_front(),
            _ => None,
        }
    }

    fn take_helper(&mut self) -> Option<idmap::Helper> {
        match self {
            SecretHiding::Idmapped(_, helper) => helper.take(),
            _ => None,
        }
    }
}

/// The guest paths Landlock grants more than read/execute, from the mounts.
pub(crate) fn landlock_paths(spec: &SandboxSpec) -> Result<Vec<(String, Grant)>, SpecError> {
    let norm = |p: &str| {
        guest_path::normalize(p).map_err(|why| SpecError::new(format!("mount destination {p:?} {why}")))
    };
    let mut paths = Vec::new();
    for op in &spec.mounts {
        match op {
            MountOp::Bind { dst, access: Access::Rw, .. }
            | MountOp::DevBind { dst, .. }
            | MountOp::Tmpfs { dst, .. }
            | MountOp::Mqueue { dst }
            | MountOp::CreateFile { dst, .. }
            | MountOp::BindData { dst, access: Access::Rw, .. }
            | MountOp::Overlay { dst, upper: Some(_), .. }
            | MountOp::Overlay { dst, tmp: true, .. } => paths.push((norm(dst)?, Grant::Write)),
            MountOp::Dev { dst, bwrap } => {
                let dst = norm(dst)?;
                if *bwrap {
                    paths.push((dst.clone(), Grant::Write));
                } else {
                    paths.push((format!("{}/shm", dst.trim_end_matches('/')), Grant::Write));
                }
                paths.push((dst, Grant::Dev));
            }
            MountOp::Proc { dst, .. } => paths.push((norm(dst)?, Grant::Proc)),
            _ => {}
        }
    }
    for bind in &spec.deferred_binds {
        if bind.access == Access::Rw {
            paths.push((norm(&bind.dst)?, Grant::Write));
        }
    }
    Ok(paths)
}

/// The mode bubblewrap gives the missing parents of an operation's
/// destination: 0755 without the group's or others' bits where the
/// operation's own mode has none of theirs; operations without a mode of
/// their own (binds, symlinks, `/proc`, `/dev`, ...) count as 0.
fn bwrap_parents(op: &MountOp) -> u32 {
    let own = match op {
        MountOp::Tmpfs { mode, .. }
        | MountOp::Dir { mode, .. }
        | MountOp::CreateFile { mode, .. }
        | MountOp::BindData { mode, .. } => *mode,
        _ => 0,
    };
    parents_for(own)
}

/// 0755 reduced as a directory of mode `mode` would have its parents.
pub(crate) fn parents_for(mode: u32) -> u32 {
    0o700 | if mode & 0o070 != 0 { 0o050 } else { 0 } | if mode & 0o007 != 0 { 0o005 } else { 0 }
}

/// A `key=value` filesystem option.
/// The descriptor number a `/proc/self/fd/N` source names.
/// An overlay layer's path as overlayfs is given it: the host path with
/// its links resolved, or, with `fd_sources`, the `/proc/self/fd/N` of a
/// descriptor the caller opened (overlayfs follows the magic link to what
/// it is open on).
fn overlay_path(p: &Path, fd_sources: bool) -> Result<String, SpecError> {
    if fd_sources {
        descriptor_of(p)?;
        return Ok(p.display().to_string());
    }
    let real = std::fs::canonicalize(p)
        .map_err(|e| SpecError::new(format!("overlay source {}: {}", p.display(), io_error_text(&e))))?;
    let real = real
        .into_os_string()
        .into_string()
        .map_err(|_| SpecError::new(format!("overlay source {}: path is not UTF-8", p.display())))?;
    Ok(real)
}

/// bubblewrap's option string of an overlay, as its messages show it: its
/// paths for the caller's tree (`/oldroot`) and, for the tmp-overlay
/// numbered `tmp_overlay` (when no `upper` is given), its layers.
fn bwrap_overlay_options(
    lower: &[PathBuf],
    upper: Option<&(PathBuf, PathBuf)>,
    tmp_overlay: Option<usize>,
    fd_sources: bool,
) -> Result<String, SpecError> {
    let bwrap_path = |p: &Path| -> Result<String, SpecError> {
        let mut escaped = String::from("/oldroot");
        for c in overlay_path(p, fd_sources)?.chars() {
            if matches!(c, '\\' | ',' | ':') {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        Ok(escaped)
    };
    let mut shown = match (upper, tmp_overlay) {
        (Some((up, work)), _) => format!("upperdir={},workdir={},", bwrap_path(up)?, bwrap_path(work)?),
        (None, Some(n)) => format!("upperdir=/tmp-overlay-upper-{n},workdir=/tmp-overlay-work-{n},"),
        (None, None) => String::new(),
    };
    let layers = lower.iter().map(|p| bwrap_path(p)).collect::<Result<Vec<_>, _>>()?;
    shown.push_str(&format!("lowerdir={},userxattr", layers.join(":")));
    Ok(shown)
}

fn descriptor_of(src: &Path) -> Result<std::os::fd::RawFd, SpecError> {
    src.to_str()
        .and_then(|s| s.strip_prefix("/proc/self/fd/"))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| SpecError::new(format!("bind source {}: not a descriptor", src.display())))
}

fn option(key: &str, value: &str) -> Result<(CString, Option<CString>), SpecError> {
    Ok((cstring("option", key)?, Some(cstring("option value", value)?)))
}

/// `dst/entry` relative to the new root.
fn child_rel(dst_text: &str, entry: &str) -> String {
    let dst = dst_text.trim_start_matches('/');
    match (dst.is_empty(), entry.is_empty()) {
        (_, true) => dst.to_string(),
        (true, false) => entry.to_string(),
        (false, false) => format!("{dst}/{entry}"),
    }
}

impl ExecPlan {
    /// The spec's command. With nested sandboxes on, the portal's `bin` is
    /// first on `PATH`, so the command finds our `bwrap` before any other.
    pub(crate) fn prepare(spec: &SandboxSpec) -> Result<ExecPlan, SpecError> {
        let mut env = spec.env.clone();
        if spec.nested {
            let bin = crate::portal::PORTAL_BIN.rsplit_once('/').map_or("", |(dir, _)| dir);
            let path = env.iter().rev().find(|(k, _)| k == "PATH").map_or(DEFAULT_PATH, |(_, v)| v.as_str());
            if !path.split(':').any(|dir| dir == bin) {
                let path = format!("{bin}:{path}");
                crate::builder::set_var(&mut env, "PATH".into(), path);
            }
        }
        let program = spec.argv.first().ok_or_else(|| SpecError::new("no command given"))?;
        if program.is_empty() {
            return Err(SpecError::new("the command name is empty"));
        }
        ExecPlan::new(program, &spec.argv, &env)
    }

    /// Runs `program` (looked up in `env`'s `PATH` unless it has a `/`)
    /// with `argv` (whose first element is the command's `argv[0]`). An
    /// empty `program` is not found, as `execvp` says.
    pub(crate) fn new(
        program: &str,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<ExecPlan, SpecError> {
        let program = program.to_string();
        let argv: Vec<CString> =
            argv.iter().map(|a| cstring("command argument", a.as_str())).collect::<Result<_, _>>()?;
        let mut env_strings = Vec::with_capacity(env.len());
        for (k, v) in env {
            if k.is_empty() || k.contains('=') {
                return Err(SpecError::new(format!("environment variable name {k:?} is invalid")));
            }
            let pair = format!("{k}={v}");
            if pair.contains('\0') {
                return Err(SpecError::new(format!("environment variable {k} contains a NUL byte")));
            }
            env_strings.push(pair.into_bytes());
        }
        let search_path =
            env.iter().rev().find(|(k, _)| k == "PATH").map_or(DEFAULT_PATH, |(_, v)| v.as_str()).to_string();
        let candidates = if program.is_empty() {
            Vec::new()
        } else if program.contains('/') {
            vec![cstring("command", program.as_str())?]
        } else {
            search_path
                .split(':')
                .filter(|dir| !dir.is_empty())
                .map(|dir| cstring("command", format!("{}/{program}", dir.trim_end_matches('/'))))
                .collect::<Result<_, _>>()?
        };
        let mut argv_ptrs: Vec<*const c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let (envp, mut envp_ptrs) = crate::confine::EnvBlock::new(&env_strings);
        envp_ptrs.push(std::ptr::null());
        Ok(ExecPlan { program, candidates, search_path, _argv: argv, envp, argv_ptrs, envp_ptrs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{Home, SandboxBuilder};

    /// `sh` in a sandbox with this workspace, planned (not run).
    fn plan_of(builder: impl FnOnce(SandboxBuilder) -> SandboxBuilder) -> Result<Plan, SpecError> {
        let ws = std::env::temp_dir();
        let spec = builder(SandboxBuilder::new("sh").arg("-c").arg("true").workspace(&ws).home(Home::Tmpfs))
            .build()?;
        Plan::prepare(&spec, None)
    }

    fn dsts(plan: &Plan) -> Vec<String> {
        plan.steps
            .iter()
            .filter_map(|s| match &s.action {
                Action::Bind { dst, .. } | Action::Fs { dst, .. } | Action::Dir { dst, .. } => {
                    Some(dst.to_string_lossy().into_owned())
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_standard_layout_is_planned_in_order() {
        let plan = plan_of(|b| b).unwrap();
        let dsts = dsts(&plan);
        let at =
            |d: &str| dsts.iter().position(|x| x == d).unwrap_or_else(|| panic!("no step for {d}: {dsts:?}"));
        // builder.rs's order: /dev, /tmp, /workspace, the home, then the
        // generated passwd and group (the system view comes before them as
        // binds or, for a root-mapped user, idmapped trees).
        assert!(at("dev") < at("tmp") && at("tmp") < at("workspace"), "{dsts:?}");
        assert!(at("workspace") < at("home/agent") && at("home/agent") < at("etc/passwd"), "{dsts:?}");
        assert!(plan.clone_flags & libc::CLONE_NEWUSER as c_ulong != 0);
        assert!(plan.clone_flags & libc::CLONE_NEWPID as c_ulong != 0);
        // The workspace bind's source is the canonical host directory.
        let ws = std::fs::canonicalize(std::env::temp_dir()).unwrap();
        let rel = ws.strip_prefix("/").unwrap().to_str().unwrap();
        assert!(plan.host_sources.iter().any(|h| h.src.to_str() == Ok(rel)), "no host source {rel}");
        assert!(plan.portal.is_none() && plan.nested.is_none());
    }

    #[test]
    fn network_off_adds_a_network_namespace() {
        // One plan at a time: a plan owns launcher-side resources (the
        // idmap helper) meant for one launch.
        let on = plan_of(|b| b.network(Network::On)).unwrap();
        assert_eq!(on.clone_flags & libc::CLONE_NEWNET as c_ulong, 0);
        assert!(!on.network_off);
        drop(on);
        let off = plan_of(|b| b.network(Network::Off)).unwrap();
        assert_ne!(off.clone_flags & libc::CLONE_NEWNET as c_ulong, 0);
        assert!(off.network_off);
    }

    #[test]
    fn the_command_is_looked_up_on_the_sandbox_path() {
        let plan = plan_of(|b| b.cwd("/workspace")).unwrap();
        assert_eq!(plan.exec.program, "sh");
        assert!(
            plan.exec.candidates.iter().any(|c| c.to_bytes().ends_with(b"/bin/sh")),
            "{:?}",
            plan.exec.candidates
        );
        // The argv array ends with a null pointer.
        assert_eq!(plan.exec.argv_ptrs.len(), 4);
        assert!(plan.exec.argv_ptrs[3].is_null());
    }

    #[test]
    fn a_missing_bind_source_fails_before_clone_with_its_path() {
        let missing = std::env::temp_dir().join(format!("tuixiu-prepare-missing-{}", std::process::id()));
        let err = plan_of(|b| {
            b.mount(MountOp::Bind { src: missing.clone(), dst: "/data".into(), access: Access::Ro })
        })
        .err()
        .expect("a missing source is refused");
        assert!(err.to_string().contains(&missing.display().to_string()), "{err}");
    }

    #[test]
    fn child_rel_joins_without_stray_slashes() {
        assert_eq!(child_rel("/dev", ""), "dev");
        assert_eq!(child_rel("/dev", "pts"), "dev/pts");
        assert_eq!(child_rel("/", "pts"), "pts");
    }
}
