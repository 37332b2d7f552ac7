//! `/proc` inside the sandbox: a fresh procfs of its own pid namespace, or,
//! where the kernel refuses one, the caller's `/proc` bound read-only.
//!
//! The kernel mounts a new procfs in a user namespace only if the caller's
//! mount namespace already shows one fully (`mount_too_revealing`: no locked
//! submount may cover anything but a permanently empty directory). Inside
//! docker and podman containers and Kubernetes pods, `/proc` has masked
//! entries (`/proc/kcore`, `/proc/keys`, ...) and read-only parts, so
//! `fsmount("proc")` fails with EPERM. Like crun and podman, the `auto`
//! mode then binds the caller's `/proc` recursively (the container's masks
//! come along) and read-only. The sandbox keeps its own pid namespace, so
//! signals and `kill` reach only its own processes, but `/proc` lists the
//! container's processes (their command lines and status; not their
//! environment, memory, descriptors or root, which the kernel refuses to a
//! process of another user namespace). The launcher says so in one line on
//! stderr (a notice record on the report pipe).
//!
//! This module decides (what to try, when to fall back, what to say); the
//! mount steps themselves are `mounts::proc`. The bind is cloned lazily,
//! from the host's root descriptor the child keeps until its mount steps
//! are done: a fresh procfs costs nothing more than it did.

use std::ffi::{CStr, CString};
use std::fmt::Write as _;
use std::os::fd::RawFd;
use std::path::Path;

use nix::errno::Errno;

use crate::error::{ErrnoText, SpecError};
use crate::report::{NOTICE, Report};
use crate::spec::ProcMode;

/// `/proc` entries covered read-only on a fresh procfs, as bubblewrap does.
const READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus"];
/// Where the caller's `/proc` is, relative to its root.
pub(crate) const OUTER: &CStr = c"proc";
/// Mount attributes of every `/proc` mount.
pub(crate) const ATTRS: u64 = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC;

/// The prepared `/proc` step.
pub(crate) struct Prepared {
    pub mode: ProcMode,
    /// Relative to the new root.
    pub dst: CString,
    /// Entries of a fresh procfs covered read-only (relative to the new root).
    pub covers: Vec<CString>,
    /// Cover only what the sandbox's real ids may write (`access(W_OK)`),
    /// as bubblewrap does: an unprivileged caller's /proc is left without
    /// covers, and a /proc inside it can then be mounted fresh again.
    pub covers_if_writable: bool,
}

/// The step for `/proc` at `dst_text` (normalized guest path), computed in
/// the launcher.
pub(crate) fn prepare(
    dst_text: &str,
    dst: CString,
    mode: ProcMode,
    covers_if_writable: bool,
) -> Result<Prepared, SpecError> {
    let base = dst_text.trim_start_matches('/');
    let mut covers = Vec::new();
    for entry in READ_ONLY {
        // The sandbox's procfs has an entry exactly when the host's does.
        if Path::new("/proc").join(entry).exists() {
            let rel = if base.is_empty() { entry.to_string() } else { format!("{base}/{entry}") };
            covers.push(CString::new(rel).map_err(|_| SpecError::new("proc path contains a NUL byte"))?);
        }
    }
    if mode == ProcMode::Bind {
        tracing::info!(
            "/proc: the caller's /proc bound read-only (--proc bind): it shows the caller's processes"
        );
    }
    Ok(Prepared { mode, dst, covers, covers_if_writable })
}

impl Prepared {
    /// Whether to try a fresh procfs first.
    pub(crate) fn tries_fresh(&self) -> bool {
        !matches!(self.mode, ProcMode::Bind | ProcMode::Caller)
    }

    /// Whether a fresh procfs that failed in `call` with `errno` is answered
    /// with the bind: `auto`, refused by `mount_too_revealing`.
    pub(crate) fn falls_back(&self, call: &str, errno: Errno) -> bool {
        self.mode == ProcMode::Auto && errno == Errno::EPERM && call == "fsmount"
    }
}

/// In the child, when the bind replaces a refused fresh procfs: one notice
/// record on the report pipe, which the launcher logs as a warning.
pub(crate) fn announce_fallback(errno: Errno, notices: RawFd) {
    let mut report = Report::new();
    let _ = write!(
        report,
        "/proc: a fresh procfs was refused (fsmount(\"proc\") => {}: the outer /proc has masked or read-only \
         parts, as in containers); the outer /proc is bound read-only instead, so /proc shows the container's \
         processes (the pid namespace stays private; --proc fresh refuses this; see docs/troubleshooting.md)",
        ErrnoText(errno)
    );
    report.send(notices, NOTICE);
}

/// The hint for a failed `/proc` step.
pub(crate) fn hint(p: &Prepared, errno: Errno) -> Option<&'static str> {
    match (p.mode, errno) {
        (ProcMode::Fresh, Errno::EPERM | Errno::EINVAL) => Some(
            "a fresh /proc cannot be mounted here: the outer /proc has masked or read-only parts (typical in \
             containers); --proc auto binds the outer /proc instead, or give the container an unmasked /proc \
             (docker: --security-opt systempaths=unconfined; Kubernetes: procMount: Unmasked)",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_serialize_lowercase() {
        for mode in [ProcMode::Fresh, ProcMode::Bind, ProcMode::Auto] {
            assert_eq!(mode.as_str().parse::<ProcMode>(), Ok(mode));
            assert_eq!(serde_json::to_string(&mode).unwrap(), format!("\"{}\"", mode.as_str()));
        }
        assert!("FRESH".parse::<ProcMode>().is_err());
        assert_eq!(ProcMode::default(), ProcMode::Auto);
    }

    #[test]
    fn only_auto_falls_back_and_only_when_the_kernel_refuses() {
        let p = |mode| Prepared { mode, dst: c"proc".into(), covers: Vec::new(), covers_if_writable: false };
        assert!(p(ProcMode::Auto).falls_back("fsmount", Errno::EPERM));
        assert!(!p(ProcMode::Auto).falls_back("fsmount", Errno::ENOMEM));
        assert!(!p(ProcMode::Auto).falls_back("move_mount", Errno::EPERM));
        assert!(!p(ProcMode::Fresh).falls_back("fsmount", Errno::EPERM));
        assert!(!p(ProcMode::Bind).tries_fresh() && p(ProcMode::Auto).tries_fresh());
    }
}
