//! A safe zip extractor.
//!
//! Before anything is written, the central directory is checked as a
//! whole: the entry count, every name (no absolute paths, drive letters,
//! `..`, NUL or control characters), every type (regular files and
//! directories only: symlinks, devices, fifos and sockets are refused),
//! compression (stored or deflate; no encryption), duplicate names, each
//! declared size against the per-file cap and their sum against the total
//! cap. While extracting, the bytes actually produced are counted, and an
//! entry that yields more (or fewer) bytes than it declared is refused the
//! moment it does, so a header that lies about sizes cannot get past the
//! caps. Directories are created first (collisions between entries, a
//! file where a directory is needed, are found from the names before
//! anything is written); files are created with `O_CREAT|O_EXCL|O_NOFOLLOW`
//! relative to directory descriptors inside the destination, which this
//! extractor created itself. Files are then filled by a few workers at once
//! (`pool`), with the error of the earliest failing entry, as one worker
//! would have it; `entry` reads, inflates and checks one entry.
//!
//! The messages keep the Node proxy's wording (`zip entry path is not
//! allowed: ../x`, `zip too many entries: maxEntries=5000`, ...).

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};

use crate::hostfs::root as fsx;

mod entry;
mod pool;

use entry::ArchiveAt;

/// Caps on what one archive may produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZipLimits {
    pub max_entries: u64,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

impl Default for ZipLimits {
    /// 5 000 entries, 20 MiB per file, 100 MiB in total (the Node proxy's).
    fn default() -> Self {
        ZipLimits { max_entries: 5_000, max_file_bytes: 20 << 20, max_total_bytes: 100 << 20 }
    }
}

/// What an extraction produced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extracted {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
}

