//! File access confined to a directory, and atomic writes.
//!
//! Everything a skill package, a client or an engine names (schema paths,
//! artifact paths) is opened relative to a directory descriptor with
//! `openat2(RESOLVE_BENEATH)`: `..` past the directory, absolute paths and
//! symlinks that lead out fail in the kernel (`EXDEV`), whatever the path
//! string looks like. Paths a sandboxed engine controls (its artifacts) are
//! opened with `RESOLVE_NO_SYMLINKS` as well, so a link is never followed,
//! not even one that stays inside. A file is opened for reading only once
//! an `O_PATH` descriptor has shown it is a regular file
//! ([`open_regular`]): a FIFO, a socket or a device node is never opened.
//! Atomic writes by path are [`super::atomic`]'s.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, Mode, SFlag, fstat};

pub use super::open::Links;

/// Opens `rel` beneath `dir` (`..`, absolute paths and symlinks that lead
/// out fail with `EXDEV`). `rel` must be relative.
pub fn open_beneath(dir: BorrowedFd<'_>, rel: &str, flags: OFlag, links: Links) -> Result<OwnedFd, Errno> {
    super::open::open(dir, rel, flags, super::open::Scope::Beneath, links)
}

/// A descriptor for a host directory the server owns.
pub fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)?;
    Ok(OwnedFd::from(file))
}

/// What kind of file a descriptor refers to.
pub fn file_type(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// Opens the regular file `rel` beneath `dir` for reading, and nothing
/// else. The path is first resolved to an `O_PATH` descriptor, which opens
/// nothing: no device driver's `open`, no wait for a FIFO's writer, no
/// socket. Only when `fstat` shows a regular file is that same inode opened
/// for reading, through `/proc/self/fd`, so what is read is what was
/// checked. (An engine can leave a FIFO where an artifact should be; a
/// plain `open` blocks on it for ever.) A symlink as the last component is
/// `ELOOP`, as with `O_NOFOLLOW`.
pub fn open_regular(dir: BorrowedFd<'_>, rel: &str, links: Links) -> Result<(File, FileStat), ReadError> {
    let path = open_beneath(dir, rel, OFlag::O_PATH | OFlag::O_NOFOLLOW, links).map_err(ReadError::Open)?;
    let st = fstat(path.as_fd()).map_err(ReadError::Open)?;
    match file_type(&st) {
        SFlag::S_IFREG => {}
        SFlag::S_IFLNK => return Err(ReadError::Open(Errno::ELOOP)),
        _ => return Err(ReadError::NotRegular),
    }
    let proc_path = format!("/proc/self/fd/{}", path.as_raw_fd());
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::open(proc_path.as_str(), flags, Mode::empty()).map_err(ReadError::Reopen)?;
    Ok((File::from(fd), st))
}

/// Whether `rel` beneath `dir` is a regular file, seen through an `O_PATH`
/// descriptor (nothing is opened; see [`open_regular`]).
pub fn is_regular_beneath(dir: BorrowedFd<'_>, rel: &str, links: Links) -> bool {
    open_beneath(dir, rel, OFlag::O_PATH | OFlag::O_NOFOLLOW, links)
        .and_then(|fd| fstat(fd.as_fd()))
        .is_ok_and(|st| file_type(&st) == SFlag::S_IFREG)
}

/// Reads the regular file `rel` beneath `dir`, at most `max` bytes.
pub fn read_beneath(dir: BorrowedFd<'_>, rel: &str, links: Links, max: u64) -> Result<Vec<u8>, ReadError> {
    let (file, st) = open_regular(dir, rel, links)?;
    if st.st_size as u64 > max {
        return Err(ReadError::TooLarge(max));
    }
    let mut bytes = Vec::with_capacity(st.st_size as usize);
    file.take(max + 1).read_to_end(&mut bytes).map_err(|e| ReadError::Io(e.to_string()))?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge(max));
    }
    Ok(bytes)
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Open(Errno),
    #[error("not a regular file")]
    NotRegular,
    #[error("open(\"/proc/self/fd/N\") => {0}")]
    Reopen(Errno),
    #[error("larger than {0} bytes")]
    TooLarge(u64),
    #[error("{0}")]
    Io(String),
}

/// Replaces `path` with `bytes` atomically: a temporary file in the same
/// directory, written and synced, then renamed over it. A crash leaves the
/// old content or the new, never a torn file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    super::atomic::write(path, bytes, super::atomic::Durability::Synced)
}

/// As `write_atomic` without the sync: readers see the old content or the
/// new, but a machine crash may lose it unless `sync_file` ran since.
pub fn write_replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    super::atomic::write(path, bytes, super::atomic::Durability::Unsynced)
}

/// Makes a file written by `write_replace` durable: its data, then its
/// directory entry. A missing file is not an error (nothing to keep).
pub fn sync_file(path: &Path) -> std::io::Result<()> {
    match std::fs::File::open(path) {
        Ok(f) => f.sync_data()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    std::fs::File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

/// Whether `name` is one plain path component a client may use as a key
/// or an id: not empty, not `.`/`..`, no `/`, no NUL or control characters.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 255
        && !name.contains('/')
        && !name.chars().any(char::is_control)
}

/// Whether `rel` is a relative path of plain components (`a/b.txt`), the
/// shape an artifact pattern must have.
pub fn is_plain_relative(rel: &str) -> bool {
    !rel.is_empty() && rel.split('/').all(is_plain_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for bad in ["", ".", "..", "a/b", "a\0b", "a\nb"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
        assert!(is_plain_name("input.txt"));
        assert!(is_plain_name("..a"));
        assert!(is_plain_relative("a/b.md"));
        for bad in ["/a", "a//b", "a/../b", "a/", "../a", ""] {
            assert!(!is_plain_relative(bad), "{bad:?}");
        }
    }
}
