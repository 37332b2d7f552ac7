//! A checked [`Request`] → the runtime's own description of a sandbox: a
//! [`SandboxSpec`] whose mounts are the request's operations in order, and
//! the nested parts of its [`Plan`]. Sources are resolved here, in the
//! outer sandbox's view (the worker has entered its mount namespace), so a
//! path that the outer sandbox does not show does not exist for a nested one.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use libc::c_ulong;

use super::PORTAL_DIR;
use super::request::{BindMode, Op, Request, RequestError, dest};
use crate::guest_path;
use crate::prepare::{NestedChild, NestedParts, Plan};
use crate::spec::{Access, MountOp, Network, SandboxSpec};

/// Builds the nested sandbox's plan. `fds` came with the request; they are
/// renumbered above every number the command will see them at, where the
/// nested sandbox's PID 1 keeps them (the caller closes its copies once
/// that process exists, see [`crate::launch`]).
pub(crate) fn prepare(
    req: &Request,
    fds: Vec<OwnedFd>,
    floor: RawFd,
    outer_spec: &SandboxSpec,
    outer: &Plan,
) -> Result<Plan, RequestError> {
    req.check(fds.len())?;
    let invalid = |e: crate::SpecError| RequestError::Invalid(e.to_string());
    let portal_dev =
        std::fs::metadata(PORTAL_DIR).map(|m| std::os::unix::fs::MetadataExt::dev(&m)).unwrap_or(0);

    // `--proc` as the outer sandbox's /proc was asked for: where the kernel
    // refused the outer one a fresh procfs (inside a container) it refuses
    // the nested one too, and `auto` then binds the outer /proc read-only,
    // which shows no more than the outer sandbox already sees.
    let proc_mode = outer_spec
        .mounts
        .iter()
        .find_map(|op| match op {
            MountOp::Proc { mode, .. } => Some(*mode),
            _ => None,
        })
        .unwrap_or_default();

    // No nested tmpfs may be larger than the outer sandbox's own (each is
    // memory the outer limits may not count, docs/security.md).
    let tmpfs_cap = outer_spec.security.limits.tmpfs_size.unwrap_or(crate::limits::DEFAULT_TMPFS_SIZE);

    let mut mounts = Vec::with_capacity(req.ops.len());
    let mut detach = Vec::new();
    for op in &req.ops {
        let dst = dest(op.dst())?;
        let mount = match op {
            Op::Bind { src, mode, optional, .. } => {
                let Some(real) = source(&req.cwd, src, *optional)? else { continue };
                // A bind of the portal's parent (`/`, `/run`) carries the
                // portal along; it is detached again right after.
                if let Some(rest) =
                    Path::new(PORTAL_DIR).strip_prefix(&real).ok().filter(|r| !r.as_os_str().is_empty())
                {
                    detach.push((mounts.len(), join(&dst, rest)));
                }
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
                size: size.map(|s| s.min(tmpfs_cap)),
            },
            Op::Dir { mode, .. } => MountOp::Dir { dst, mode: *mode },
            Op::Symlink { target, .. } => MountOp::Symlink { target: target.clone(), dst },
            Op::Proc { .. } => MountOp::Proc { dst, mode: proc_mode },
            Op::Dev { .. } => MountOp::Dev { dst },
        };
        mounts.push(mount);
    }

    // The working directory: --chdir, else the caller's own when the new
    // root has it, else $HOME, else /.
    let home = req.env.iter().rev().find(|(k, _)| k == "HOME").map(|(_, v)| v.clone());
    let cwd: Vec<String> = match &req.chdir {
        Some(dir) => vec![absolute(&req.cwd, dir)],
        None => [Some(req.cwd.clone()), home.filter(|h| h.starts_with('/')), Some("/".into())]
            .into_iter()
            .flatten()
            .collect(),
    };
    let mut env = req.env.clone();
    crate::builder::set_var(&mut env, "PWD".into(), cwd[0].clone());
    let mut argv = req.command.clone();
    if let Some(argv0) = &req.argv0 {
        argv[0] = argv0.clone();
    }

    let mut flags = (libc::CLONE_NEWNS | libc::CLONE_NEWPID) as c_ulong;
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
    // Inside the outer sandbox's user namespace we are its user.
    let (outer_uid, outer_gid) = (outer_spec.user.uid, outer_spec.user.gid);
    let inner = (req.uid.unwrap_or(outer_uid), req.gid.unwrap_or(outer_gid));
    let userns = req.unshare.user.then(|| {
        let line =
            |inner: u32, outer: u32| std::ffi::CString::new(format!("{inner} {outer} 1\n")).expect("digits");
        (line(inner.0, outer_uid), line(inner.1, outer_gid))
    });
    let (targets, fd_base) =
        renumber(&req.fds, fds, floor).map_err(|e| RequestError::Invalid(format!("descriptors: {e}")))?;

    let spec = SandboxSpec {
        argv,
        env,
        cwd: cwd[0].clone(),
        user: outer_spec.user.clone(),
        host_ids: None,
        network: if req.unshare.net { Network::Off } else { Network::On },
        hostname: req.hostname.clone().unwrap_or_default(),
        mounts,
        new_session: true,
        deferred_binds: Vec::new(),
        security: outer_spec.security.clone(),
        nested: false,
    };
    let parts = NestedParts {
        clone_flags: flags,
        program: req.command[0].clone(),
        hostname: req.hostname.clone(),
        cwd,
        detach,
        portal_dev,
        child: NestedChild {
            userns,
            inner_ids: if req.unshare.user { inner } else { (outer_uid, outer_gid) },
            keep_caps: req.caps.unwrap_or(0),
            fds: targets,
            fd_base,
        },
    };
    Plan::prepare_nested(&spec, outer, parts).map_err(invalid)
}

