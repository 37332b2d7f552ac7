//! A run's artifacts: listing, the required check, download, and bundles.
//!
//! The engine wrote `artifacts/` (and the rest of the workspace) from
//! inside the sandbox, so everything in it is untrusted. All access goes
//! through descriptors: directories are walked with `O_NOFOLLOW`, entries
//! examined with `AT_SYMLINK_NOFOLLOW`, and a single file is resolved with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` relative to its
//! directory's descriptor, so the kernel refuses `..` past it, absolute
//! paths and every symlink. A file is opened for reading only after an
//! `O_PATH` descriptor showed a regular file ([`fsio::open_regular`]): a
//! FIFO, a socket or a device node the engine left is never opened, so it
//! can neither block a request nor reach a driver. Only regular files are
//! listed, served and bundled; symlinks are skipped everywhere (upstream
//! served `artifacts/..%2Fartifacts2/x` through a string-prefix check and
//! packed the targets of symlinks into bundles).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstatat};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::package::ArtifactSpec;
use crate::hostfs::atomic::{AtomicFile, Durability};
use crate::hostfs::beneath::{self as fsio, Links, ReadError};
use crate::hostfs::root as fsx;

/// Most files listed or bundled from one tree.
const MAX_FILES: usize = 20_000;
/// Longest relative path walked: what `openat2` resolves (`PATH_MAX`
/// less the NUL), so every file listed can also be opened by its name.
const MAX_PATH: usize = libc::PATH_MAX as usize - 1;
/// One directory descriptor is kept every this many levels; deeper
/// directories are opened by their path from the nearest kept one. A deep
/// tree costs few descriptors and short lookups.
const CHECKPOINT: usize = 32;

/// A regular file found in a tree: its path relative to the tree and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub rel: String,
    pub size: u64,
}

/// What a walk found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walked {
    /// Regular files, sorted by path.
    pub files: Vec<Found>,
    /// Entries left out because their path is longer than [`MAX_PATH`]
    /// (nothing can open them by name).
    pub too_long: usize,
}

/// Every regular file under `dir`, at any depth, sorted; symlinks and
/// special files skipped, never leaving `dir`. `skip` names top-level
/// entries to leave out. An entry that disappears or changes type while
/// the walk runs (an engine still at work) is skipped.
pub fn walk(dir: BorrowedFd<'_>, skip: &[&str]) -> Result<Walked, Errno> {
    struct Frame {
        rel: String,
        depth: usize,
        /// The directory's descriptor, kept at checkpoint depths.
        kept: Option<OwnedFd>,
        subdirs: Vec<String>,
    }
    let mut out = Walked::default();
    let root = openat(dir, c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let subdirs = scan_dir(root.as_fd(), "", skip, &mut out)?;
    let mut stack = vec![Frame { rel: String::new(), depth: 0, kept: Some(root), subdirs }];
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.subdirs.pop() else {
            stack.pop();
            continue;
        };
        let rel = join(&top.rel, &name);
        let depth = top.depth + 1;
        if rel.len() > MAX_PATH {
            out.too_long += 1;
            continue;
        }
        let (base, base_rel) = stack
            .iter()
            .rev()
            .find_map(|f| f.kept.as_ref().map(|fd| (fd.as_fd(), f.rel.as_str())))
            .expect("the root is kept");
        let from_base = if base_rel.is_empty() { &rel[..] } else { &rel[base_rel.len() + 1..] };
        // O_DIRECTORY: the kernel refuses anything but a directory before
        // opening it, so a FIFO swapped in here cannot block.
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
        let fd = match fsio::open_beneath(base, from_base, flags, Links::Never) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
            Err(e) => return Err(e),
        };
        let subdirs = scan_dir(fd.as_fd(), &rel, &[], &mut out)?;
        let kept = (depth % CHECKPOINT == 0).then_some(fd);
        stack.push(Frame { rel, depth, kept, subdirs });
    }
    out.files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") }
}

