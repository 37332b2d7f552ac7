//! Writing under a logical root through descriptors only.
//!
//! Every path an item names is resolved with `openat2(RESOLVE_IN_ROOT)`
//! relative to the descriptor of its logical root (`/workspace`, the home,
//! `/scratch`, or a host directory backing one), so `..` and symlinks,
//! absolute ones included, stay inside that root. A new file is written by
//! the atomic writer ([`super::atomic`]: an anonymous file linked over the
//! target); a new tree is built in a staging directory next to the target
//! and renamed into place only when it is complete (`renameat2` within one
//! filesystem). Either way a failure leaves the previous target as it was.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat, renameat2};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// An OS failure with the call and path it concerns, rendered like
/// `openat2("a/b") => ENOENT (No such file or directory)`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{call}(\"{path}\") => {errno:?} ({})", errno.desc())]
pub struct FsError {
    pub call: &'static str,
    pub path: String,
    pub errno: Errno,
}

pub type FsResult<T> = Result<T, FsError>;

pub(crate) fn fs_err(call: &'static str, path: impl AsRef<[u8]>, errno: Errno) -> FsError {
    FsError { call, path: String::from_utf8_lossy(path.as_ref()).into_owned(), errno }
}

fn cstr(path: &str) -> FsResult<CString> {
    CString::new(path).map_err(|_| fs_err("path", path, Errno::EINVAL))
}

/// Opens `rel` under `root` as if `root` were `/`. `""` is the root itself.
pub fn open_in_root(root: BorrowedFd<'_>, rel: &str, flags: OFlag) -> FsResult<OwnedFd> {
    if rel.contains('\0') {
        return Err(fs_err("path", rel, Errno::EINVAL));
    }
    super::open::open(root, rel, flags, super::open::Scope::InRoot, super::open::Links::Follow)
        .map_err(|e| fs_err("openat2", rel, e))
}

/// An `O_PATH` descriptor for directory `rel` under `root`, creating missing
/// directories (mode 0755) one component at a time, each resolved in-root.
pub fn mkdir_p(root: BorrowedFd<'_>, rel: &str) -> FsResult<OwnedFd> {
    let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
    match open_in_root(root, rel, dir_flags) {
        Ok(fd) => return Ok(fd),
        Err(e) if e.errno == Errno::ENOENT => {}
        Err(e) => return Err(e),
    }
    let mut current = open_in_root(root, "", dir_flags)?;
    let mut end = 0;
    for component in rel.split('/') {
        end += component.len();
        let prefix = &rel[..end];
        end += 1;
        current = match open_in_root(root, prefix, dir_flags) {
            Ok(fd) => fd,
            Err(e) if e.errno == Errno::ENOENT => {
                match mkdirat(&current, component, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(fs_err("mkdirat", prefix, e)),
                }
                open_in_root(root, prefix, dir_flags)?
            }
            Err(e) => return Err(e),
        };
    }
    Ok(current)
}

/// The directory holding `rel` (created if missing) and the last component.
/// `rel` must not be empty.
pub fn parent_of(root: BorrowedFd<'_>, rel: &str) -> FsResult<(OwnedFd, CString)> {
    let (parent, name) = match rel.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => ("", rel),
    };
    if name.is_empty() {
        return Err(fs_err("path", rel, Errno::EINVAL));
    }
    Ok((mkdir_p(root, parent)?, cstr(name)?))
}

/// The kind of staging entry: a directory tree. (Files are written
/// anonymously, [`super::atomic`]; a name they need starts with
/// [`WRITE_PREFIX`] and is never swept.)
const STAGE: &str = "stage";
/// The prefix of a name the atomic writer gives a file under a root.
pub const WRITE_PREFIX: &str = ".tuixiu-write-";

/// A fresh name for a staging entry; never a name a manifest could mean.
pub fn staging_name(what: &str) -> CString {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    CString::new(format!(".tuixiu-{what}-{}-{nanos:x}-{n}", std::process::id())).expect("no NUL")
}

/// Whether `name` is one [`staging_name`] makes for a directory:
/// `.tuixiu-stage-`, then decimal, hex and decimal numbers.
fn is_staging_name(name: &[u8]) -> bool {
    let Ok(name) = std::str::from_utf8(name) else { return false };
    let Some(rest) = name.strip_prefix(".tuixiu-").and_then(|r| r.split_once('-')) else { return false };
    let parts: Vec<&str> = rest.1.split('-').collect();
    let digits = |s: &str, radix: u32| !s.is_empty() && s.chars().all(|c| c.is_digit(radix));
    rest.0 == STAGE
        && parts.len() == 3
        && digits(parts[0], 10)
        && digits(parts[1], 16)
        && digits(parts[2], 10)
}

