//! Host paths: the allowlist that `copy` and `bindMount` sources must lie
//! under, opening a source without following a symlink swapped in after the
//! check, and copying a tree with symlinks copied as symlinks.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat};
use nix::sys::stat::{Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::symlinkat;

use super::error::{Cause, Code, InputError};
use crate::hostfs::open::{Links, Scope, open};
use crate::hostfs::root::{self as fsx, FsError, fs_err};

/// The host directories that hostPath sources may come from (canonical).
#[derive(Clone, Debug, Default)]
pub struct HostAllowlist {
    roots: Vec<PathBuf>,
}

/// A hostPath source that passed the allowlist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPath {
    /// Canonical absolute path.
    pub canonical: PathBuf,
    /// The allowed root it lies under (canonical).
    pub allowed_root: PathBuf,
    pub is_dir: bool,
}

/// An `--allow-host-path` directory that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AllowlistError {
    #[error("--allow-host-path {}: {}", .dir.display(), sandbox::error::io_error_text(.source))]
    Io { dir: PathBuf, source: std::io::Error },
    #[error("--allow-host-path {}: not a directory", .0.display())]
    NotADirectory(PathBuf),
}

impl HostAllowlist {
    /// Each directory must exist; it is canonicalized.
    pub fn new(dirs: &[PathBuf]) -> Result<HostAllowlist, AllowlistError> {
        let mut roots = Vec::new();
        for dir in dirs {
            let canonical = std::fs::canonicalize(dir)
                .map_err(|source| AllowlistError::Io { dir: dir.clone(), source })?;
            if !canonical.is_dir() {
                return Err(AllowlistError::NotADirectory(dir.clone()));
            }
            if !roots.contains(&canonical) {
                roots.push(canonical);
            }
        }
        Ok(HostAllowlist { roots })
    }

    #[allow(dead_code)] // for providers
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Resolves `raw` (absolute, or relative to `base_dir`) and checks that
    /// it exists and lies under an allowed root, symlinks resolved.
    pub fn resolve(&self, item: &str, raw: &str, base_dir: &Path) -> Result<HostPath, InputError> {
        let given = Path::new(raw);
        let path = if given.is_absolute() { given.to_path_buf() } else { base_dir.join(given) };
        let canonical = std::fs::canonicalize(&path).map_err(|source| {
            InputError::new(Code::HostPath, item, Cause::HostPath { path: path.clone(), source })
        })?;
        let Some(root) = self.roots.iter().find(|r| canonical.starts_with(r)) else {
            return Err(InputError::new(
                Code::HostPathNotAllowed,
                item,
                Cause::HostPathNotAllowed { path, canonical, roots: self.roots.clone() },
            ));
        };
        let meta = std::fs::metadata(&canonical).map_err(|source| {
            InputError::new(Code::HostPath, item, Cause::HostPathStat { path: canonical.clone(), source })
        })?;
        if !meta.is_dir() && !meta.is_file() {
            return Err(InputError::new(Code::HostPath, item, Cause::HostPathKind { path: canonical }));
        }
        Ok(HostPath { canonical, allowed_root: root.clone(), is_dir: meta.is_dir() })
    }
}

impl HostPath {
    /// Opens the source for reading. It is resolved beneath its allowed
    /// root with no symlink followed, so a component swapped for a link
    /// since the check fails instead of redirecting.
    pub fn open(&self) -> Result<OwnedFd, FsError> {
        let root_flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let root = nix::fcntl::open(&self.allowed_root, root_flags, Mode::empty())
            .map_err(|e| fs_err("open", self.allowed_root.as_os_str().as_bytes(), e))?;
        let rel = self.canonical.strip_prefix(&self.allowed_root).unwrap_or(Path::new(""));
        let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        // O_NONBLOCK: opening a fifo swapped in must not hang.
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        let fd = open(root.as_fd(), rel, flags, Scope::Beneath, Links::Never)
            .map_err(|e| fs_err("openat2", self.canonical.as_os_str().as_bytes(), e))?;
        let st = fstat(&fd).map_err(|e| fs_err("fstat", self.canonical.as_os_str().as_bytes(), e))?;
        let kind = st.st_mode & SFlag::S_IFMT.bits();
        let want = if self.is_dir { SFlag::S_IFDIR } else { SFlag::S_IFREG };
        if kind != want.bits() {
            return Err(fs_err("fstat", self.canonical.as_os_str().as_bytes(), Errno::ESTALE));
        }
        Ok(fd)
    }
}

