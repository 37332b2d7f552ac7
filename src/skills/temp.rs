//! Temporary skill runs (upstream's `/v1/temp-skill-runs`): the client
//! uploads the skill package with the run instead of naming an installed
//! one. Off unless the server is started with `--temp-skills`, since the
//! package then comes from the client: its `SKILL.md` tells the engine
//! what to do, with the engines' credentials and network.
//!
//! The package is a zip with exactly one top-level directory, the skill
//! id. It is extracted by the project's one safe zip extractor (no `..`,
//! absolute names, links or special files; size and entry caps) into a
//! private staging directory, checked whole by [`package::load`] (the
//! same checks and messages as an installed package, the identity of
//! directory, `runner.json` id and `SKILL.md` name included), and only
//! then renamed to `requests/<request_id>/skill/`. The run shows it
//! read-only at `/skill` like an installed package.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::artifacts;
use super::package::{self, Skill};
use crate::hostfs::beneath as fsio;
use crate::inputs::zip::{ZipError, ZipLimits, extract};

/// macOS archivers add this top-level directory; upstream ignores it.
const MACOS_METADATA: &str = "__MACOSX";

/// Why a package was refused: a client error (400) or the server's (500).
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{0}")]
    Invalid(String),
    #[error("cannot store the skill package: {0}")]
    Io(String),
}

/// Where the staged package of request `request_dir` lives.
pub fn package_root(request_dir: &Path) -> PathBuf {
    request_dir.join("skill")
}

/// The staged package directory of a request whose skill is `skill_id`.
pub fn package_dir(request_dir: &Path, skill_id: &str) -> PathBuf {
    package_root(request_dir).join(skill_id)
}

/// Extracts and checks the package `archive` for the request in
/// `request_dir`, replacing what an earlier upload staged. `engines` is
/// every engine the server knows.
pub fn stage(
    request_dir: &Path,
    archive: &std::fs::File,
    limits: &ZipLimits,
    engines: &[String],
) -> Result<Skill, StageError> {
    let io = |e: std::io::Error| StageError::Io(sandbox::error::io_error_text(&e));
    std::fs::create_dir_all(request_dir).map_err(io)?;
    let (staging, top) = unpack(request_dir, archive, limits)?;
    // In place: the package, and nothing else, under skill/; then checked
    // whole where it will be used.
    let root = package_root(request_dir);
    if root.exists() {
        std::fs::remove_dir_all(&root).map_err(io)?;
    }
    std::fs::create_dir(&root).map_err(io)?;
    std::fs::rename(staging.path().join(&top), root.join(&top)).map_err(io)?;
    package::load(&root.join(&top), engines).map_err(|e| {
        let _ = std::fs::remove_dir_all(&root);
        StageError::Invalid(e.0)
    })
}

/// Extracts the package `archive` into a fresh private directory under
/// `parent`: the directory (removed when dropped) and the name of the
/// package's one top-level directory in it.
pub fn unpack(
    parent: &Path,
    archive: &std::fs::File,
    limits: &ZipLimits,
) -> Result<(tempfile::TempDir, String), StageError> {
    let io = |e: std::io::Error| StageError::Io(sandbox::error::io_error_text(&e));
    let staging = tempfile::Builder::new().prefix(".skill-").tempdir_in(parent).map_err(io)?;
    let dir = fsio::open_dir(staging.path()).map_err(io)?;
    extract(archive, dir.as_fd(), limits).map_err(|e| match e {
        ZipError::Fs(e) => StageError::Io(e.to_string()),
        e => StageError::Invalid(format!("Invalid zip package: {e}")),
    })?;
    let walked =
        artifacts::walk(dir.as_fd(), &[MACOS_METADATA]).map_err(|e| StageError::Io(e.to_string()))?;
    if walked.too_long > 0 {
        return Err(StageError::Invalid(format!(
            "Invalid zip package: an entry's path is longer than {} bytes",
            libc::PATH_MAX - 1
        )));
    }
    let mut tops: Vec<&str> =
        walked.files.iter().map(|f| f.rel.split('/').next().unwrap_or_default()).collect();
    tops.dedup();
    match tops.as_slice() {
        [top] if walked.files.iter().all(|f| f.rel.contains('/')) => {
            let top = top.to_string();
            Ok((staging, top))
        }
        _ => Err(StageError::Invalid("Skill package must contain exactly one top-level directory".into())),
    }
}

/// Loads the staged package of a temporary run again (after a restart).
pub fn load(request_dir: &Path, skill_id: &str, engines: &[String]) -> Result<Skill, LoadError> {
    package::load(&package_dir(request_dir, skill_id), engines).map_err(LoadError)
}

/// The staged package of a temporary run no longer loads.
#[derive(Debug, thiserror::Error)]
#[error("the temporary skill package of this run: {0}")]
pub struct LoadError(pub package::PackageError);
