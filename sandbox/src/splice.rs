//! Mount targets inside the read-only system view.
//!
//! A mount needs a target: a file or directory at its destination. The
//! sandbox's root is a fresh tmpfs, so a target there is simply created. A
//! destination inside a system bind (`/etc/passwd` inside the host's
//! `/etc`) is different: the bind is read-only from the moment it is
//! attached (and creating the target would write to the host), so the
//! target must already exist on the host. On a minimal image (busybox
//! without `/etc/passwd`) it does not, and creating it fails with EROFS.
//!
//! For such a destination the launcher plans a splice of the deepest
//! directory that does exist on the host: a tmpfs is mounted aside, every
//! entry of the host directory is bound into it from the system view (a
//! recursive copy of what the sandbox would have seen there, so idmapping,
//! masks and submounts come along; symlinks are recreated), and the tmpfs
//! is moved over the directory. The target is then created on the tmpfs,
//! which is made read-only with the root. The command sees the same
//! entries as before, read-only, plus the target; nothing is written to the
//! host. Hosts that have the target (any distribution's `/etc/passwd`) take
//! none of this.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{SpecError, io_error_text};
use crate::guest_path;
use crate::spec::MountOp;

/// One step of a splice, for prepare.rs to turn into an action. Paths are
/// relative to the new root.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// A tmpfs with this mode at `dst`.
    Tmpfs {
        dst: Vec<u8>,
        mode: u32,
    },
    /// A read-only recursive copy of `src` attached at `dst` (created as a
    /// directory or a file); skipped when `src` has gone.
    Keep {
        src: Vec<u8>,
        dst: Vec<u8>,
        dir: bool,
    },
    Symlink {
        target: Vec<u8>,
        dst: Vec<u8>,
    },
    /// The mount at `from` (with its submounts) moved onto `dst`.
    Move {
        from: Vec<u8>,
        dst: Vec<u8>,
    },
    /// The empty directory `dir` removed.
    RemoveDir {
        dir: Vec<u8>,
    },
    /// The mount at `dst` made read-only.
    ReadOnly {
        dst: Vec<u8>,
    },
}

/// A step with the words used when it fails.
#[derive(Debug)]
pub(crate) struct Step {
    pub what: String,
    pub op: Op,
}

/// What the planned steps have mounted so far, to tell where a destination
/// lies and whether it can be created there.
#[derive(Default)]
pub(crate) struct Splicer {
    /// Mounts not covered by a later one: (normalized guest path, what).
    mounts: Vec<(String, Cover)>,
    /// Spliced directories (normalized guest paths), in order.
    spliced: Vec<String>,
}

#[derive(Debug, PartialEq, Eq)]
enum Cover {
    /// A read-only system bind of this host directory.
    System(PathBuf),
    /// A spliced directory: a tmpfs with this host directory's entries bound in.
    Spliced(PathBuf),
    /// Anything else (binds, tmpfs, /proc, /dev): not ours to change.
    Other,
}

impl Splicer {
    /// Records that `op` has been planned.
    pub(crate) fn planned(&mut self, op: &MountOp) {
        let cover = match op {
            MountOp::SystemBind { src, .. } => Cover::System(src.clone()),
            MountOp::Symlink { .. } | MountOp::Dir { .. } | MountOp::Chmod { .. } => return,
            _ => Cover::Other,
        };
        if let Ok(dst) = guest_path::normalize(op.dst()) {
            self.mounted(dst, cover);
        }
    }

    fn mounted(&mut self, dst: String, cover: Cover) {
        self.mounts.retain(|(path, _)| !guest_path::is_within(path, &dst));
        self.mounts.push((dst, cover));
    }

    /// The steps that make `dst` creatable, when it lies missing inside a
    /// read-only system bind; none otherwise (including when it exists, or
    /// a symlink is on the way: the usual resolution then decides).
    pub(crate) fn steps_for(&mut self, dst: &str) -> Result<Vec<Step>, SpecError> {
        let Ok(dst) = guest_path::normalize(dst) else { return Ok(Vec::new()) };
        let Some((dir, host)) = self.missing_in(&dst) else { return Ok(Vec::new()) };
        let steps = splice(&dir, &host, self.spliced.len(), &dst)?;
        self.mounted(dir.clone(), Cover::Spliced(host));
        self.spliced.push(dir);
        Ok(steps)
    }

    /// The read-only directory (guest, host) in which `dst` would have to
    /// be created, if any.
    fn missing_in(&self, dst: &str) -> Option<(String, PathBuf)> {
        let (base, cover) = self
            .mounts
            .iter()
            .filter(|(path, _)| guest_path::is_within(dst, path))
            .max_by_key(|(path, _)| path.len())?;
        let (mut guest, mut host, mut writable) = match cover {
            Cover::System(src) => (base.clone(), src.clone(), false),
            Cover::Spliced(src) => (base.clone(), src.clone(), true),
            Cover::Other => return None,
        };
        let rest = dst[base.len()..].trim_start_matches('/');
        for name in rest.split('/').filter(|c| !c.is_empty()) {
            let next = host.join(name);
            match std::fs::symlink_metadata(&next) {
                Ok(meta) if meta.is_dir() => {
                    guest = if guest == "/" { format!("/{name}") } else { format!("{guest}/{name}") };
                    host = next;
                    // An entry of a spliced directory is a bind again.
                    writable = false;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return (!writable).then_some((guest, host));
                }
                // It exists (a file, a symlink resolved in the sandbox), or
                // cannot be told: the mount step will say.
                _ => return None,
            }
        }
        None
    }