/// Records the regular files of the open directory `dir` (at `rel`) and
/// returns the names of its subdirectories.
fn scan_dir(dir: BorrowedFd<'_>, rel: &str, skip: &[&str], out: &mut Walked) -> Result<Vec<String>, Errno> {
    let mut subdirs = Vec::new();
    for name in fsx::list_dir(dir).map_err(|e| e.errno)? {
        let Ok(text) = name.to_str() else { continue };
        if skip.contains(&text) {
            continue;
        }
        let st = match fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        match fsio::file_type(&st) {
            SFlag::S_IFREG => {
                let path = join(rel, text);
                if path.len() > MAX_PATH {
                    out.too_long += 1;
                    continue;
                }
                if out.files.len() >= MAX_FILES {
                    return Err(Errno::EFBIG);
                }
                out.files.push(Found { rel: path, size: st.st_size as u64 });
            }
            SFlag::S_IFDIR => subdirs.push(text.to_string()),
            _ => {}
        }
    }
    Ok(subdirs)
}

/// The regular files of `dir` for a listing or a bundle; what cannot be
/// listed is logged, not hidden.
fn walk_logged(dir: BorrowedFd<'_>, skip: &[&str], what: &str) -> Result<Vec<Found>, Errno> {
    let walked = walk(dir, skip).inspect_err(|e| tracing::warn!("listing {what}: {e}"))?;
    if walked.too_long > 0 {
        tracing::warn!(
            "listing {what}: {} entries left out, their paths are longer than {MAX_PATH} bytes",
            walked.too_long
        );
    }
    Ok(walked.files)
}

/// Opens the run's `artifacts/` directory (not following a symlink there).
pub fn open_artifacts_dir(workspace: &Path) -> Result<OwnedFd, Errno> {
    let ws = fsio::open_dir(workspace).map_err(|e| crate::hostfs::errno_of(&e))?;
    fsio::open_beneath(
        ws.as_fd(),
        "artifacts",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
        Links::Never,
    )
}

/// The run-relative paths (`artifacts/<rel>`) of every regular file.
pub fn list(workspace: &Path) -> Vec<String> {
    let Ok(dir) = open_artifacts_dir(workspace) else { return Vec::new() };
    walk_logged(dir.as_fd(), &[], "artifacts")
        .unwrap_or_default()
        .into_iter()
        .map(|f| format!("artifacts/{}", f.rel))
        .collect()
}

/// Required artifacts that are not a regular file at `artifacts/<pattern>`.
pub fn missing_required(workspace: &Path, specs: &[ArtifactSpec]) -> Vec<String> {
    let dir = open_artifacts_dir(workspace).ok();
    specs
        .iter()
        .filter(|a| a.required)
        .filter(|a| {
            dir.as_ref().is_none_or(|d| !fsio::is_regular_beneath(d.as_fd(), &a.pattern, Links::Never))
        })
        .map(|a| a.pattern.clone())
        .collect()
}

/// Opens the regular file `rel` beneath `dir`, following no symlink and
/// opening nothing but a regular file.
pub fn open_regular(dir: BorrowedFd<'_>, rel: &str) -> Result<(File, u64), ReadError> {
    let (file, st) = fsio::open_regular(dir, rel, Links::Never)?;
    Ok((file, st.st_size as u64))
}

/// Why a download was refused; the HTTP layer maps these to upstream's
/// status codes and messages.
#[derive(Debug, PartialEq, Eq)]
pub enum DownloadError {
    /// 400 "Artifact path is required"
    Empty,
    /// 400 "Invalid artifact path"
    Invalid,
    /// 404 "Artifact not found"
    NotFound,
}

