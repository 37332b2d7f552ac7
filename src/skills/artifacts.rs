//! A run's artifacts: listing, the required check, download, and bundles.
//!
//! The engine wrote `artifacts/` from inside the sandbox, so everything in
//! it is untrusted. All access goes through descriptors: directories are
//! walked with `O_NOFOLLOW`, entries examined with `AT_SYMLINK_NOFOLLOW`,
//! and a single artifact is opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` relative to the `artifacts/` descriptor, so the
//! kernel refuses `..` past it, absolute paths and every symlink. Only
//! regular files are listed, served and bundled; symlinks are skipped
//! everywhere (upstream served `artifacts/..%2Fartifacts2/x` through a
//! string-prefix check and packed the targets of symlinks into bundles).

use std::ffi::CStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstat, fstatat};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::fsio::{self, Links};
use super::package::ArtifactSpec;

/// Deepest directory nesting walked.
const MAX_DEPTH: usize = 32;
/// Most files listed or bundled from one tree.
const MAX_FILES: usize = 20_000;

/// A regular file found in a tree: its path relative to the tree and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub rel: String,
    pub size: u64,
}

/// Every regular file under `dir`, sorted, symlinks and special files
/// skipped, never leaving `dir`. `skip` names top-level entries to leave out.
pub fn walk(dir: BorrowedFd<'_>, skip: &[&str]) -> Result<Vec<Found>, Errno> {
    let mut out = Vec::new();
    walk_into(dir, "", 0, skip, &mut out)?;
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

fn walk_into(
    dir: BorrowedFd<'_>,
    prefix: &str,
    depth: usize,
    skip: &[&str],
    out: &mut Vec<Found>,
) -> Result<(), Errno> {
    let fd = openat(dir, c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut d = nix::dir::Dir::from_fd(fd)?;
    let mut names: Vec<std::ffi::CString> = Vec::new();
    for entry in d.iter() {
        let name = entry?.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            names.push(name);
        }
    }
    for name in names {
        let Ok(text) = name.to_str() else { continue };
        if depth == 0 && skip.contains(&text) {
            continue;
        }
        let st = match fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        let rel = if prefix.is_empty() { text.to_string() } else { format!("{prefix}/{text}") };
        match fsio::file_type(&st) {
            SFlag::S_IFREG => {
                if out.len() >= MAX_FILES {
                    return Err(Errno::EFBIG);
                }
                out.push(Found { rel, size: st.st_size as u64 });
            }
            SFlag::S_IFDIR if depth < MAX_DEPTH => {
                let sub = open_subdir(dir, name.as_c_str())?;
                walk_into(sub.as_fd(), &rel, depth + 1, skip, out)?;
            }
            _ => {}
        }
    }
    Ok(())
}

fn open_subdir(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Opens the run's `artifacts/` directory (not following a symlink there).
pub fn open_artifacts_dir(workspace: &Path) -> Result<OwnedFd, Errno> {
    let ws = fsio::open_dir(workspace).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
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
    walk(dir.as_fd(), &[]).unwrap_or_default().into_iter().map(|f| format!("artifacts/{}", f.rel)).collect()
}

/// Required artifacts that are not a regular file at `artifacts/<pattern>`.
pub fn missing_required(workspace: &Path, specs: &[ArtifactSpec]) -> Vec<String> {
    let dir = open_artifacts_dir(workspace).ok();
    specs
        .iter()
        .filter(|a| a.required)
        .filter(|a| dir.as_ref().is_none_or(|d| open_regular(d.as_fd(), &a.pattern).is_err()))
        .map(|a| a.pattern.clone())
        .collect()
}

/// Opens the regular file `rel` beneath `dir`, following no symlink.
pub fn open_regular(dir: BorrowedFd<'_>, rel: &str) -> Result<(File, u64), Errno> {
    let fd = fsio::open_beneath(dir, rel, OFlag::O_RDONLY | OFlag::O_NOFOLLOW, Links::Never)?;
    let st = fstat(fd.as_fd())?;
    if fsio::file_type(&st) != SFlag::S_IFREG {
        return Err(Errno::EISDIR);
    }
    Ok((File::from(fd), st.st_size as u64))
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
        Err(Errno::EXDEV | Errno::ELOOP) => Err(DownloadError::Invalid),
        Err(_) => Err(DownloadError::NotFound),
    }
}

/// Which bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BundleKind {
    /// `result/result.json`, `artifacts/**`, `bundle/manifest.json`.
    Normal,
    /// Every regular file of the run directory but `bundle/` and the
    /// engine's home, plus `bundle/manifest_debug.json`.
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

/// The bundle of the run in `run_dir`, built on first use and kept in
/// `run_dir/bundle/`. Built into a temporary file and renamed, so a reader
/// never sees half a bundle.
pub fn bundle(run_dir: &Path, kind: BundleKind) -> std::io::Result<std::path::PathBuf> {
    let bundle_dir = run_dir.join("bundle");
    let target = bundle_dir.join(kind.file_name());
    if target.is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(&bundle_dir)?;
    let run = fsio::open_dir(run_dir)?;
    let io = |e: Errno| std::io::Error::from_raw_os_error(e as i32);
    let art = open_artifacts_dir(&run_dir.join("workspace")).ok();
    let mut files: Vec<(String, BorrowedFd<'_>, String)> = Vec::new();
    match kind {
        BundleKind::Normal => {
            files.push(("result/result.json".into(), run.as_fd(), "result/result.json".into()));
            if let Some(art) = &art {
                for f in walk(art.as_fd(), &[]).map_err(io)? {
                    files.push((format!("artifacts/{}", f.rel), art.as_fd(), f.rel));
                }
            }
        }
        BundleKind::Debug => {
            for f in walk(run.as_fd(), &["bundle", "home"]).map_err(io)? {
                files.push((f.rel.clone(), run.as_fd(), f.rel));
            }
        }
    }
    let tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(&bundle_dir)?;
    let mut zip = zip::ZipWriter::new(tmp.as_file().try_clone()?);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    let mut manifest = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    for (name, dir, rel) in files {
        // The result file may not exist (a run that failed before it ran).
        let Ok((mut file, _)) = open_regular(dir, &rel) else { continue };
        zip.start_file(name.as_str(), options).map_err(std::io::Error::other)?;
        let (mut hasher, mut size) = (Sha256::new(), 0u64);
        loop {
            let n = file.read(&mut buf)?;
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
    tmp.as_file().sync_data()?;
    tmp.persist(&target).map_err(|e| e.error)?;
    Ok(target)
}