/// Takes the writer's lock on a staging entry we just created. `Ok(None)`:
/// it was removed before we had the lock (a sweeper took it for litter),
/// so pick another name. The lock lives as long as the descriptor, i.e.
/// as long as this process works on the entry, and goes with the process:
/// that is how [`sweep_stale`] tells live entries from a killed run's.
pub(crate) fn lock_fresh(fd: OwnedFd, what: &CStr) -> FsResult<Option<OwnedFd>> {
    Ok(lock_new(fd.as_fd(), what)?.then_some(fd))
}

/// [`lock_fresh`] on a descriptor someone else owns: `true` when locked
/// (or when this filesystem has no locks, so nothing can sweep it either).
pub(crate) fn lock_new(fd: BorrowedFd<'_>, what: &CStr) -> FsResult<bool> {
    match flock_exclusive(fd) {
        Ok(()) => {}
        // A sweeper holds it: it will be gone in a moment.
        Err(Errno::EWOULDBLOCK) => return Ok(false),
        // No locks on this filesystem: nothing can sweep it either.
        Err(Errno::ENOLCK | Errno::EOPNOTSUPP | Errno::EINVAL) => return Ok(true),
        Err(e) => return Err(fs_err("flock", what.to_bytes(), e)),
    }
    let st = nix::sys::stat::fstat(fd).map_err(|e| fs_err("fstat", what.to_bytes(), e))?;
    Ok(st.st_nlink > 0)
}

fn flock_exclusive(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor the caller holds open.
    Errno::result(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }).map(drop)
}

/// Removes what killed runs left in `dir`: staging directories
/// ([`is_staging_name`]) that nobody holds locked ([`sweep_unlocked`]).
///
/// Called only where an input item lands (never for the ACP host's
/// writes), and only for directories: a file is never taken for litter
/// (files are written anonymously, [`super::atomic`]). A directory cannot
/// be anonymous, and nothing proves a directory with this exact name form
/// is ours (the sandbox user's files have our uid; a name can be copied),
/// so a directory someone made under that name, unlocked, in the parent of
/// a landing target, is removed: the price of not leaving a killed
/// extraction's tree (up to the archive limits) in the workspace forever.
pub fn sweep_stale(dir: BorrowedFd<'_>) {
    let is_dir = |name: &[u8]| {
        CString::new(name).is_ok_and(|n| kind_at(dir, &n).is_ok_and(|k| k == Some(SFlag::S_IFDIR)))
    };
    sweep_unlocked(dir, |name| is_staging_name(name) && is_dir(name), None);
}

/// Removes the entries of `dir` whose name `ours` recognises (and, with
/// `owner`, that belong to that uid) and that nobody holds locked. A live
/// writer holds its entry's lock for as long as it works on it, and the
/// kernel drops the lock when the writer dies, so an entry we can lock is
/// litter; holding the lock while we remove it keeps a writer from taking
/// it meanwhile ([`lock_fresh`] then sees it unlinked). Best effort:
/// litter that cannot be removed costs space, not correctness.
pub(crate) fn sweep_unlocked(dir: BorrowedFd<'_>, ours: impl Fn(&[u8]) -> bool, owner: Option<u32>) {
    let Ok(names) = list_dir(dir) else { return };
    for name in names.iter().filter(|n| ours(n.to_bytes())) {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let Ok(fd) = openat(dir, name.as_c_str(), flags, Mode::empty()) else { continue };
        if owner.is_some_and(|uid| nix::sys::stat::fstat(&fd).map_or(true, |st| st.st_uid != uid)) {
            continue;
        }
        if flock_exclusive(fd.as_fd()).is_err() {
            continue;
        }
        match remove_tree(dir, name) {
            Ok(()) => tracing::info!("removed {} left by a killed run", name.to_string_lossy()),
            Err(e) => {
                tracing::debug!("could not remove {} left by a killed run: {e}", name.to_string_lossy())
            }
        }
        drop(fd);
    }
}

/// What is at `name` in `dir`, without following a symlink.
pub fn kind_at(dir: BorrowedFd<'_>, name: &CStr) -> FsResult<Option<SFlag>> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()))),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(fs_err("fstatat", name.to_bytes(), e)),
    }
}

