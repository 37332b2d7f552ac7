//! Installs the three binaries (`tuixiu-sandbox` and the two it `exec`s,
//! `tuixiu-sandbox-full` and `tuixiu-sandbox-proxy`) side by side in a
//! world-readable directory,
//! because the checkout (e.g. under /root) may not be reachable for the
//! unprivileged callers the tests switch to. One directory per build (keyed
//! on the binaries' size and mtime) is shared by all test binaries, so
//! repeated runs do not leave a copy behind each time.

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
        let dir = std::env::temp_dir().join(format!("tuixiu-sandbox-test-bin-{}", key.join("-")));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for src in [full, daemon, launcher] {
            let dst = dir.join(src.file_name().unwrap());
            if !dst.exists() {
                // Copy under a private name, then rename: another test
                // binary may be installing the same build concurrently.
                let tmp = dir.join(format!(
                    ".{}.{}",
                    src.file_name().unwrap().to_string_lossy(),
                    std::process::id()
                ));
                std::fs::copy(src, &tmp).unwrap();
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
                std::fs::rename(&tmp, &dst).unwrap();
            }
        }
        dir.join("tuixiu-sandbox")
    })
}
