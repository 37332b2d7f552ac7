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
//! caps. Files are created with `O_CREAT|O_EXCL|O_NOFOLLOW` relative to
//! directory descriptors inside the destination, which this extractor
//! created itself.
//!
//! The messages keep the Node proxy's wording (`zip entry path is not
//! allowed: ../x`, `zip too many entries: maxEntries=5000`, ...).

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};

use super::fsx;

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
const COPY_BUF: usize = 256 * 1024;

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
/// private to the caller until the extraction is complete.
pub fn extract(archive: &File, into: BorrowedFd<'_>, limits: &ZipLimits) -> Result<Extracted, ZipError> {
    let mut reader = BufReader::with_capacity(64 * 1024, archive);
    reader.seek(SeekFrom::Start(0)).map_err(|e| ZipError::Invalid(format!("zip read failed: {e}")))?;
    let mut zip = ::zip::ZipArchive::new(reader)
        .map_err(|e| ZipError::Invalid(format!("not a valid zip archive: {e}")))?;
    let entries = check(&zip, limits)?;

    let mut dirs: HashMap<String, OwnedFd> = HashMap::new();
    let mut out = Extracted::default();
    let mut buf = vec![0u8; COPY_BUF];
    for entry in &entries {
        if entry.dir {
            dir_fd(into, &mut dirs, &entry.path)?;
            out.dirs += 1;
            continue;
        }
        let (parent, name) = match entry.path.rsplit_once('/') {
            Some((parent, name)) => (dir_fd(into, &mut dirs, parent)?, name),
            None => (into, entry.path.as_str()),
        };
        let name = CString::new(name).expect("names were checked for NUL");
        let mode = if entry.executable { 0o755 } else { 0o644 };
        let mut file = fsx::create_file(parent, &name, mode).map_err(|e| match e.errno {
            Errno::EEXIST | Errno::ENOTDIR | Errno::EISDIR => {
                ZipError::Unsafe(format!("zip entry conflicts with another entry: {}", entry.shown))
            }
            _ => ZipError::Fs(fsx::FsError { path: entry.path.clone(), ..e }),
        })?;
        let mut data = zip
            .by_index(entry.index)
            .map_err(|e| ZipError::Invalid(format!("zip entry unreadable: {}: {e}", entry.shown)))?;
        let mut produced: u64 = 0;
        loop {
            // Never ask for more than was declared; once it is all there,
            // a 1-byte read must find the end of the entry.
            let remaining = entry.size - produced;
            let want = if remaining == 0 { 1 } else { remaining.min(buf.len() as u64) as usize };
            let n = match data.read(&mut buf[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // The reader counts too and refuses data past the declared
                // size; a checksum failure at the end is corruption.
                Err(e) if remaining == 0 && !e.to_string().contains("checksum") => {
                    return Err(size_lie(entry));
                }
                Err(e) => return Err(ZipError::Invalid(format!("zip entry corrupt: {}: {e}", entry.shown))),
            };
            produced += n as u64;
            if produced > entry.size {
                return Err(size_lie(entry));
            }
            file.write_all(&buf[..n]).map_err(|e| {
                ZipError::Fs(fsx::fs_err(
                    "write",
                    &entry.path,
                    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                ))
            })?;
        }
        if produced != entry.size {
            return Err(ZipError::Unsafe(format!(
                "zip entry size mismatch: {} declared={} actual={produced}",
                entry.shown, entry.size
            )));
        }
        out.files += 1;
        out.bytes += produced;
    }
    Ok(out)
}

fn size_lie(entry: &Entry) -> ZipError {
    ZipError::Unsafe(format!(
        "zip entry size mismatch: {} declared={} actual>{}",
        entry.shown, entry.size, entry.size
    ))
}

/// Validates the whole central directory; nothing is written.
fn check<R: Read + Seek>(zip: &::zip::ZipArchive<R>, limits: &ZipLimits) -> Result<Vec<Entry>, ZipError> {
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
    Ok(entries)
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

/// The descriptor of directory `path` inside the extraction root, creating
/// it and its parents as needed. Each component is opened with
/// `O_NOFOLLOW` relative to its parent's descriptor.
fn dir_fd<'a>(
    root: BorrowedFd<'a>,
    dirs: &'a mut HashMap<String, OwnedFd>,
    path: &str,
) -> Result<BorrowedFd<'a>, ZipError> {
    if !dirs.contains_key(path) {
        let mut end = 0;
        for component in path.split('/') {
            end += component.len();
            let prefix = &path[..end];
            end += 1;
            if dirs.contains_key(prefix) {
                continue;
            }
            let parent = match prefix.rsplit_once('/') {
                Some((up, _)) => dirs.get(up).expect("parents are opened first").as_fd(),
                None => root,
            };
            let name = CString::new(component).expect("names were checked for NUL");
            match mkdirat(parent, name.as_c_str(), Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(fsx::fs_err("mkdirat", prefix, e).into()),
            }
            let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let fd = openat(parent, name.as_c_str(), flags, Mode::empty()).map_err(|e| match e {
                Errno::ENOTDIR | Errno::ELOOP => {
                    ZipError::Unsafe(format!("zip entry conflicts with another entry: {prefix}"))
                }
                e => fsx::fs_err("openat", prefix, e).into(),
            })?;
            dirs.insert(prefix.to_string(), fd);
        }
    }
    Ok(dirs[path].as_fd())
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