/// Why an archive was refused.
#[derive(Debug, thiserror::Error)]
pub enum ZipError {
    /// The archive tries something dangerous (escape, link, special file).
    #[error("{0}")]
    Unsafe(String),
    /// The archive is over a configured cap.
    #[error("{0}")]
    Limit(String),
    /// Not a readable zip (corrupt, unsupported method, encrypted...).
    #[error("{0}")]
    Invalid(String),
    /// Writing the extracted tree failed.
    #[error("{0}")]
    Fs(#[from] fsx::FsError),
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;

/// A checked entry: where it goes and what it is.
struct Entry {
    index: usize,
    /// Normalized components, joined by `/`.
    path: String,
    /// Original name, for messages.
    shown: String,
    dir: bool,
    executable: bool,
    size: u64,
}

/// Extracts `archive` into the directory `into`, which should be empty and
/// private to the caller until the extraction is complete. Large archives
/// are extracted by up to [`default_workers`] threads; the result, error
/// included, is the same as with one.
pub fn extract(archive: &File, into: BorrowedFd<'_>, limits: &ZipLimits) -> Result<Extracted, ZipError> {
    extract_with(archive, into, limits, None)
}

/// Archives that declare less than this are extracted on the calling
/// thread alone (starting a thread costs more than it saves).
const PARALLEL_MIN_BYTES: u64 = 1 << 20;

/// The most worker threads an extraction uses: the CPUs this process may
/// run on, at most 4.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// As [`extract`], with `workers` threads (`None`: [`default_workers`]
/// for archives of at least 1 MiB, else one).
pub fn extract_with(
    archive: &File,
    into: BorrowedFd<'_>,
    limits: &ZipLimits,
    workers: Option<usize>,
) -> Result<Extracted, ZipError> {
    let zip = ::zip::ZipArchive::new(ArchiveAt::new(archive))
        .map_err(|e| ZipError::Invalid(format!("not a valid zip archive: {e}")))?;
    let checked = check(&zip, limits)?;

    let mut out = Extracted::default();
    let mut dirs: HashMap<String, OwnedFd> = HashMap::new();
    for dir in &checked.dirs {
        make_dir(into, &mut dirs, dir)?;
    }
    let files: Vec<&Entry> = checked.entries.iter().filter(|e| !e.dir).collect();
    out.dirs = (checked.entries.len() - files.len()) as u64;
    let workers = match workers {
        Some(n) => n,
        None if checked.total < PARALLEL_MIN_BYTES => 1,
        None => default_workers(),
    };
    out.bytes = pool::run(&zip, &files, into, &dirs, workers.clamp(1, files.len().max(1)))?;
    out.files = files.len() as u64;
    Ok(out)
}

/// The checked central directory.
struct Checked {
    entries: Vec<Entry>,
    /// Every directory to create (entries and parents), parents first.
    dirs: Vec<String>,
    /// The declared bytes of all files.
    total: u64,
}

/// Validates the whole central directory; nothing is written.
fn check<R: std::io::Read + std::io::Seek>(
    zip: &::zip::ZipArchive<R>,
    limits: &ZipLimits,
) -> Result<Checked, ZipError> {
    let count = zip.len() as u64;
    if count > limits.max_entries {
        return Err(ZipError::Limit(format!("zip too many entries: maxEntries={}", limits.max_entries)));
    }
    if zip.has_duplicate_names() {
        return Err(ZipError::Unsafe("zip has duplicate entry names".into()));
    }
    let metadata = zip.metadata();
    let mut entries = Vec::with_capacity(zip.len());
    let mut total: u64 = 0;
    for index in 0..zip.len() {
        let e = metadata
            .entry(index)
            .map_err(|e| ZipError::Invalid(format!("zip entry {index} unreadable: {e}")))?;
        let shown = shown_name(e.name_raw());
        let raw = std::str::from_utf8(e.name_raw()).map(str::to_string).or_else(|_| {
            e.name()
                .map(|n| n.into_owned())
                .map_err(|_| ZipError::Unsafe(format!("zip entry path is not allowed: {shown}")))
        })?;
        if raw.is_empty() {
            return Err(ZipError::Unsafe("zip entry filename empty".into()));
        }
        let Some(path) = normalize_entry(&raw) else {
            return Err(ZipError::Unsafe(format!("zip entry path is not allowed: {shown}")));
        };
        let unix = match e.system() {
            ::zip::System::Unix => Some(e.external_attributes() >> 16),
            _ => None,
        };
        let file_type = unix.map_or(0, |m| m & S_IFMT);
        if file_type == S_IFLNK || e.is_symlink() {
            return Err(ZipError::Unsafe(format!("zip entry symlink is not allowed: {shown}")));
        }
        if file_type != 0 && file_type != S_IFREG && file_type != S_IFDIR {
            return Err(ZipError::Unsafe(format!("zip entry special file is not allowed: {shown}")));
        }
        let dir = raw.ends_with('/') || raw.ends_with('\\') || file_type == S_IFDIR;
        if e.encrypted() {
            return Err(ZipError::Invalid(format!("zip entry is encrypted: {shown}")));
        }
        if !dir {
            use ::zip::CompressionMethod as M;
            if !matches!(e.compression(), M::Stored | M::Deflated) {
                return Err(ZipError::Invalid(format!(
                    "zip entry uses an unsupported compression method ({}): {shown}",
                    e.compression()
                )));
            }
            let size = e.size();
            if size > limits.max_file_bytes {
                return Err(ZipError::Limit(format!(
                    "zip entry too large: {shown} size={size} maxFileBytes={}",
                    limits.max_file_bytes
                )));
            }
            total = total.saturating_add(size);
            if total > limits.max_total_bytes {
                return Err(ZipError::Limit(format!(
                    "zip too large: total={total} maxTotalBytes={}",
                    limits.max_total_bytes
                )));
            }
        }
        entries.push(Entry {
            index,
            path,
            shown,
            dir,
            executable: unix.is_some_and(|m| m & 0o111 != 0),
            size: if dir { 0 } else { e.size() },
        });
    }
    let dirs = plan_dirs(&entries)?;
    Ok(Checked { entries, dirs, total })
}

/// The directories the entries need, parents first, and the first entry
/// (in archive order) that would collide with an earlier one: a file where
/// a directory is needed, or a name taken. Names were normalized, so this
/// is what creating them one by one in an empty directory would find.
fn plan_dirs(entries: &[Entry]) -> Result<Vec<String>, ZipError> {
    let conflict = |name: &str| ZipError::Unsafe(format!("zip entry conflicts with another entry: {name}"));
    // true: a directory.
    let mut seen: HashMap<&str, bool> = HashMap::new();
    let mut dirs = Vec::new();
    for e in entries {
        let parents = e.path.match_indices('/').map(|(i, _)| &e.path[..i]);
        let own = e.dir.then_some(e.path.as_str());
        for dir in parents.chain(own) {
            match seen.entry(dir) {
                Slot::Occupied(o) if !*o.get() => return Err(conflict(dir)),
                Slot::Occupied(_) => {}
                Slot::Vacant(v) => {
                    v.insert(true);
                    dirs.push(dir.to_string());
                }
            }
        }
        if !e.dir {
            match seen.entry(&e.path) {
                Slot::Occupied(_) => return Err(conflict(&e.shown)),
                Slot::Vacant(v) => {
                    v.insert(false);
                }
            }
        }
    }
    Ok(dirs)
}

/// The entry's path as normalized components, or `None` when it may not
/// be extracted: empty, absolute, a drive letter, `..`, NUL or control
/// characters. `\` is read as `/`.
fn normalize_entry(raw: &str) -> Option<String> {
    let name = raw.replace('\\', "/");
    if name.chars().any(char::is_control) || name.starts_with('/') {
        return None;
    }
    let b = name.as_bytes();
    if b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':' {
        return None;
    }
    let mut parts = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => return None,
            c if c.len() > 255 => return None,
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(parts.join("/"))
}

/// A name as it may appear in a one-line message: control characters
/// escaped, the rest (including non-ASCII letters) as is.
fn shown_name(raw: &[u8]) -> String {
    let mut out = String::new();
    for c in String::from_utf8_lossy(raw).chars().take(300) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Creates directory `path` inside the extraction root (its parent was
/// created before it) and keeps its descriptor, opened with `O_NOFOLLOW`
/// relative to the parent's.
fn make_dir(root: BorrowedFd<'_>, dirs: &mut HashMap<String, OwnedFd>, path: &str) -> Result<(), ZipError> {
    let (parent, component) = match path.rsplit_once('/') {
        Some((up, name)) => (dirs.get(up).expect("parents are created first").as_fd(), name),
        None => (root, path),
    };
    let name = CString::new(component).expect("names were checked for NUL");
    match mkdirat(parent, name.as_c_str(), Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(fsx::fs_err("mkdirat", path, e).into()),
    }
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(parent, name.as_c_str(), flags, Mode::empty()).map_err(|e| match e {
        Errno::ENOTDIR | Errno::ELOOP => {
            ZipError::Unsafe(format!("zip entry conflicts with another entry: {path}"))
        }
        e => ZipError::from(fsx::fs_err("openat", path, e)),
    })?;
    dirs.insert(path.to_string(), fd);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names() {
        for bad in
            ["../x", "a/../../x", "/etc/x", "\\etc\\x", "C:/x", "c:x", "..", "./", "a\u{0}b", "a\nb", ""]
        {
            assert_eq!(normalize_entry(bad), None, "{bad:?}");
        }
        assert_eq!(normalize_entry("a/./b//c").as_deref(), Some("a/b/c"));
        assert_eq!(normalize_entry("dir\\file").as_deref(), Some("dir/file"));
        assert_eq!(normalize_entry("..a/b..").as_deref(), Some("..a/b.."));
    }

    #[test]
    fn names_in_messages_are_one_line() {
        assert_eq!(shown_name(b"a\nb"), "a\\nb");
        assert_eq!(shown_name(b"../x"), "../x");
    }
}