/// Opens `artifact_path` (`artifacts/<rel>`, already percent-decoded) for
/// download: the file, its size, and its base name.
pub fn open_for_download(
    workspace: &Path,
    artifact_path: &str,
) -> Result<(File, u64, String), DownloadError> {
    if artifact_path.is_empty() {
        return Err(DownloadError::Empty);
    }
    let Some(rel) = artifact_path.strip_prefix("artifacts/") else {
        return Err(DownloadError::NotFound);
    };
    // Refused by shape before the kernel is asked: absolute, `..`, NUL.
    if rel.starts_with('/') || rel.contains('\0') || rel.split('/').any(|c| c == "..") {
        return Err(DownloadError::Invalid);
    }
    let dir = open_artifacts_dir(workspace).map_err(|_| DownloadError::NotFound)?;
    match open_regular(dir.as_fd(), rel) {
        Ok((file, size)) => {
            let name = rel.rsplit('/').next().unwrap_or(rel).to_string();
            Ok((file, size, name))
        }
        // Escapes and symlinks, whatever the kernel saw.
        Err(ReadError::Open(Errno::EXDEV | Errno::ELOOP)) => Err(DownloadError::Invalid),
        Err(_) => Err(DownloadError::NotFound),
    }
}

/// Which bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BundleKind {
    /// `result/result.json`, `artifacts/**`, `bundle/manifest.json`.
    Normal,
    /// Upstream's run directory: the engine's workspace at the top
    /// (`artifacts/`, `uploads/`, its own files), the server's files
    /// (`input.json`, `status.json`, `logs/`, `result/`), never the
    /// engine's home; then `bundle/manifest_debug.json`.
    Debug,
}

impl BundleKind {
    pub fn file_name(self) -> &'static str {
        match self {
            BundleKind::Normal => "run_bundle.zip",
            BundleKind::Debug => "run_bundle_debug.zip",
        }
    }

    fn manifest_name(self) -> &'static str {
        match self {
            BundleKind::Normal => "bundle/manifest.json",
            BundleKind::Debug => "bundle/manifest_debug.json",
        }
    }
}

