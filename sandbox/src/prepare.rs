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
use std::path::Path;

use libc::{c_char, c_ulong};

use crate::error::{SpecError, io_error_text};
use crate::guest_path;
use crate::idmap;
use crate::landlock::{self, Grant};
use crate::limits;
use crate::seccomp::{self, Sockets};
use crate::spec::{Access, MountOp, Network, SandboxSpec, UserView};

const MOUNT_NOSUID: u64 = libc::MOUNT_ATTR_NOSUID;
const MOUNT_NODEV: u64 = libc::MOUNT_ATTR_NODEV;
const MOUNT_NOEXEC: u64 = libc::MOUNT_ATTR_NOEXEC;
const MOUNT_RDONLY: u64 = libc::MOUNT_ATTR_RDONLY;

/// Device nodes bound from the host into the minimal `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// `/proc` entries covered read-only, as bubblewrap does.
const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus"];
/// Host directories the staging tmpfs may be mounted over (in the child's
/// private mount namespace only); the first that exists is used.
const STAGING_CANDIDATES: &[&str] = &["/tmp", "/var/tmp", "/mnt", "/run", "/media", "/srv"];
/// `PATH` used for the command lookup when the environment has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Which tree a bind's source path is relative to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tree {
    /// The host's root, reachable as `/oldroot` after the first pivot.
    Host,
    /// The sandbox root being built.
    New,
    /// The private staging tmpfs (`/` between the two pivots).
    Staging,
}

/// What to create at a bind destination that does not exist yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir,
    File,
}

