//! Turns a [`SandboxSpec`] into a [`Plan`]: every C string, byte buffer and
//! pointer array the sandbox child will need, computed in the launcher
//! before `clone`. After `clone` the child only walks this plan and issues
//! syscalls; it allocates nothing.
//!
//! Host paths are checked here (canonicalized, their type recorded), so a
//! missing bind source is a clear error before any namespace exists.

use std::ffi::CString;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use libc::{c_char, c_ulong};

use crate::error::{SpecError, io_error_text};
use crate::guest_path;
use crate::spec::{Access, MountOp, Network, SandboxSpec, UserView};

const MOUNT_NOSUID: u64 = libc::MOUNT_ATTR_NOSUID;
const MOUNT_NODEV: u64 = libc::MOUNT_ATTR_NODEV;
const MOUNT_NOEXEC: u64 = libc::MOUNT_ATTR_NOEXEC;
const MOUNT_RDONLY: u64 = libc::MOUNT_ATTR_RDONLY;

/// Device nodes bound from the host into the minimal `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// `/proc` entries covered read-only, as bubblewrap does.
const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus"];
/// `PATH` used for the command lookup when the environment has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// Directory in the new root holding generated files until they are bound
/// into place; removed before `/` is made read-only.
const STAGING_DIR: &str = ".tuixiu-staging";
/// Most host sources (binds and deferred binds) one sandbox may have; their
/// clones are kept in a fixed array in the child.
pub(crate) const MAX_HOST_SOURCES: usize = 128;
/// Most deferred binds one sandbox may hold.
pub(crate) const MAX_DEFERRED: usize = 64;

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
    /// Mount a fresh filesystem at `dst` (created as a directory).
    Fs {
        fstype: CString,
        options: Vec<(CString, Option<CString>)>,
        attrs: u64,
        dst: CString,
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

/// A host bind source, checked and canonicalized before clone.
pub(crate) struct HostSource {
    pub what: String,
    /// Canonical path relative to the host root ("." for `/`).
    pub src: CString,
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
    pub host_sources: Vec<HostSource>,
    pub steps: Vec<Step>,
    pub hostname: CString,
    pub network_off: bool,
    pub cwd: CString,
    pub new_session: bool,
    pub exec: ExecPlan,
    pub deferred: Vec<Deferred>,
    /// Pause after setup for the launcher's apply phase.
    pub apply_phase: bool,
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

        let mut plan =
            Expansion { user: &spec.user, steps: Vec::new(), host_sources: Vec::new(), staged: Vec::new() };
        for op in &spec.mounts {
            plan.expand(op)?;
        }
        if spec.deferred_binds.len() > MAX_DEFERRED {
            return Err(SpecError::new(format!("at most {MAX_DEFERRED} deferred binds are supported")));
        }
        let mut deferred = Vec::with_capacity(spec.deferred_binds.len());
        for bind in &spec.deferred_binds {
            let (dst_text, dst) = guest_rel("bind destination", &bind.dst)?;
            let source = plan.host_source(&bind.src, bind.access, &dst_text)?;
            deferred.push(Deferred { source, dst });
        }
        if plan.host_sources.len() > MAX_HOST_SOURCES {
            return Err(SpecError::new(format!("at most {MAX_HOST_SOURCES} host binds are supported")));
        }
        if !plan.staged.is_empty() {
            plan.steps.push(Step {
                what: "remove the staging directory".into(),
                action: Action::RemoveStaging {
                    files: std::mem::take(&mut plan.staged),
                    dir: cstring("staging dir", STAGING_DIR)?,
                },
            });
        }
        plan.steps.push(Step {
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

        Ok(Plan {
            clone_flags: clone_flags as c_ulong,
            uid: spec.user.uid,
            gid: spec.user.gid,
            host_uid,
            host_gid,
            host_sources: plan.host_sources,
            steps: plan.steps,
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

/// The spec's mount operations being turned into primitive steps.
struct Expansion<'a> {
    user: &'a UserView,
    steps: Vec<Step>,
    host_sources: Vec<HostSource>,
    /// Generated files to unlink from the staging directory at the end.
    staged: Vec<CString>,
}

impl Expansion<'_> {
    fn push(&mut self, what: String, action: Action) {
        self.steps.push(Step { what, action });
    }

    /// Checks and canonicalizes a host bind source; returns its index.
    fn host_source(&mut self, src: &Path, access: Access, dst_text: &str) -> Result<usize, SpecError> {
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
        self.host_sources.push(HostSource {
            what: format!("bind {} -> {dst_text} ({})", src.display(), if ro { "ro" } else { "rw" }),
            src: cstring("bind source", if rel.is_empty() { "." } else { rel })?,
            kind: if meta.is_dir() { Kind::Dir } else { Kind::File },
            attrs,
        });
        Ok(self.host_sources.len() - 1)
    }

    fn expand(&mut self, op: &MountOp) -> Result<(), SpecError> {
        let (dst_text, dst) = guest_rel("mount destination", op.dst())?;
        match op {
            MountOp::Bind { src, access, .. } => {
                let index = self.host_source(src, *access, &dst_text)?;
                let source = &self.host_sources[index];
                let (what, kind) = (source.what.clone(), source.kind);
                self.push(what, Action::Bind { source: Source::Host(index), dst, kind });
            }
            MountOp::Tmpfs { mode, owned_by_user, size, .. } => {
                let mut options = vec![option("mode", &format!("{mode:o}"))?];
                if let Some(size) = size {
                    options.push(option("size", &size.to_string())?);
                }
                if *owned_by_user {
                    // Interpreted in the sandbox's user namespace, where these ids are mapped.
                    options.push(option("uid", &self.user.uid.to_string())?);
                    options.push(option("gid", &self.user.gid.to_string())?);
                }
                self.push(
                    format!("mount tmpfs on {dst_text}"),
                    Action::Fs {
                        fstype: cstring("fstype", "tmpfs")?,
                        options,
                        attrs: MOUNT_NOSUID | MOUNT_NODEV,
                        dst,
                    },
                );
            }
            MountOp::Proc { .. } => {
                self.push(
                    format!("mount proc on {dst_text}"),
                    Action::Fs {
                        fstype: cstring("fstype", "proc")?,
                        options: Vec::new(),
                        attrs: MOUNT_NOSUID | MOUNT_NODEV | MOUNT_NOEXEC,
                        dst,
                    },
                );
                for entry in PROC_READ_ONLY {
                    // The sandbox's procfs has an entry exactly when the host's does.
                    if !Path::new("/proc").join(entry).exists() {
                        continue;
                    }
                    let path = cstring("proc path", child_rel(&dst_text, entry))?;
                    self.push(
                        format!("cover {dst_text}/{entry} read-only"),
                        Action::Bind {
                            source: Source::New {
                                path: path.clone(),
                                attrs: MOUNT_RDONLY | MOUNT_NOSUID | MOUNT_NODEV | MOUNT_NOEXEC,
                                optional: true,
                            },
                            dst: path,
                            kind: Kind::File,
                        },
                    );
                }
            }
            MountOp::Dev { .. } => self.expand_dev(&dst_text)?,
            MountOp::File { contents, mode, .. } => {
                if self.staged.is_empty() {
                    self.push(
                        "create the staging directory".into(),
                        Action::Dir { dst: cstring("staging dir", STAGING_DIR)?, mode: 0o700 },
                    );
                }
                let path = cstring("file name", format!("{STAGING_DIR}/file-{}", self.steps.len()))?;
                self.staged.push(path.clone());
                self.push(
                    format!("write the contents of {dst_text}"),
                    Action::WriteFile { path: path.clone(), contents: contents.clone(), mode: *mode },
                );
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
            }
            MountOp::Symlink { target, .. } => self.push(
                format!("symlink {dst_text} -> {target}"),
                Action::Symlink { target: cstring("symlink target", target.as_str())?, dst },
            ),
            MountOp::Dir { mode, .. } => {
                self.push(format!("create directory {dst_text}"), Action::Dir { dst, mode: *mode })
            }
        }
        Ok(())
    }

    /// The minimal `/dev`, as bubblewrap's `--dev` builds it.
    fn expand_dev(&mut self, dst_text: &str) -> Result<(), SpecError> {
        let at = |entry: &str| cstring("dev path", child_rel(dst_text, entry));
        let tmpfs = |dst: CString, mode: &str, attrs: u64| -> Result<Action, SpecError> {
            Ok(Action::Fs {
                fstype: cstring("fstype", "tmpfs")?,
                options: vec![option("mode", mode)?],
                attrs,
                dst,
            })
        };
        self.push(format!("mount tmpfs on {dst_text}"), tmpfs(at("")?, "755", MOUNT_NOSUID | MOUNT_NOEXEC)?);
        for dev in DEVICES {
            let host = format!("/dev/{dev}");
            let is_char_device = std::fs::metadata(&host).is_ok_and(|m| m.file_type().is_char_device());
            if !is_char_device {
                continue;
            }
            self.host_sources.push(HostSource {
                what: format!("bind {host} -> {dst_text}/{dev}"),
                src: cstring("device", format!("dev/{dev}"))?,
                kind: Kind::File,
                // Device nodes: no nodev, of course.
                attrs: MOUNT_NOSUID | MOUNT_NOEXEC,
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
            },
        );
        self.push(
            format!("mount tmpfs on {dst_text}/shm"),
            tmpfs(at("shm")?, "1777", MOUNT_NOSUID | MOUNT_NODEV)?,
        );
        self.push(
            format!("make {dst_text} read-only"),
            Action::Remount { dst: at("")?, attrs: MOUNT_RDONLY },
        );
        Ok(())
    }
}

/// A `key=value` filesystem option.
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

#[cfg(test)]
mod tests {
    use super::child_rel;

    #[test]
    fn child_rel_joins_without_stray_slashes() {
        assert_eq!(child_rel("/dev", ""), "dev");
        assert_eq!(child_rel("/dev", "pts"), "dev/pts");
        assert_eq!(child_rel("/", "pts"), "pts");
    }
}