/// Creates a staging directory in `parent` (after sweeping what killed
/// runs left there); returns its name and a readable descriptor that holds
/// its lock.
pub fn make_staging_dir(parent: BorrowedFd<'_>) -> FsResult<(CString, OwnedFd)> {
    sweep_stale(parent);
    loop {
        let name = staging_name(STAGE);
        match mkdirat(parent, name.as_c_str(), Mode::from_bits_truncate(0o755)) {
            Ok(()) => {}
            Err(Errno::EEXIST) => continue,
            Err(e) => return Err(fs_err("mkdirat", name.to_bytes(), e)),
        }
        let fd = match openat(parent, name.as_c_str(), dir_read_flags(), Mode::empty()) {
            Ok(fd) => fd,
            // Swept between mkdirat and openat.
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(fs_err("openat", name.to_bytes(), e)),
        };
        match lock_fresh(fd, &name)? {
            Some(fd) => return Ok((name, fd)),
            None => continue,
        }
    }
}

pub fn dir_read_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Writes `bytes` to a new file `name` in `dir` (which must not exist).
pub fn create_file(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> FsResult<File> {
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, name, flags, Mode::from_bits_truncate(mode))
        .map_err(|e| fs_err("openat", name.to_bytes(), e))?;
    Ok(File::from(fd))
}

/// Atomically replaces (or creates) file `rel` under `root` with what
/// `fill` writes, created with `mode` (umask applied): the atomic writer
/// ([`super::atomic`]) by directory descriptor: an anonymous file filled,
/// then linked over the target. Stale staging directories in the target's
/// directory are swept first ([`sweep_stale`]).
pub fn replace_file(
    root: BorrowedFd<'_>,
    rel: &str,
    mode: u32,
    fill: impl FnOnce(&mut File) -> std::io::Result<u64>,
) -> FsResult<u64> {
    use super::atomic::{AtomicFile, Durability};
    let (parent, name) = parent_of(root, rel)?;
    sweep_stale(parent.as_fd());
    let mut tmp = AtomicFile::new_at(parent.as_fd(), WRITE_PREFIX, mode)
        .map_err(|e| fs_err("openat", rel, super::errno_of(&e)))?;
    let n = fill(&mut tmp.file)
        .and_then(|n| tmp.file.flush().map(|()| n))
        .map_err(|e| fs_err("write", rel, super::errno_of(&e)))?;
    tmp.commit_at(&name, Durability::Unsynced).map_err(|e| fs_err("renameat2", rel, super::errno_of(&e)))?;
    Ok(n)
}