/// A bind source in the outer view, canonical; `None` for a missing
/// optional one. The portal itself is never a source.
fn source(cwd: &str, src: &str, optional: bool) -> Result<Option<PathBuf>, RequestError> {
    let path = absolute(cwd, src);
    let real = match std::fs::canonicalize(&path) {
        Ok(real) => real,
        Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            let reason = crate::error::strerror(e.raw_os_error().unwrap_or(libc::EIO));
            return Err(RequestError::Source { src: src.to_string(), reason });
        }
    };
    if real.starts_with(PORTAL_DIR) {
        let reason = crate::error::strerror(libc::EACCES);
        return Err(RequestError::Source { src: src.to_string(), reason });
    }
    Ok(Some(real))
}

/// `path` made absolute against `cwd` (no normalization: the kernel does it).
fn absolute(cwd: &str, path: &str) -> String {
    if path.starts_with('/') { path.to_string() } else { format!("{}/{path}", cwd.trim_end_matches('/')) }
}

/// Guest path `dst` (normalized) joined with a relative path.
fn join(dst: &str, rest: &Path) -> String {
    let rest = rest.to_string_lossy();
    match guest_path::normalize(dst).as_deref() {
        Ok("/") | Err(_) => format!("/{rest}"),
        Ok(dst) => format!("{dst}/{rest}"),
    }
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
        let want = base + i as RawFd;
        let moved = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(want))?;
        if moved != want {
            // SAFETY: `moved` was just created by fcntl and is ours alone.
            drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(moved) });
            return Err(nix::errno::Errno::EBADF);
        }
        pairs.push((target, moved));
        // `fd`, the received number, closes here.
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
            // SAFETY: the moved copies are ours to close.
            assert_eq!(unsafe { libc::close(source) }, 0);
        }
    }

    #[test]
    fn portal_paths_join_destinations() {
        assert_eq!(join("/", Path::new("run/tuixiu")), "/run/tuixiu");
        assert_eq!(join("/new/", Path::new("tuixiu")), "/new/tuixiu");
        assert_eq!(absolute("/ws", "a/b"), "/ws/a/b");
        assert_eq!(absolute("/", "a"), "/a");
        assert_eq!(absolute("/ws", "/x"), "/x");
    }
}
