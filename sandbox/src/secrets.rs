//! Host secrets in the system view.
//!
//! The system directories are bound read-only from the host, with their
//! host modes. When the sandbox user maps onto host root (the default for
//! a root caller), every root-owned file looks like *its own* file inside,
//! so `/etc/shadow` (0640 root:shadow) would be readable. So the view hides
//! every entry an unprivileged host user could not read: each is covered by
//! an empty, mode-0, read-only file or directory from the sandbox's private
//! staging tmpfs ([`MountOp::Mask`]).
//!
//! Cost decides the scope: `/etc` is scanned in full on every launch
//! (about 1,500 entries, well under a millisecond when cached), which is
//! where a host's secrets live (shadow, sudoers, ssh host keys, TLS private
//! keys, service credentials). `/usr`, `/lib*` and `/opt` are not scanned:
//! they hold hundreds of thousands of packaged files (a scan takes seconds
//! cold), and packages do not keep secrets there. The well-known secret
//! paths below are masked even when a host made them world-readable.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Masked whenever they exist, whatever their mode.
const ALWAYS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/security/opasswd",
];

/// Directories scanned in full for entries that are not world-readable.
pub const SCANNED: &[&str] = &["/etc"];

/// Masks for the host directories in `bound` (guest path = host path).
pub(crate) fn masks(bound: &[String]) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    let mut add = |path: &Path, dir: bool| {
        if let Some(s) = path.to_str() {
            let dst = s.to_string();
            if !out.iter().any(|(d, _)| *d == dst) {
                out.push((dst, dir));
            }
        }
    };
    let in_view = |p: &str| bound.iter().any(|b| crate::guest_path::is_within(p, b));
    for root in SCANNED {
        if in_view(root) {
            scan(Path::new(root), &mut add);
        }
    }
    for path in ALWAYS {
        if in_view(path)
            && let Ok(meta) = std::fs::symlink_metadata(path)
            && !meta.file_type().is_symlink()
        {
            add(Path::new(path), meta.is_dir());
        }
    }
    if in_view("/etc/ssh")
        && let Ok(entries) = std::fs::read_dir("/etc/ssh")
    {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("ssh_host_") && name.ends_with("key") {
                add(&entry.path(), false);
            }
        }
    }
    out
}

/// World-readable means `o+r` for files, `o+rx` for directories.
fn world_readable(mode: u32, dir: bool) -> bool {
    if dir { mode & 0o005 == 0o005 } else { mode & 0o004 != 0 }
}

fn scan(dir: &Path, add: &mut impl FnMut(&Path, bool)) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        let ft = meta.file_type();
        let mode = meta.permissions().mode();
        if ft.is_dir() {
            if world_readable(mode, true) {
                scan(&entry.path(), add);
            } else {
                add(&entry.path(), true);
            }
        } else if ft.is_file() && !world_readable(mode, false) {
            add(&entry.path(), false);
        }
        // Symlinks point at entries that are checked themselves; sockets,
        // fifos and devices hold no readable content.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert!(world_readable(0o644, false));
        assert!(!world_readable(0o640, false));
        assert!(world_readable(0o755, true));
        assert!(!world_readable(0o750, true));
        assert!(!world_readable(0o711, true));
    }

    #[test]
    fn shadow_is_masked_when_present() {
        let found = masks(&["/etc".to_string()]);
        if Path::new("/etc/shadow").exists() {
            assert!(found.iter().any(|(d, _)| d == "/etc/shadow"), "{found:?}");
        }
        assert!(!found.iter().any(|(d, _)| d == "/etc/passwd"));
        assert!(masks(&[]).is_empty());
    }
}
