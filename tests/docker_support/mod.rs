//! Helpers for the tests that need a real Docker Engine and the test image
//! (both provided by scripts/ci-setup.d/20-docker.sh). Without an engine
//! these tests fail: they never skip.

#![allow(dead_code)]

use std::os::unix::fs::{PermissionsExt, chown};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The image the tests run (a static busybox, imported locally).
pub fn image() -> String {
    std::env::var("TUIXIU_TEST_DOCKER_IMAGE").unwrap_or_else(|_| "tuixiu-test/busybox:latest".into())
}

/// `docker ARGS`, waited for.
pub fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).stdin(Stdio::null()).output().expect("run the docker CLI")
}

/// Fails the test unless an engine answers and the test image exists.
pub fn require_engine() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        let info = Command::new("docker").args(["info", "--format", "{{.ServerVersion}}"]).output();
        match info {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Err(format!(
                    "no Docker Engine answers `docker info` ({}); these tests need one: \
                     source scripts/ci-setup.d/20-docker.sh (as scripts/test.sh does)",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Err(e) => return Err(format!("the docker CLI cannot run ({e}): install docker.io")),
        }
        if !docker(&["image", "inspect", &image()]).status.success() {
            return Err(format!(
                "the test image {} is missing: scripts/ci-setup.d/20-docker.sh builds it",
                image()
            ));
        }
        Ok(())
    });
    if let Err(message) = checked {
        panic!("{message}");
    }
}

/// A unique instance name with the default prefix.
pub fn unique_name(label: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("tuixiu-run-t{}-{}-{label}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Scratch directories for one test: a state dir, a workspace and a home
/// owned by the container user (1000), and the containers to remove.
pub struct Scratch {
    pub dir: PathBuf,
    pub state: PathBuf,
    pub workspace: PathBuf,
    pub home: PathBuf,
    containers: std::sync::Mutex<Vec<String>>,
}

impl Scratch {
    pub fn new(label: &str) -> Scratch {
        require_engine();
        let dir = std::env::temp_dir().join(format!("tuixiu-docker-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let state = dir.join("state");
        let workspace = dir.join("workspace");
        let home = dir.join("home");
        for d in [&state, &workspace, &home] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for d in [&workspace, &home] {
            chown(d, Some(1000), Some(1000)).unwrap();
        }
        Scratch { dir, state, workspace, home, containers: Default::default() }
    }

    /// Remembers a container name to remove at the end.
    pub fn track(&self, name: &str) -> String {
        self.containers.lock().unwrap().push(name.to_string());
        name.to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for name in self.containers.lock().unwrap().iter() {
            let _ = docker(&["rm", "-f", name]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `docker inspect --format FORMAT NAME` as text.
pub fn inspect_format(name: &str, format: &str) -> String {
    let out = docker(&["inspect", "--format", format, name]);
    assert!(out.status.success(), "docker inspect {name:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A container booted with systemd as PID 1 (deploy/systemd/check-hardening.sh
/// `boot`, scripts/deb-test.sh `boot`); removed when dropped.
pub struct Booted(pub String);

impl Booted {
    /// `docker exec NAME ARGS...`, waited for.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut all = vec!["exec", self.0.as_str()];
        all.extend_from_slice(args);
        docker(&all)
    }

    /// `systemctl start tuixiu-sandbox`, asserted.
    pub fn start_service(&self) {
        let start = self.exec(&["systemctl", "start", "tuixiu-sandbox"]);
        let stderr = String::from_utf8_lossy(&start.stderr).into_owned();
        assert!(start.status.success(), "systemctl start: {stderr}\n{}", self.journal());
    }

    /// The journal of tuixiu-sandbox.service, messages only.
    pub fn journal(&self) -> String {
        String::from_utf8_lossy(
            &self.exec(&["journalctl", "-u", "tuixiu-sandbox", "-o", "cat", "--no-pager"]).stdout,
        )
        .into_owned()
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.0]);
    }
}
