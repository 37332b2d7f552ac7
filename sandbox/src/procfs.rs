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
//! The bind is cloned lazily, from the host's root descriptor that the
//! child keeps until its mount steps are done: a fresh procfs costs nothing
//! more than it did.

use std::ffi::CString;
use std::fmt::Write as _;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use crate::error::{ErrnoText, SpecError};
use crate::mounts::{self, Dirs, Fail};
use crate::prepare::{Kind, cstring};
use crate::report::{NOTICE, Report};
use crate::sys;

/// `/proc` entries covered read-only on a fresh procfs, as bubblewrap does.
const READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus"];
const NOSUID_NODEV_NOEXEC: u64 = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC;

/// How the sandbox gets its `/proc`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcMode {
    /// A fresh procfs, or the sandbox does not start (exit 125).
    Fresh,
    /// The caller's `/proc`, bound recursively and read-only.
    Bind,
    /// Fresh where the kernel allows it, else the bind (with a warning).
    #[default]
    Auto,
}

impl ProcMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcMode::Fresh => "fresh",
            ProcMode::Bind => "bind",
            ProcMode::Auto => "auto",
        }
    }

    pub fn is_auto(&self) -> bool {
        *self == ProcMode::Auto
    }
}

impl std::str::FromStr for ProcMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fresh" => Ok(ProcMode::Fresh),
            "bind" => Ok(ProcMode::Bind),
            "auto" => Ok(ProcMode::Auto),
            _ => Err(format!("{s:?}: expected fresh, bind or auto")),
        }
    }
}

/// The prepared `/proc` step.
pub(crate) struct Prepared {
    mode: ProcMode,
    dst: CString,
    /// Entries of a fresh procfs covered read-only (relative to the new root).
    covers: Vec<CString>,
}

/// The step for `/proc` at `dst_text` (normalized guest path), computed in
/// the launcher.
pub(crate) fn prepare(dst_text: &str, dst: CString, mode: ProcMode) -> Result<Prepared, SpecError> {
    let base = dst_text.trim_start_matches('/');
    let mut covers = Vec::new();
    for entry in READ_ONLY {
        // The sandbox's procfs has an entry exactly when the host's does.
        if Path::new("/proc").join(entry).exists() {
            let rel = if base.is_empty() { entry.to_string() } else { format!("{base}/{entry}") };
            covers.push(cstring("proc path", rel)?);
        }
    }
    if mode == ProcMode::Bind {
        tracing::info!(
            "/proc: the caller's /proc bound read-only (--proc bind): it shows the caller's processes"
        );
    }
    Ok(Prepared { mode, dst, covers })
}

/// In the child: mounts `/proc` as prepared. `host` is the caller's root
/// (where its `/proc` is), `new` the sandbox's; a fallback is announced
/// on `notices` (the report pipe).
pub(crate) fn mount<'a>(
    p: &'a Prepared,
    new: BorrowedFd<'_>,
    host: BorrowedFd<'_>,
    dirs: &mut Dirs,
    notices: RawFd,
) -> Result<(), Fail<'a>> {
    if p.mode != ProcMode::Bind {
        match fresh(p, new, dirs) {
            Ok(()) => return Ok(()),
            // Refused by `mount_too_revealing`: bind the caller's instead.
            Err(f) if p.mode == ProcMode::Auto && f.errno == Errno::EPERM && f.call == "fsmount" => {
                let mut report = Report::new();
                let _ = write!(
                    report,
                    "/proc: a fresh procfs was refused (fsmount(\"proc\") => {}: the outer /proc has masked \
                     or read-only parts, as in containers); the outer /proc is bound read-only instead, so \
                     /proc shows the container's processes (the pid namespace stays private; --proc fresh \
                     refuses this; see docs/troubleshooting.md)",
                    ErrnoText(f.errno)
                );
                report.send(notices, NOTICE);
            }
            Err(f) => return Err(f),
        }
    }
    let attrs = libc::MOUNT_ATTR_RDONLY | NOSUID_NODEV_NOEXEC;
    // Recursive: the outer /proc's masks come along (and the kernel would
    // refuse a copy without its locked submounts).
    let copy = mounts::clone_tree(host, c"proc", libc::RESOLVE_NO_SYMLINKS, attrs)?;
    mounts::attach(copy.as_fd(), new, dirs, &p.dst, Kind::Dir)
}

/// A fresh procfs for the sandbox's pid namespace, with [`READ_ONLY`]
/// covered.
fn fresh<'a>(p: &'a Prepared, new: BorrowedFd<'_>, dirs: &mut Dirs) -> Result<(), Fail<'a>> {
    let fs = sys::fsopen(c"proc").map_err(|e| Fail::new("fsopen", c"proc", e))?;
    sys::fsconfig_set(fs.as_fd(), c"source", Some(c"proc"))
        .map_err(|e| Fail::new("fsconfig", c"source", e))?;
    sys::fsconfig_create(fs.as_fd()).map_err(|e| Fail::new("fsconfig(FSCONFIG_CMD_CREATE)", c"proc", e))?;
    let mnt = sys::fsmount(fs.as_fd(), NOSUID_NODEV_NOEXEC).map_err(|e| Fail::new("fsmount", c"proc", e))?;
    mounts::attach(mnt.as_fd(), new, dirs, &p.dst, Kind::Dir)?;
    for path in &p.covers {
        let ro = libc::MOUNT_ATTR_RDONLY | NOSUID_NODEV_NOEXEC;
        let copy = match mounts::clone_tree(new, path, mounts::RESOLVE_IN_ROOT, ro) {
            Ok(copy) => copy,
            Err(f) if f.errno == Errno::ENOENT && f.call == "openat2" => continue,
            Err(f) => return Err(f),
        };
        mounts::attach(copy.as_fd(), new, dirs, path, Kind::File)?;
    }
    Ok(())
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
}
