//! What the daemon landed for a run's agentInputs, so that landing them
//! again never overwrites the agent's work silently (docs/manifest.md,
//! "Landing again").
//!
//! After items land, each target gets a fingerprint, kept in the run's
//! state. An open that carries `init` lands every item, as the backend
//! asked. Any other open (an agent restarted after a crash, after a daemon
//! restart, after keepalive expiry: the persisted `init` is used) decides
//! per item: a target exactly as landed is left as it is (it is there), a
//! missing target that was never landed (or a scratch target: the scratch
//! goes with its instance) lands, and a target that changed or was removed
//! since it landed, or that exists but was never landed by this run, is
//! left alone and reported.
//!
//! A fingerprint covers metadata only, never content (a target may be a
//! FIFO, a huge file or a tree the agent filled): for every entry of the
//! target, symlinks never followed, its relative path, type, mode, size,
//! inode, modification and change times. The change time (`ctime`) cannot
//! be set by a process, so an edit that restores the old modification time
//! is still seen.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, SFlag, fstat};
use sha2::{Digest, Sha256};

use crate::inputs::fsx;
use crate::manifest::{Apply, Item, Root};

/// Why a target could not be fingerprinted (it is then left alone).
#[derive(Debug, thiserror::Error)]
pub enum FingerprintError {
    #[error(transparent)]
    Fs(#[from] fsx::FsError),
    #[error("more than {} entries", MAX_ENTRIES)]
    TooMany,
    #[error("deeper than {} directories", MAX_DEPTH)]
    TooDeep,
    /// `call` failed on the entry at `path` (relative to the target).
    #[error("{call}({path:?}) => {errno}")]
    Entry { call: &'static str, path: String, errno: Errno },
    #[error("open({path:?}/{name:?}) => {errno}")]
    Child { path: String, name: CString, errno: Errno },
}

/// Item id → fingerprint of its target as it was landed.
pub type Landed = BTreeMap<String, String>;

/// Entries a fingerprinted target may have; a larger tree is treated as
/// changed (never overwritten).
const MAX_ENTRIES: usize = 200_000;
/// Directory depth a fingerprint walks.
const MAX_DEPTH: usize = 128;

/// What a re-open does with one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing there (and nothing of the agent's to lose): land it.
    Land,
    /// Exactly as landed: nothing to do.
    AsLanded,
    /// Left alone and reported, with the reason.
    LeftAlone(&'static str),
}

/// Whether the item lands anything (binds are mounts of the instance).
pub fn lands(item: &Item) -> bool {
    item.apply != Apply::BindMount
}

/// The decision for an item on an open that did not carry `init`.
pub fn decide(
    item: &Item,
    recorded: Option<&str>,
    current: &Result<Option<String>, FingerprintError>,
) -> Decision {
    match (recorded, current) {
        (Some(r), Ok(Some(c))) if r == c => Decision::AsLanded,
        (_, Ok(None)) if item.target.root == Root::Scratch => Decision::Land,
        (None, Ok(None)) => Decision::Land,
        (Some(_), Ok(None)) => Decision::LeftAlone("was removed since it was applied"),
        (Some(_), Ok(Some(_))) => Decision::LeftAlone("changed since it was applied"),
        (None, Ok(Some(_))) => Decision::LeftAlone("exists and was not applied by this run"),
        (_, Err(_)) => Decision::LeftAlone("cannot be compared with what was applied"),
    }
}

/// The fingerprint of what is at `rel` under the directory `root`, never
/// following a symlink; `None` when nothing is there.
pub fn fingerprint(root: BorrowedFd<'_>, rel: &str) -> Result<Option<String>, FingerprintError> {
    let top = match fsx::open_in_root(root, rel, OFlag::O_PATH | OFlag::O_NOFOLLOW) {
        Ok(fd) => fd,
        Err(e) if e.errno == Errno::ENOENT => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut hash = Sha256::new();
    let mut entries = 0usize;
    // Depth-first, names sorted, one descriptor per level.
    let mut stack: Vec<(String, OwnedFd, usize)> = vec![(String::new(), top, 0)];
    while let Some((path, fd, depth)) = stack.pop() {
        entries += 1;
        if entries > MAX_ENTRIES {
            return Err(FingerprintError::TooMany);
        }
        let st = fstat(fd.as_fd()).map_err(|errno| FingerprintError::Entry {
            call: "fstat",
            path: path.clone(),
            errno,
        })?;
        add(&mut hash, &path, &st);
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFLNK {
            let target = nix::fcntl::readlinkat(fd.as_fd(), "").map_err(|errno| FingerprintError::Entry {
                call: "readlink",
                path: path.clone(),
                errno,
            })?;
            hash.update(std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str()));
            hash.update([0]);
        } else if kind == SFlag::S_IFDIR {
            if depth >= MAX_DEPTH {
                return Err(FingerprintError::TooDeep);
            }
            let mut names = fsx::list_dir(fd.as_fd())?;
            names.sort();
            // Reversed onto the stack, so they come off in order.
            for name in names.into_iter().rev() {
                let child = open_child(fd.as_fd(), &name).map_err(|errno| FingerprintError::Child {
                    path: path.clone(),
                    name: name.clone(),
                    errno,
                })?;
                let child_path = format!("{path}/{}", name.to_string_lossy());
                if let Some(child) = child {
                    stack.push((child_path, child, depth + 1));
                }
            }
        }
    }
    Ok(Some(hex(&hash.finalize())))
}

fn open_child(dir: BorrowedFd<'_>, name: &CString) -> Result<Option<OwnedFd>, Errno> {
    match nix::fcntl::openat(
        dir,
        name.as_c_str(),
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        // Removed while we walked: it is not part of the tree any more.
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn add(hash: &mut Sha256, path: &str, st: &FileStat) {
    hash.update(path.as_bytes());
    hash.update([0]);
    for n in [
        st.st_mode as i64,
        st.st_size,
        st.st_ino as i64,
        st.st_mtime,
        st.st_mtime_nsec,
        st.st_ctime,
        st.st_ctime_nsec,
    ] {
        hash.update(n.to_le_bytes());
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{Access, Source, Target};

    fn dir_fd(p: &std::path::Path) -> OwnedFd {
        nix::fcntl::open(
            p,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn fingerprints_see_edits_additions_and_links() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("skill/sub")).unwrap();
        std::fs::write(t.path().join("skill/a.md"), "a").unwrap();
        std::fs::write(t.path().join("note.txt"), "n").unwrap();
        let root = dir_fd(t.path());
        let fp = |rel: &str| fingerprint(root.as_fd(), rel).unwrap();
        let (tree, note) = (fp("skill"), fp("note.txt"));
        assert!(tree.is_some() && note.is_some());
        assert_eq!(fp("skill"), tree, "stable");
        assert_eq!(fp("missing"), None);
        std::fs::write(t.path().join("skill/sub/new"), "x").unwrap();
        assert_ne!(fp("skill"), tree, "an added file");
        std::fs::write(t.path().join("note.txt"), "m").unwrap();
        assert_ne!(fp("note.txt"), note, "an edit");
        // A symlink is fingerprinted as a link, never followed.
        std::os::unix::fs::symlink("/etc", t.path().join("link")).unwrap();
        let link = fp("link");
        std::fs::remove_file(t.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/usr", t.path().join("link")).unwrap();
        assert_ne!(fp("link"), link);
    }

    #[test]
    fn decisions() {
        let item = |root| Item {
            id: "i".into(),
            name: None,
            apply: Apply::WriteFile,
            access: Access::Rw,
            source: Source::InlineText { text: String::new() },
            target: Target { root, path: "f".into() },
        };
        let ws = item(Root::Workspace);
        let some = |s: &str| Ok(Some(s.to_string()));
        assert_eq!(decide(&ws, Some("a"), &some("a")), Decision::AsLanded);
        assert_eq!(decide(&ws, None, &Ok(None)), Decision::Land);
        assert!(matches!(decide(&ws, Some("a"), &some("b")), Decision::LeftAlone(_)));
        assert!(matches!(decide(&ws, Some("a"), &Ok(None)), Decision::LeftAlone(_)));
        assert!(matches!(decide(&ws, None, &some("b")), Decision::LeftAlone(_)));
        assert!(matches!(decide(&ws, Some("a"), &Err(FingerprintError::TooDeep)), Decision::LeftAlone(_)));
        assert_eq!(decide(&item(Root::Scratch), Some("a"), &Ok(None)), Decision::Land);
    }
}