/// One primitive the child executes. Paths are relative to their tree.
pub(crate) enum Action {
    /// Clone the mount tree at `src` (recursively), set `attrs` on every
    /// mount of the clone, and attach it at `dst` in the new root.
    Bind {
        from: Tree,
        src: CString,
        dst: CString,
        kind: Kind,
        attrs: u64,
        optional: bool,
    },
    /// Mount a fresh filesystem at `dst` (created as a directory).
    Fs {
        fstype: CString,
        options: Vec<(CString, Option<CString>)>,
        attrs: u64,
        dst: CString,
    },
    /// Create file `name` on the staging tmpfs with these bytes.
    WriteStaging {
        name: CString,
        contents: Vec<u8>,
        mode: u32,
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
    /// Create directory `name` on the staging tmpfs.
    StagingDir {
        name: CString,
        mode: u32,
    },
    /// Attach a detached mount tree the launcher prepared (an idmapped
    /// system bind) at `dst`.
    AttachTree {
        tree: OwnedFd,
        dst: CString,
        kind: Kind,
    },
}

/// A primitive with the words used when it fails.
pub(crate) struct Step {
    pub what: String,
    pub action: Action,
}

/// How to execute the command: argv/envp as C arrays and the candidate
/// paths of a `PATH` lookup done with the sandbox's own `PATH`.
pub(crate) struct ExecPlan {
    pub program: String,
    pub candidates: Vec<CString>,
    pub search_path: String,
    // The pointer arrays point into these; CString heap buffers never move.
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    pub argv_ptrs: Vec<*const c_char>,
    pub envp_ptrs: Vec<*const c_char>,
}

pub(crate) struct Plan {
    pub clone_flags: c_ulong,
    pub uid: u32,
    pub gid: u32,
    pub host_uid: u32,
    pub host_gid: u32,
    pub staging_dir: CString,
    pub steps: Vec<Step>,
    pub hostname: CString,
    pub network_off: bool,
    pub cwd: CString,
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
    /// The idmap helper process, reaped when the plan is dropped.
    pub _idmap_helper: Option<idmap::Helper>,
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
    // SAFETY: geteuid/getegid cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

impl Plan {
    pub(crate) fn prepare(spec: &SandboxSpec) -> Result<Plan, SpecError> {
        spec.user.validate()?;
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

        let mut clone_flags = libc::CLONE_NEWUSER
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUTS;
        if spec.network == Network::Off {
            clone_flags |= libc::CLONE_NEWNET;
        }

        let staging_dir = STAGING_CANDIDATES.iter().find(|p| Path::new(p).is_dir()).ok_or_else(|| {
            SpecError::new("none of /tmp, /var/tmp, /mnt, /run exists to stage the new root on")
        })?;

        let mut steps = Vec::with_capacity(spec.mounts.len() * 2 + 16);
        let mut hiding = SecretHiding::decide(spec, host_uid, host_gid);
        let last_system = spec.mounts.iter().rposition(|op| matches!(op, MountOp::SystemBind { .. }));
        for (i, op) in spec.mounts.iter().enumerate() {
            expand(op, &spec.user, &mut hiding, &mut steps)?;
            if Some(i) == last_system {
                hiding.push_masks(&mut steps)?;
            }
        }
        steps.push(Step {
            what: "make / read-only".into(),
            action: Action::Remount { dst: CString::default(), attrs: MOUNT_RDONLY },
        });

        if spec.hostname.is_empty() || spec.hostname.len() > 64 || spec.hostname.contains(['\0', '/']) {
            return Err(SpecError::new(format!(
                "hostname {:?} must be 1-64 bytes without '/'",
                spec.hostname
            )));
        }
        let (cwd_text, _) = guest_rel("working directory", &spec.cwd)?;
        if spec.deferred_binds.len() > MAX_DEFERRED {
            return Err(SpecError::new(format!("at most {MAX_DEFERRED} deferred binds are supported")));
        }
        let mut deferred = Vec::with_capacity(spec.deferred_binds.len());
        for bind in &spec.deferred_binds {
            let (dst_text, dst) = guest_rel("bind destination", &bind.dst)?;
            deferred.push(Deferred { host: HostBind::prepare(&bind.src, bind.access, &dst_text)?, dst });
        }

        let security = &spec.security;
        if security.no_ip && spec.network != Network::Off {
            return Err(SpecError::new(
                "denying IP sockets (network none) needs a private network namespace (network off)",
            ));
        }
        let sockets = match (spec.network, security.no_ip) {
            (_, true) => Sockets::UnixOnly,
            (Network::Off, false) => Sockets::LocalAndInet,
            (Network::On, false) => Sockets::Profile,
        };
        let seccomp = seccomp::compile(&security.seccomp, security.allow_ptrace, sockets)?;
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
        let (landlock, enforcement) =
            landlock::plan(security.landlock, &landlock_paths(spec)?, security.no_ip)?;
        match &enforcement {
            landlock::Enforcement::Full { .. } => tracing::info!("landlock: {enforcement}"),
            landlock::Enforcement::Not { .. } if security.landlock == crate::LandlockMode::Off => {
                tracing::info!("landlock: {enforcement}")
            }
            _ => tracing::warn!("landlock: {enforcement}"),
        }
        let limits = limits::prepare(&security.limits, idmap::uid_is_host_root(host_uid))?;

        Ok(Plan {
            _idmap_helper: hiding.take_helper(),
            seccomp,
            landlock,
            limits,
            clone_flags: clone_flags as c_ulong,
            uid: spec.user.uid,
            gid: spec.user.gid,
            host_uid,
            host_gid,
            staging_dir: cstring("staging dir", *staging_dir)?,
            steps,
            hostname: cstring("hostname", spec.hostname.as_str())?,
            network_off: spec.network == Network::Off,
            cwd: cstring("working directory", cwd_text.as_str())?,
            new_session: spec.new_session,
            exec: ExecPlan::prepare(spec)?,
            deferred,
            apply_phase: false,
        })
    }

    pub(crate) fn uid_map(&self) -> String {
        crate::user::id_map_line(self.uid, self.host_uid)
    }

