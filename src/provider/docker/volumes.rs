//! The host directories behind an instance container's volumes, and
//! writing into them as the container's user.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::provider::{InstanceConfig, ProviderError};

/// Guest path of the SCRATCH root of a manifest.
pub const SCRATCH: &str = "/scratch";

/// The host directories behind an instance's volumes (see
/// [`super::DockerProvider::prepare_volumes`]), with handles opened as the caller.
#[derive(Debug)]
pub struct Volumes {
    pub workspace: PathBuf,
    pub home: PathBuf,
    pub scratch: Option<PathBuf>,
    /// `O_PATH` handles of workspace, home and scratch.
    handles: Vec<OwnedFd>,
}

impl Volumes {
    pub(super) fn open(
        workspace: PathBuf,
        home: PathBuf,
        scratch: Option<PathBuf>,
    ) -> Result<Volumes, ProviderError> {
        let mut handles = Vec::new();
        for dir in std::iter::once(&workspace).chain([&home]).chain(scratch.as_ref()) {
            let fd = nix::fcntl::open(
                dir,
                nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|e| ProviderError::File {
                op: "open",
                path: dir.to_path_buf(),
                source: std::io::Error::from(e),
            })?;
            handles.push(fd);
        }
        Ok(Volumes { workspace, home, scratch, handles })
    }

    /// Paths of the three directories that a writer running under
    /// [`as_container_user`] can use: `/proc/self/fd/N` of handles opened
    /// by the caller, so the user needs no search permission on their
    /// parents (the state directory is private to the caller). Valid in
    /// this process only, while `self` lives.
    pub fn writable(&self) -> (PathBuf, PathBuf, Option<PathBuf>) {
        let path = |i: usize| PathBuf::from(format!("/proc/self/fd/{}", self.handles[i].as_raw_fd()));
        (path(0), path(1), self.scratch.as_ref().map(|_| path(2)))
    }
}

/// Runs `f` with this thread's filesystem ids set to the container user's
/// (when we are root), so files it creates in the volumes belong to the
/// user inside the container, who can then change them. There is no user
/// namespace between the host and the container: the container's uid is
/// the host's.
pub fn as_container_user<T>(config: &InstanceConfig, f: impl FnOnce() -> T) -> T {
    as_user(config.user.uid, config.user.gid, f)
}

/// [`as_container_user`] with the ids given directly.
pub fn as_user<T>(uid: u32, gid: u32, f: impl FnOnce() -> T) -> T {
    let (euid, egid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
    if euid != 0 {
        return f();
    }
    // setfsuid/setfsgid change only this thread's filesystem ids and
    // cannot fail for root; they are restored below, also on unwind.
    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(gid));
    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
    struct Restore(u32, u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(self.0));
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(self.1));
        }
    }
    let _restore = Restore(euid, egid);
    f()
}

/// Gives a home made by us to the container's user, as far as we may.
pub(super) fn give_to_user(home: &Path, user: &sandbox::UserView) -> Result<(), ProviderError> {
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(home, Some(user.uid), Some(user.gid)).map_err(|e| ProviderError::File {
            op: "chown",
            path: home.to_path_buf(),
            source: e,
        })?;
    }
    Ok(())
}
