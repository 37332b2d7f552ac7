//! The one `openat2` of the host side: a path opened relative to a
//! directory descriptor the caller trusts, never by a host path.
//!
//! | scope | what leaves the directory does | used by |
//! |---|---|---|
//! | [`Scope::InRoot`] | resolved as if the directory were `/` (`RESOLVE_IN_ROOT`): `..` and absolute symlinks stay inside | inputs landing (`root.rs`), guest paths (`guest.rs`) |
//! | [`Scope::Beneath`] | fails in the kernel with `EXDEV` (`RESOLVE_BENEATH`) | skill packages and artifacts (`beneath.rs`), host-path inputs (`inputs/hostpath.rs`) |
//!
//! Magic links (`/proc/<pid>/fd/N` and the like) are never followed;
//! with [`Links::Never`] no symlink is, not even one that stays inside
//! (`ELOOP`). Every descriptor is close-on-exec.

use std::ffi::{CString, OsStr};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};

/// Where a path may lead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The directory is the path's `/`.
    InRoot,
    /// Beneath the directory, or an error.
    Beneath,
}

/// Whether symlinks are followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// Followed, within the [`Scope`].
    Follow,
    /// Never followed (`ELOOP`).
    Never,
}

/// Opens `rel` under `dir` with `flags` (`O_CLOEXEC` added). An empty
/// `rel` is the directory itself; a NUL in it is `EINVAL`.
pub fn open(
    dir: BorrowedFd<'_>,
    rel: impl AsRef<OsStr>,
    flags: OFlag,
    scope: Scope,
    links: Links,
) -> Result<OwnedFd, Errno> {
    let rel = rel.as_ref();
    let path = CString::new(if rel.is_empty() { b".".as_slice() } else { rel.as_bytes() })
        .map_err(|_| Errno::EINVAL)?;
    let mut resolve = ResolveFlag::RESOLVE_NO_MAGICLINKS
        | match scope {
            Scope::InRoot => ResolveFlag::RESOLVE_IN_ROOT,
            Scope::Beneath => ResolveFlag::RESOLVE_BENEATH,
        };
    if links == Links::Never {
        resolve |= ResolveFlag::RESOLVE_NO_SYMLINKS;
    }
    openat2(dir, path.as_c_str(), OpenHow::new().flags(flags | OFlag::O_CLOEXEC).resolve(resolve))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn scopes_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(dir.path().join("outside"), "outside").unwrap();
        std::fs::write(root.join("inside"), "inside").unwrap();
        std::os::unix::fs::symlink("/inside", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../outside", root.join("up")).unwrap();
        std::os::unix::fs::symlink("inside", root.join("rel")).unwrap();
        let fd = nix::fcntl::open(&root, OFlag::O_PATH | OFlag::O_DIRECTORY, nix::sys::stat::Mode::empty())
            .unwrap();
        let read = |rel: &str, scope, links| {
            open(fd.as_fd(), rel, OFlag::O_RDONLY, scope, links).map(|f| {
                std::fs::read_to_string(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f)))
                    .unwrap()
            })
        };
        // In the root: the absolute link and `..` stay inside.
        assert_eq!(read("abs", Scope::InRoot, Links::Follow).unwrap(), "inside");
        assert_eq!(read("sub/../../inside", Scope::InRoot, Links::Follow).unwrap(), "inside");
        assert_eq!(read("up", Scope::InRoot, Links::Follow), Err(Errno::ENOENT));
        // Beneath: leaving is an error.
        assert_eq!(read("up", Scope::Beneath, Links::Follow), Err(Errno::EXDEV));
        assert_eq!(read("abs", Scope::Beneath, Links::Follow), Err(Errno::EXDEV));
        assert_eq!(read("rel", Scope::Beneath, Links::Follow).unwrap(), "inside");
        // No symlink at all.
        assert_eq!(read("rel", Scope::Beneath, Links::Never), Err(Errno::ELOOP));
        assert_eq!(read("rel", Scope::InRoot, Links::Never), Err(Errno::ELOOP));
        // The directory itself, and a NUL.
        assert!(open(fd.as_fd(), "", OFlag::O_PATH, Scope::InRoot, Links::Never).is_ok());
        assert_eq!(
            open(fd.as_fd(), "a\0b", OFlag::O_PATH, Scope::InRoot, Links::Never).unwrap_err(),
            Errno::EINVAL
        );
    }
}