    pub(crate) fn gid_map(&self) -> String {
        crate::user::id_map_line(self.gid, self.host_gid)
    }
}

fn expand(
    op: &MountOp,
    user: &UserView,
    hiding: &mut SecretHiding,
    steps: &mut Vec<Step>,
) -> Result<(), SpecError> {
    let (dst_text, dst) = guest_rel("mount destination", op.dst())?;
    match op {
        MountOp::SystemBind { src, .. } => {
            let host = HostBind::prepare(src, Access::Ro, &dst_text)?;
            match hiding.take_tree() {
                Some(tree) => steps.push(Step {
                    what: format!("{} (idmapped)", host.what),
                    action: Action::AttachTree { tree, dst, kind: host.kind },
                }),
                None => steps.push(Step {
                    what: host.what,
                    action: Action::Bind {
                        from: Tree::Host,
                        src: host.src,
                        dst,
                        kind: host.kind,
                        attrs: host.attrs,
                        optional: false,
                    },
                }),
            }
        }
        MountOp::Bind { src, access, .. } => {
            let host = HostBind::prepare(src, *access, &dst_text)?;
            steps.push(Step {
                what: host.what,
                action: Action::Bind {
                    from: Tree::Host,
                    src: host.src,
                    dst,
                    kind: host.kind,
                    attrs: host.attrs,
                    optional: false,
                },
            });
        }
        MountOp::Tmpfs { mode, owned_by_user, size, .. } => {
            let mut options =
                vec![(cstring("tmpfs option", "mode")?, Some(cstring("mode", format!("{mode:o}"))?))];
            if let Some(size) = size {
                options.push((cstring("tmpfs option", "size")?, Some(cstring("size", size.to_string())?)));
            }
            if *owned_by_user {
                // Interpreted in the sandbox's user namespace, where these ids are mapped.
                options.push((cstring("tmpfs option", "uid")?, Some(cstring("uid", user.uid.to_string())?)));
                options.push((cstring("tmpfs option", "gid")?, Some(cstring("gid", user.gid.to_string())?)));
            }
            steps.push(Step {
                what: format!("mount tmpfs on {dst_text}"),
                action: Action::Fs {
                    fstype: cstring("fstype", "tmpfs")?,
                    options,
                    attrs: MOUNT_NOSUID | MOUNT_NODEV,
                    dst,
                },
            });
        }
        MountOp::Proc { .. } => {
            steps.push(Step {
                what: format!("mount proc on {dst_text}"),
                action: Action::Fs {
                    fstype: cstring("fstype", "proc")?,
                    options: Vec::new(),
                    attrs: MOUNT_NOSUID | MOUNT_NODEV | MOUNT_NOEXEC,
                    dst,
                },
            });
            for entry in PROC_READ_ONLY {
                let path = child_rel(&dst_text, entry);
                steps.push(Step {
                    what: format!("cover {dst_text}/{entry} read-only"),
                    action: Action::Bind {
                        from: Tree::New,
                        src: cstring("proc path", path.as_str())?,
                        dst: cstring("proc path", path.as_str())?,
                        kind: Kind::File,
                        attrs: MOUNT_RDONLY | MOUNT_NOSUID | MOUNT_NODEV | MOUNT_NOEXEC,
                        optional: true,
                    },
                });
            }
        }
        MountOp::Dev { .. } => expand_dev(&dst_text, steps)?,
        MountOp::File { contents, mode, .. } => {
            let name = format!("file-{}", steps.len());
            steps.push(Step {
                what: format!("write the contents of {dst_text}"),
                action: Action::WriteStaging {
                    name: cstring("file name", name.as_str())?,
                    contents: contents.clone(),
                    mode: *mode,
                },
            });
            steps.push(Step {
                what: format!("bind the generated {dst_text}"),
                action: Action::Bind {
                    from: Tree::Staging,
                    src: cstring("file name", name)?,
                    dst,
                    kind: Kind::File,
                    attrs: MOUNT_RDONLY | MOUNT_NOSUID | MOUNT_NODEV,
                    optional: false,
                },
            });
        }
        MountOp::Symlink { target, .. } => steps.push(Step {
            what: format!("symlink {dst_text} -> {target}"),
            action: Action::Symlink { target: cstring("symlink target", target.as_str())?, dst },
        }),
        MountOp::Dir { mode, .. } => steps.push(Step {
            what: format!("create directory {dst_text}"),
            action: Action::Dir { dst, mode: *mode },
        }),
    }
    Ok(())
}

/// Names of the masking file and directory on the staging tmpfs.
const MASK_FILE: &str = "mask-file";
const MASK_DIR: &str = "mask-dir";

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
    fn decide(spec: &SandboxSpec, host_uid: u32, host_gid: u32) -> SecretHiding {
        let system: Vec<(&std::path::PathBuf, &String)> = spec
            .mounts
            .iter()
            .filter_map(|op| match op {
                MountOp::SystemBind { src, dst } => Some((src, dst)),
                _ => None,
            })
            .collect();
        if system.is_empty() || !idmap::sandbox_is_host_root(host_uid, host_gid) {
            return SecretHiding::NotNeeded;
        }
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
            if std::env::var_os(crate::idmap::TEST_NO_IDMAP_ENV).is_some() {
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

    fn push_masks(&self, steps: &mut Vec<Step>) -> Result<(), SpecError> {
        let SecretHiding::Masks(masks) = self else { return Ok(()) };
        if masks.is_empty() {
            return Ok(());
        }
        steps.push(Step {
            what: "create the empty file that masks host secrets".into(),
            action: Action::WriteStaging { name: cstring("name", MASK_FILE)?, contents: Vec::new(), mode: 0 },
        });
        steps.push(Step {
            what: "create the empty directory that masks host secrets".into(),
            action: Action::StagingDir { name: cstring("name", MASK_DIR)?, mode: 0 },
        });
        for (path, dir) in masks {
            let (dst_text, dst) = guest_rel("masked path", path)?;
            steps.push(Step {
                what: format!("mask {dst_text}"),
                action: Action::Bind {
                    from: Tree::Staging,
                    src: cstring("name", if *dir { MASK_DIR } else { MASK_FILE })?,
                    dst,
                    kind: if *dir { Kind::Dir } else { Kind::File },
                    attrs: MOUNT_RDONLY | MOUNT_NOSUID | MOUNT_NODEV | MOUNT_NOEXEC,
                    optional: false,
                },
            });
        }
        Ok(())
    }
}

/// The guest paths Landlock grants more than read/execute, from the mounts.
fn landlock_paths(spec: &SandboxSpec) -> Result<Vec<(String, Grant)>, SpecError> {
    let norm = |p: &str| {
        guest_path::normalize(p).map_err(|why| SpecError::new(format!("mount destination {p:?} {why}")))
    };
    let mut paths = Vec::new();
    for op in &spec.mounts {
        match op {
            MountOp::Bind { dst, access: Access::Rw, .. } | MountOp::Tmpfs { dst, .. } => {
                paths.push((norm(dst)?, Grant::Write))
            }
            MountOp::Dev { dst } => {
                let dst = norm(dst)?;
                paths.push((format!("{}/shm", dst.trim_end_matches('/')), Grant::Write));
                paths.push((dst, Grant::Dev));
            }
            MountOp::Proc { dst } => paths.push((norm(dst)?, Grant::Proc)),
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

/// A host bind source, checked and canonicalized before clone.
pub(crate) struct HostBind {
    pub what: String,
    /// Canonical path relative to the host root ("." for `/`).
    pub src: CString,
    pub kind: Kind,
    pub attrs: u64,
}

impl HostBind {
    fn prepare(src: &Path, access: Access, dst_text: &str) -> Result<HostBind, SpecError> {
        let bad = |e: std::io::Error| {
            SpecError::new(format!("bind source {}: {}", src.display(), io_error_text(&e)))
        };
        let canonical = std::fs::canonicalize(src).map_err(bad)?;
        let meta = std::fs::metadata(&canonical).map_err(bad)?;
        let ro = access == Access::Ro;
        let mut attrs = MOUNT_NOSUID | MOUNT_NODEV;
        if ro {
            attrs |= MOUNT_RDONLY;
        }
        let rel = canonical
            .to_str()
            .ok_or_else(|| SpecError::new(format!("bind source {}: path is not UTF-8", src.display())))?
            .trim_start_matches('/');
        Ok(HostBind {
            what: format!("bind {} -> {dst_text} ({})", src.display(), if ro { "ro" } else { "rw" }),
            src: cstring("bind source", if rel.is_empty() { "." } else { rel })?,
            kind: if meta.is_dir() { Kind::Dir } else { Kind::File },
            attrs,
        })
    }
}

/// A bind cloned during setup and attached when the apply phase asks.
pub(crate) struct Deferred {
    pub host: HostBind,
    pub dst: CString,
}

/// Most deferred binds one sandbox may hold (their clones are kept in a
/// fixed array in the child).
pub(crate) const MAX_DEFERRED: usize = 64;

/// `dst/entry` relative to the new root.
fn child_rel(dst_text: &str, entry: &str) -> String {
    format!("{}/{entry}", dst_text.trim_start_matches('/')).trim_start_matches('/').to_string()
}

/// The minimal `/dev`, as bubblewrap's `--dev` builds it.
fn expand_dev(dst_text: &str, steps: &mut Vec<Step>) -> Result<(), SpecError> {
    let at = |entry: &str| cstring("dev path", child_rel(dst_text, entry));
    let tmpfs = |dst: CString, mode: &str, attrs: u64| -> Result<Action, SpecError> {
        Ok(Action::Fs {
            fstype: cstring("fstype", "tmpfs")?,
            options: vec![(cstring("option", "mode")?, Some(cstring("mode", mode)?))],
            attrs,
            dst,
        })
    };
    steps.push(Step {
        what: format!("mount tmpfs on {dst_text}"),
        action: tmpfs(at("")?, "755", MOUNT_NOSUID | MOUNT_NOEXEC)?,
    });
    for dev in DEVICES {
        let host = format!("/dev/{dev}");
        let is_char_device = std::fs::metadata(&host).is_ok_and(|m| m.file_type().is_char_device());
        if !is_char_device {
            continue;
        }
        steps.push(Step {
            what: format!("bind {host} -> {dst_text}/{dev}"),
            action: Action::Bind {
                from: Tree::Host,
                src: cstring("device", format!("dev/{dev}"))?,
                dst: at(dev)?,
                kind: Kind::File,
                attrs: MOUNT_NOSUID | MOUNT_NOEXEC,
                optional: false,
            },
        });
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("core", "/proc/kcore"),
        ("ptmx", "pts/ptmx"),
    ] {
        steps.push(Step {
            what: format!("symlink {dst_text}/{name} -> {target}"),
            action: Action::Symlink { target: cstring("symlink", target)?, dst: at(name)? },
        });
    }
    steps.push(Step {
        what: format!("mount devpts on {dst_text}/pts"),
        action: Action::Fs {
            fstype: cstring("fstype", "devpts")?,
            options: vec![
                (cstring("option", "newinstance")?, None),
                (cstring("option", "ptmxmode")?, Some(cstring("mode", "0666")?)),
                (cstring("option", "mode")?, Some(cstring("mode", "620")?)),
            ],
            attrs: MOUNT_NOSUID | MOUNT_NOEXEC,
            dst: at("pts")?,
        },
    });
    steps.push(Step {
        what: format!("mount tmpfs on {dst_text}/shm"),
        action: tmpfs(at("shm")?, "1777", MOUNT_NOSUID | MOUNT_NODEV)?,
    });
    steps.push(Step {
        what: format!("make {dst_text} read-only"),
        action: Action::Remount { dst: at("")?, attrs: MOUNT_RDONLY },
    });
    Ok(())
}

impl ExecPlan {
    fn prepare(spec: &SandboxSpec) -> Result<ExecPlan, SpecError> {
        let program = spec.argv.first().ok_or_else(|| SpecError::new("no command given"))?.clone();
        if program.is_empty() {
            return Err(SpecError::new("the command name is empty"));
        }
        let argv: Vec<CString> =
            spec.argv.iter().map(|a| cstring("command argument", a.as_str())).collect::<Result<_, _>>()?;
        let mut envp = Vec::with_capacity(spec.env.len());
        for (k, v) in &spec.env {
            if k.is_empty() || k.contains('=') {
                return Err(SpecError::new(format!("environment variable name {k:?} is invalid")));
            }
            envp.push(cstring(&format!("environment variable {k}"), format!("{k}={v}"))?);
        }
        let search_path = spec
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map_or(DEFAULT_PATH, |(_, v)| v.as_str())
            .to_string();
        let candidates = if program.contains('/') {
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
        let mut envp_ptrs: Vec<*const c_char> = envp.iter().map(|e| e.as_ptr()).collect();
        envp_ptrs.push(std::ptr::null());
        Ok(ExecPlan { program, candidates, search_path, _argv: argv, _envp: envp, argv_ptrs, envp_ptrs })
    }
}
