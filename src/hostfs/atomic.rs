//! Atomic replacement of a host file by path: the one helper behind the
//! skill jobs' records and bundles (`beneath::write_atomic`,
//! `skills/artifacts.rs`) and the input cache's downloads
//! (`inputs/download.rs`).
//!
//! The new content is written to a temporary file in the target's
//! directory (`tempfile`: a fresh random name, created `O_EXCL`, so never
//! through a symlink someone left there), optionally synced, then renamed
//! over the target: a reader sees the old file or the new one, never half
//! of one; a symlink at the target is replaced, not followed; a failure
//! before the rename removes the temporary file and leaves the target as
//! it was. (Writes under a root's descriptor go through
//! [`super::root::replace_file`] instead.)

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::Path;

/// Whether the data is synced before the rename.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `fdatasync` first: after a crash the target holds the old content
    /// or the new, complete.
    Synced,
    /// Readers see the old content or the new, but a machine crash may
    /// lose the new one.
    Unsynced,
}

/// A temporary file on its way to replace a target.
#[derive(Debug)]
pub struct AtomicFile {
    /// The open temporary file: write the new content here.
    pub file: File,
    /// Its name; `None` for a file that never had one ([`AtomicFile::anonymous`]).
    path: Option<tempfile::TempPath>,
}

impl AtomicFile {
    /// A new temporary file in `dir` (the target's directory), named
    /// `<prefix><random>`.
    pub fn new_in(dir: &Path, prefix: &str) -> io::Result<AtomicFile> {
        let (file, path) = tempfile::Builder::new().prefix(prefix).tempfile_in(dir)?.into_parts();
        Ok(AtomicFile { file, path: Some(path) })
    }

    /// As [`AtomicFile::new_in`], holding the writer's lock on the file
    /// (see [`super::root::sweep_unlocked`]: a live writer's file is never
    /// taken for a killed one's litter). `what` names it in errors.
    pub fn new_locked_in(dir: &Path, prefix: &str, what: &CStr) -> Result<AtomicFile, LockedError> {
        loop {
            let tmp = AtomicFile::new_in(dir, prefix).map_err(LockedError::Create)?;
            if super::root::lock_new(tmp.file.as_fd(), what).map_err(LockedError::Lock)? {
                return Ok(tmp);
            }
            // A sweeper took it for litter: another name.
        }
    }

    /// An open file with no name (a memfd, an `O_TMPFILE`): it can only be
    /// [discarded](AtomicFile::discard).
    pub fn anonymous(file: File) -> AtomicFile {
        AtomicFile { file, path: None }
    }

    /// Renames the file over `target` (in the same filesystem), after
    /// syncing it when `sync` says so; the open file stays usable.
    pub fn commit(self, target: &Path, sync: Durability) -> io::Result<File> {
        let Some(path) = self.path else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an anonymous file has no name to rename",
            ));
        };
        if sync == Durability::Synced {
            self.file.sync_data()?;
        }
        path.persist(target).map_err(|e| e.error)?;
        Ok(self.file)
    }

    /// Removes the temporary name; the open file stays usable.
    pub fn discard(self) -> File {
        drop(self.path);
        self.file
    }
}

/// Why [`AtomicFile::new_locked_in`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LockedError {
    #[error("{0}")]
    Create(io::Error),
    #[error("{0}")]
    Lock(super::root::FsError),
}

/// Replaces `path` with `bytes` ([`AtomicFile`], synced as `sync` says).
pub fn write(path: &Path, bytes: &[u8], sync: Durability) -> io::Result<()> {
    let mut tmp = AtomicFile::new_in(path.parent().unwrap_or(Path::new(".")), ".tmp-")?;
    tmp.file.write_all(bytes)?;
    tmp.commit(path, sync).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_links_and_leaves_nothing_on_failure() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        let target = t.path().join("target");
        std::os::unix::fs::symlink(&outside, &target).unwrap();
        write(&target, b"new", Durability::Synced).unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        assert!(!std::fs::symlink_metadata(&target).unwrap().file_type().is_symlink());
        // A rename that cannot happen (a directory in the way) leaves no
        // temporary file behind.
        std::fs::create_dir(t.path().join("dir")).unwrap();
        std::fs::write(t.path().join("dir/x"), "x").unwrap();
        assert!(write(&t.path().join("dir"), b"y", Durability::Unsynced).is_err());
        let names: Vec<_> = std::fs::read_dir(t.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        let anon = AtomicFile::anonymous(tempfile::tempfile().unwrap());
        assert!(anon.commit(&t.path().join("z"), Durability::Unsynced).is_err());
    }
}