/// A debug bundle's files, by name.
///
/// Upstream's engine works in the run directory itself, so its files sit
/// at the top next to the server's. Here the engine's workspace is put at
/// the top; where it wrote a file of the same name as one of the
/// server's, the server's is bundled, and its `bundle/` is left out as
/// upstream leaves `bundle/` out.
fn debug_files<'a>(
    run: BorrowedFd<'a>,
    workspace: Option<BorrowedFd<'a>>,
    made: &[(&str, &'a [u8])],
) -> std::io::Result<Vec<(String, Source<'a>)>> {
    let io = |e: Errno| std::io::Error::from_raw_os_error(e as i32);
    let mut by_name: BTreeMap<String, Source<'_>> = BTreeMap::new();
    if let Some(ws) = workspace {
        for f in walk_logged(ws, &["bundle"], "the workspace").map_err(io)? {
            by_name.insert(f.rel.clone(), Source::File(ws, f.rel));
        }
    }
    let server_side = ["bundle", "home", "workspace"];
    for f in walk_logged(run, &server_side, "the run directory").map_err(io)? {
        by_name.insert(f.rel.clone(), Source::File(run, f.rel));
    }
    for (name, bytes) in made {
        by_name.insert(name.to_string(), Source::Bytes(bytes));
    }
    Ok(by_name.into_iter().collect())
}

/// Where the bytes of a bundled file come from.
enum Source<'a> {
    /// A regular file beneath a directory descriptor.
    File(BorrowedFd<'a>, String),
    /// Bytes the server made for the bundle.
    Bytes(&'a [u8]),
}

/// The bundle of the run in `run_dir`, built on first use and kept in
/// `run_dir/bundle/`. `made` are files the server writes into a debug
/// bundle (`status.json`). Built into a temporary file and renamed, so a
/// reader never sees half a bundle.
pub fn bundle(
    run_dir: &Path,
    kind: BundleKind,
    made: &[(&str, &[u8])],
) -> std::io::Result<std::path::PathBuf> {
    let bundle_dir = run_dir.join("bundle");
    let target = bundle_dir.join(kind.file_name());
    if target.is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(&bundle_dir)?;
    let io = |e: Errno| std::io::Error::from_raw_os_error(e as i32);
    let run = fsio::open_dir(run_dir)?;
    let workspace = fsio::open_dir(&run_dir.join("workspace")).ok();
    let art = open_artifacts_dir(&run_dir.join("workspace")).ok();
    let mut files: Vec<(String, Source<'_>)> = Vec::new();
    match kind {
        BundleKind::Normal => {
            files.push(("result/result.json".into(), Source::File(run.as_fd(), "result/result.json".into())));
            if let Some(art) = &art {
                for f in walk_logged(art.as_fd(), &[], "artifacts").map_err(io)? {
                    files.push((format!("artifacts/{}", f.rel), Source::File(art.as_fd(), f.rel)));
                }
            }
        }
        BundleKind::Debug => files = debug_files(run.as_fd(), workspace.as_ref().map(AsFd::as_fd), made)?,
    }
    let tmp = AtomicFile::new_in(&bundle_dir, ".tmp-")?;
    let mut zip = zip::ZipWriter::new(tmp.file.try_clone()?);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    let mut manifest = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    for (name, source) in files {
        let mut reader: Box<dyn Read> = match source {
            Source::Bytes(bytes) => Box::new(bytes),
            // Gone or no longer a regular file (the result of a run that
            // failed before it ran, say): not bundled.
            Source::File(dir, rel) => match open_regular(dir, &rel) {
                Ok((file, _)) => Box::new(file),
                Err(_) => continue,
            },
        };
        zip.start_file(name.as_str(), options).map_err(std::io::Error::other)?;
        let (mut hasher, mut size) = (Sha256::new(), 0u64);
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            zip.write_all(&buf[..n])?;
            size += n as u64;
        }
        manifest.push(json!({"path": name, "size": size, "sha256": hex::encode(hasher.finalize())}));
    }
    let manifest = serde_json::to_vec_pretty(&json!({"files": Value::Array(manifest)})).expect("plain data");
    zip.start_file(kind.manifest_name(), options).map_err(std::io::Error::other)?;
    zip.write_all(&manifest)?;
    zip.finish().map_err(std::io::Error::other)?;
    tmp.commit(&target, Durability::Synced)?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Creates `depth` nested directories `name` under `root`, one
    /// `mkdirat` relative to the last (so past PATH_MAX too), and returns
    /// the deepest one's descriptor.
    fn nest(root: BorrowedFd<'_>, name: &std::ffi::CStr, depth: usize) -> OwnedFd {
        let mut fd = openat(root, c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..depth {
            nix::sys::stat::mkdirat(fd.as_fd(), name, Mode::from_bits_truncate(0o755)).unwrap();
            fd = openat(fd.as_fd(), name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        }
        fd
    }

    fn touch(dir: BorrowedFd<'_>, name: &std::ffi::CStr) {
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
        openat(dir, name, flags, Mode::from_bits_truncate(0o644)).unwrap();
    }

    #[test]
    fn walks_deep_trees_and_counts_what_no_path_reaches() {
        let tmp = tempfile::tempdir().unwrap();
        let root = fsio::open_dir(tmp.path()).unwrap();
        // Past several checkpoints, well within PATH_MAX.
        let deep = nest(root.as_fd(), c"d", 3 * CHECKPOINT + 5);
        touch(deep.as_fd(), c"deep.txt");
        // 21 levels of a 200-byte name are past PATH_MAX.
        let long = std::ffi::CString::new("x".repeat(200)).unwrap();
        let too_deep = nest(root.as_fd(), &long, 21);
        touch(too_deep.as_fd(), c"lost.txt");
        touch(root.as_fd(), c"top.txt");
        nix::unistd::mkfifo(&tmp.path().join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        std::os::unix::fs::symlink("top.txt", tmp.path().join("link")).unwrap();

        let walked = walk(root.as_fd(), &[]).unwrap();
        let names: Vec<&str> = walked.files.iter().map(|f| f.rel.as_str()).collect();
        let deep_rel = format!("{}/deep.txt", vec!["d"; 3 * CHECKPOINT + 5].join("/"));
        assert_eq!(names, [deep_rel.as_str(), "top.txt"]);
        assert_eq!(walked.too_long, 1);
        assert!(walk(root.as_fd(), &["d", "top.txt"]).unwrap().files.is_empty());
    }
}