    /// The last steps: every spliced directory made read-only.
    pub(crate) fn finish(&self) -> Vec<Step> {
        self.spliced
            .iter()
            .map(|dir| Step {
                what: format!("make {dir} read-only"),
                op: Op::ReadOnly { dst: dir.trim_start_matches('/').as_bytes().to_vec() },
            })
            .collect()
    }
}

/// The steps of splicing guest directory `dir` (the host's `host`), number
/// `n`, so that `target` can be created in it.
fn splice(dir: &str, host: &Path, n: usize, target: &str) -> Result<Vec<Step>, SpecError> {
    let bad = |e: std::io::Error| SpecError::new(format!("read {}: {}", host.display(), io_error_text(&e)));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(host).map_err(bad)?.permissions());
    let mut entries: Vec<_> = std::fs::read_dir(host).map_err(bad)?.collect::<Result<_, _>>().map_err(bad)?;
    entries.sort_by_key(|e| e.file_name());
    tracing::info!(
        "{target} is missing in the host's {} and the system view is read-only: {dir} is a tmpfs with \
         the host's {} entries bound in (read-only)",
        host.display(),
        entries.len()
    );

    let rel = dir.trim_start_matches('/').as_bytes();
    let stage = format!(".tuixiu-splice-{n}").into_bytes();
    let join = |base: &[u8], name: &[u8]| [base, b"/", name].concat();
    let mut steps = vec![Step {
        what: format!("splice {dir}: mount tmpfs aside"),
        op: Op::Tmpfs { dst: stage.clone(), mode: mode & 0o7777 },
    }];
    for entry in &entries {
        let name = entry.file_name();
        let kind = entry.file_type().map_err(bad)?;
        let op = if kind.is_symlink() {
            let target = std::fs::read_link(entry.path()).map_err(bad)?;
            Op::Symlink { target: target.as_os_str().as_bytes().to_vec(), dst: join(&stage, name.as_bytes()) }
        } else {
            Op::Keep {
                src: join(rel, name.as_bytes()),
                dst: join(&stage, name.as_bytes()),
                dir: kind.is_dir(),
            }
        };
        steps.push(Step { what: format!("splice {dir}: keep {dir}/{}", name.to_string_lossy()), op });
    }
    steps.push(Step {
        what: format!("splice {dir}: move the tmpfs over it"),
        op: Op::Move { from: stage.clone(), dst: rel.to_vec() },
    });
    steps.push(Step {
        what: format!("splice {dir}: remove the empty directory /{}", String::from_utf8_lossy(&stage)),
        op: Op::RemoveDir { dir: stage },
    });
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system(dst: &str, src: &Path) -> MountOp {
        MountOp::SystemBind { src: src.to_path_buf(), dst: dst.into() }
    }

    #[test]
    fn only_missing_targets_in_read_only_system_binds_are_spliced() {
        let host = std::env::temp_dir().join(format!("sandbox-splice-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&host);
        std::fs::create_dir_all(host.join("etc/ssl")).unwrap();
        std::fs::write(host.join("etc/hosts"), "").unwrap();
        std::os::unix::fs::symlink("/elsewhere", host.join("etc/link")).unwrap();

        let mut s = Splicer::default();
        s.planned(&system("/etc", &host.join("etc")));
        s.planned(&MountOp::Tmpfs { dst: "/tmp".into(), mode: 0o1777, owned_by_user: false, size: None });
        // Existing, outside the system view, behind a symlink: nothing to do.
        for dst in ["/etc/hosts", "/etc/ssl", "/tmp/x", "/home/agent", "/etc/link/x"] {
            assert!(s.steps_for(dst).unwrap().is_empty(), "{dst}");
        }
        // Missing in /etc: /etc is spliced once; a second target in it is
        // then creatable on the tmpfs.
        let steps = s.steps_for("/etc/passwd").unwrap();
        let whats: Vec<&str> = steps.iter().map(|s| s.what.as_str()).collect();
        assert_eq!(whats.len(), 1 + 3 + 2, "{whats:?}");
        assert!(
            whats.contains(&"splice /etc: keep /etc/hosts") && whats.contains(&"splice /etc: keep /etc/link")
        );
        assert!(s.steps_for("/etc/group").unwrap().is_empty());
        // Deeper: /etc/ssl is a bind again, so it is spliced in turn.
        assert_eq!(s.steps_for("/etc/ssl/certs/x").unwrap().len(), 1 + 2);
        assert_eq!(s.finish().len(), 2);
        // A later mount over /etc covers the splices.
        s.planned(&MountOp::Tmpfs { dst: "/etc".into(), mode: 0o755, owned_by_user: false, size: None });
        assert!(s.steps_for("/etc/other").unwrap().is_empty());
        std::fs::remove_dir_all(&host).unwrap();
    }
}