/// Totals of a copy.
#[derive(Clone, Copy, Debug, Default)]
pub struct Copied {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
}

pub use super::error::CopyError;

/// Permission bits kept on copies: rwx for all classes, no set-id or
/// sticky bits.
const KEEP_BITS: u32 = 0o777;

/// Copies the contents of directory `src` into directory `dst` (both
/// descriptors). Symlinks are recreated with the same target text, never
/// followed; fifos, sockets and devices are refused. Modes keep their
/// permission bits, with the owner always able to read and write.
pub fn copy_tree(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> Result<Copied, CopyError> {
    let mut total = Copied::default();
    let src_top =
        openat(src, c".", fsx::dir_read_flags(), Mode::empty()).map_err(|e| fs_err("openat", ".", e))?;
    let dst_top = openat(dst, c".", OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| fs_err("openat", ".", e))?;
    let names = fsx::list_dir(src_top.as_fd())?;
    // (source dir, destination dir, its relative path, names left to copy)
    let mut stack: Vec<(OwnedFd, OwnedFd, String, Vec<CString>)> =
        vec![(src_top, dst_top, String::new(), names)];
    while let Some(frame) = stack.last_mut() {
        let Some(name) = frame.3.pop() else {
            stack.pop();
            continue;
        };
        let rel = if frame.2.is_empty() {
            name.to_string_lossy().into_owned()
        } else {
            format!("{}/{}", frame.2, name.to_string_lossy())
        };
        let (s, d) = (frame.0.as_fd(), frame.1.as_fd());
        let st = fstatat(s, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| fs_err("fstatat", &rel, e))?;
        let mode = (st.st_mode & KEEP_BITS) | 0o600;
        match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFDIR => {
                mkdirat(d, name.as_c_str(), Mode::from_bits_truncate(mode | 0o100))
                    .map_err(|e| fs_err("mkdirat", &rel, e))?;
                let sub_src = openat(s, name.as_c_str(), fsx::dir_read_flags(), Mode::empty())
                    .map_err(|e| fs_err("openat", &rel, e))?;
                let sub_dst = openat(
                    d,
                    name.as_c_str(),
                    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| fs_err("openat", &rel, e))?;
                let names = fsx::list_dir(sub_src.as_fd())?;
                total.dirs += 1;
                stack.push((sub_src, sub_dst, rel, names));
            }
            SFlag::S_IFREG => {
                let from = openat(
                    s,
                    name.as_c_str(),
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| fs_err("openat", &rel, e))?;
                let mut to =
                    fsx::create_file(d, &name, mode).map_err(|e| FsError { path: rel.clone(), ..e })?;
                let n = std::io::copy(&mut File::from(from), &mut to)
                    .map_err(|e| fs_err("copy", &rel, crate::hostfs::errno_of(&e)))?;
                total.files += 1;
                total.bytes += n;
            }
            SFlag::S_IFLNK => {
                let target = readlinkat(s, name.as_c_str()).map_err(|e| fs_err("readlinkat", &rel, e))?;
                symlinkat(target.as_os_str(), d, name.as_c_str())
                    .map_err(|e| fs_err("symlinkat", &rel, e))?;
                total.symlinks += 1;
            }
            other => {
                let what = match other {
                    SFlag::S_IFIFO => "a fifo",
                    SFlag::S_IFSOCK => "a socket",
                    SFlag::S_IFCHR => "a character device",
                    SFlag::S_IFBLK => "a block device",
                    _ => "a special file",
                };
                return Err(CopyError::Unsupported(format!("{rel} is {what}, which is not copied")));
            }
        }
    }
    Ok(total)
}
