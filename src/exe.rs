//! The tool's binaries and where they are: the small launcher, the full
//! tool and the daemon are installed side by side. Below `launcher` and
//! `provider`, which both start the launcher (`__exec`).

use std::path::PathBuf;

/// File name of the small launcher binary.
pub const LAUNCHER_NAME: &str = "tuixiu-sandbox";
/// File name of the full tool, installed next to the launcher.
pub const FULL_NAME: &str = "tuixiu-sandbox-full";
/// File name of the daemon's own binary (`proxy`), installed next to it.
pub const DAEMON_NAME: &str = "tuixiu-sandbox-proxy";

/// `name` next to the running executable.
pub(crate) fn sibling(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join(name))
}

/// The running executable could not be located (`/proc/self/exe`), so
/// neither could its siblings.
#[derive(Debug, thiserror::Error)]
#[error("cannot locate this executable (is /proc mounted?)")]
pub struct NotLocated;

/// The full tool, next to the running executable.
pub fn full_exe() -> Result<PathBuf, NotLocated> {
    sibling(FULL_NAME).ok_or(NotLocated)
}

/// The fast launcher for `__exec`: the small binary next to this one when
/// it is there, else this executable (which handles `__exec` too).
pub fn launcher_exe() -> std::io::Result<PathBuf> {
    match sibling(LAUNCHER_NAME) {
        Some(path) if is_executable(&path) => Ok(path),
        _ => std::env::current_exe(),
    }
}

pub(crate) fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