/// Lands a directory tree at `rel` under `root`, replacing what was there.
///
/// `fill` populates a staging directory created next to the target; then
/// `check` may veto the result. Only then is the tree renamed into place
/// (exchanged with an existing target, whose old content is removed after).
/// For the root itself (`rel == ""`) the staging directory is made inside
/// the root and its top-level entries are moved in one by one, each
/// replacing an entry of the same name.
pub fn replace_tree<T, E: From<FsError>>(
    root: BorrowedFd<'_>,
    rel: &str,
    fill: impl FnOnce(BorrowedFd<'_>) -> Result<T, E>,
    check: impl FnOnce(BorrowedFd<'_>) -> Result<(), E>,
) -> Result<T, E> {
    let (parent, name) = if rel.is_empty() {
        (mkdir_p(root, "")?, None)
    } else {
        let (parent, name) = parent_of(root, rel)?;
        (parent, Some(name))
    };
    let (staging, stage_fd) = make_staging_dir(parent.as_fd())?;
    let built = fill(stage_fd.as_fd()).and_then(|t| check(stage_fd.as_fd()).map(|()| t));
    let result = match built {
        Ok(t) => match &name {
            Some(name) => {
                swap_into_place(parent.as_fd(), &staging, name, rel).map(|()| t).map_err(Into::into)
            }
            None => {
                merge_into_root(parent.as_fd(), &staging, stage_fd.as_fd()).map(|()| t).map_err(Into::into)
            }
        },
        Err(e) => Err(e),
    };
    drop(stage_fd);
    if result.is_err() {
        if let Err(e) = remove_tree(parent.as_fd(), &staging) {
            tracing::warn!("could not remove the staging directory {}: {e}", staging.to_string_lossy());
        }
    }
    result
}

fn swap_into_place(parent: BorrowedFd<'_>, staging: &CStr, name: &CStr, rel: &str) -> FsResult<()> {
    match renameat2(parent, staging, parent, name, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => return Ok(()),
        Err(Errno::EEXIST) => {}
        Err(e) => return Err(fs_err("renameat2", rel, e)),
    }
    renameat2(parent, staging, parent, name, RenameFlags::RENAME_EXCHANGE)
        .map_err(|e| fs_err("renameat2(RENAME_EXCHANGE)", rel, e))?;
    // `staging` now names the previous target. The new tree is in place,
    // so a leftover is worth a warning, not a failed item. It is unlocked
    // now: a sweeper may take it first, which is as good.
    if let Err(e) = remove_tree(parent, staging) {
        tracing::warn!(
            "{rel}: the replaced content could not be removed ({e}); it is left at {}",
            staging.to_string_lossy()
        );
    }
    Ok(())
}

fn merge_into_root(root: BorrowedFd<'_>, staging: &CStr, stage: BorrowedFd<'_>) -> FsResult<()> {
    // Names relative to the two directory descriptors only: no path is
    // walked again, so nothing swapped in meanwhile can redirect a rename.
    for name in &list_dir(stage)? {
        match renameat2(stage, name.as_c_str(), root, name.as_c_str(), RenameFlags::RENAME_NOREPLACE) {
            Ok(()) => continue,
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(fs_err("renameat2", name.to_bytes(), e)),
        }
        renameat2(stage, name.as_c_str(), root, name.as_c_str(), RenameFlags::RENAME_EXCHANGE)
            .map_err(|e| fs_err("renameat2(RENAME_EXCHANGE)", name.to_bytes(), e))?;
        if let Err(e) = remove_tree(stage, name) {
            tracing::warn!("{}: the replaced content could not be removed: {e}", name.to_string_lossy());
        }
    }
    unlinkat(root, staging, UnlinkatFlags::RemoveDir).map_err(|e| fs_err("unlinkat", staging.to_bytes(), e))
}

/// The names in a directory (without `.` and `..`).
pub fn list_dir(dir: BorrowedFd<'_>) -> FsResult<Vec<CString>> {
    let fd = openat(dir, c".", dir_read_flags(), Mode::empty()).map_err(|e| fs_err("openat", ".", e))?;
    let mut d = nix::dir::Dir::from_fd(fd).map_err(|e| fs_err("fdopendir", ".", e))?;
    let mut names = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(|e| fs_err("getdents", ".", e))?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Removes `name` in `parent` and everything below it, never following a
/// symlink and never leaving the filesystem (a mount point inside fails
/// with EBUSY and stays).
pub fn remove_tree(parent: BorrowedFd<'_>, name: &CStr) -> FsResult<()> {
    match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::EISDIR) => {}
        Err(e) => return Err(fs_err("unlinkat", name.to_bytes(), e)),
    }
    // An explicit stack: archive trees can be deeper than the thread stack likes.
    let top = openat(parent, name, dir_read_flags(), Mode::empty())
        .map_err(|e| fs_err("openat", name.to_bytes(), e))?;
    let names = list_dir(top.as_fd())?;
    let mut stack: Vec<(OwnedFd, Vec<CString>)> = vec![(top, names)];
    while let Some(frame) = stack.last_mut() {
        let Some(child) = frame.1.pop() else {
            // Empty now; the parent frame removes it when it comes back to it.
            stack.pop();
            continue;
        };
        let dir = frame.0.as_fd();
        match unlinkat(dir, child.as_c_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(Errno::EISDIR) => match unlinkat(dir, child.as_c_str(), UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(Errno::ENOTEMPTY | Errno::EEXIST) => {
                    let sub = openat(dir, child.as_c_str(), dir_read_flags(), Mode::empty())
                        .map_err(|e| fs_err("openat", child.to_bytes(), e))?;
                    let sub_names = list_dir(sub.as_fd())?;
                    frame.1.push(child);
                    stack.push((sub, sub_names));
                }
                Err(e) => return Err(fs_err("unlinkat", child.to_bytes(), e)),
            },
            Err(e) => return Err(fs_err("unlinkat", child.to_bytes(), e)),
        }
    }
    unlinkat(parent, name, UnlinkatFlags::RemoveDir).map_err(|e| fs_err("unlinkat", name.to_bytes(), e))
}

/// `true` when the directory holds no entries.
pub fn is_empty_dir(dir: BorrowedFd<'_>) -> FsResult<bool> {
    Ok(list_dir(dir)?.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names_are_recognised_and_nothing_else() {
        assert!(is_staging_name(staging_name(STAGE).to_bytes()));
        assert!(!is_staging_name(staging_name("write").to_bytes()));
        assert!(is_staging_name(b".tuixiu-stage-123-abc0-7"));
        for other in [
            ".tuixiu-stage-notes",
            ".tuixiu-stage-1-2",
            ".tuixiu-stage-1-xyz-3",
            ".tuixiu-staging",
            ".tuixiu-other-1-a-2",
            "tuixiu-stage-1-a-2",
            ".tuixiu-stage-1-a-2-4",
        ] {
            assert!(!is_staging_name(other.as_bytes()), "{other}");
        }
    }
}
