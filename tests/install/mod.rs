//! Installs the three binaries (`tuixiu-sandbox` and the two it `exec`s,
//! `tuixiu-sandbox-full` and `tuixiu-sandbox-proxy`) side by side in a
//! world-readable directory,
//! because the checkout (e.g. under /root) may not be reachable for the
//! unprivileged callers the tests switch to. One directory per checkout
//! (keyed on the manifest directory) is shared by all test binaries; a new
//! build replaces the binaries in it (each renamed over the old one, so a
//! process still running the old build keeps its inode), so repeated builds
//! do not leave a half-gigabyte copy behind each time.

#![allow(dead_code)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The installed launcher (`…/tuixiu-sandbox`), with the full tool and the
/// daemon next to it.
pub fn launcher() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let launcher = Path::new(env!("CARGO_BIN_EXE_tuixiu-sandbox"));
        let full = Path::new(env!("CARGO_BIN_EXE_tuixiu-sandbox-full"));
        let daemon = Path::new(env!("CARGO_BIN_EXE_tuixiu-sandbox-proxy"));
        let key: Vec<String> = [launcher, full, daemon]
            .iter()
            .map(|p| std::fs::metadata(p).unwrap())
            .map(|m| format!("{:x}-{:x}", m.size(), m.mtime_nsec() ^ m.mtime()))
            .collect();
        let key = key.join("-");
        let checkout = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            env!("CARGO_MANIFEST_DIR").hash(&mut h);
            h.finish()
        };
        let dir = std::env::temp_dir().join(format!("tuixiu-sandbox-test-bin-{checkout:016x}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let stamp = dir.join(".build");
        if std::fs::read_to_string(&stamp).ok().as_deref() != Some(key.as_str()) {
            // Copy under a private name, then rename over the old build:
            // another test binary may be installing the same build
            // concurrently, and one of an older build may still run.
            let private = |name: &std::ffi::OsStr| {
                dir.join(format!(".{}.{}", name.to_string_lossy(), std::process::id()))
            };
            for src in [full, daemon, launcher] {
                let tmp = private(src.file_name().unwrap());
                std::fs::copy(src, &tmp).unwrap();
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
                std::fs::rename(&tmp, dir.join(src.file_name().unwrap())).unwrap();
            }
            let tmp = private(std::ffi::OsStr::new("build"));
            std::fs::write(&tmp, &key).unwrap();
            std::fs::rename(&tmp, &stamp).unwrap();
        }
        dir.join("tuixiu-sandbox")
    })
}
