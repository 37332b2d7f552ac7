//! Shared fixtures for the integration tests: run the real binary as each
//! kind of caller the product supports.
//!
//! * `Caller::Root`: the test process itself (CI runs as root).
//! * `Caller::Unprivileged`: `setpriv --reuid 65534 --regid 65534 --clear-groups`.
//! * `Caller::Nested`: an unprivileged user inside `unshare -U -r`, as CI
//!   systems that run jobs in user namespaces do.
//!
//! The binary is copied once to a world-readable directory, because the
//! checkout (e.g. under /root) may not be reachable for uid 65534.

#![allow(dead_code)]

#[path = "../install/mod.rs"]
mod install;

use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

pub const NOBODY: u32 = 65534;
/// A variable set in the caller's environment that must never reach a sandbox.
pub const LEAK_MARKER: (&str, &str) = ("TUIXIU_TEST_LEAK_MARKER", "must-not-leak-7f3a");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    Root,
    Unprivileged,
    Nested,
}

impl Caller {
    /// The host uid that files written by the sandbox user end up owned by.
    pub fn host_uid(self) -> u32 {
        match self {
            Caller::Root => 0,
            Caller::Unprivileged | Caller::Nested => NOBODY,
        }
    }

    /// Wraps `program args` so it runs as this caller.
    pub fn command(self, program: &Path, args: &[&str]) -> Command {
        let mut cmd = match self {
            Caller::Root => Command::new(program),
            Caller::Unprivileged => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"]).arg(program);
                c
            }
            Caller::Nested => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "unshare", "-U", "-r"])
                    .arg(program);
                c
            }
        };
        cmd.args(args);
        cmd.env_clear();
        cmd.env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        cmd.env(LEAK_MARKER.0, LEAK_MARKER.1);
        cmd
    }
}

/// Fails loudly if the suite is not run as root: it needs root to act as
/// the other callers (CI runs it as root; see README).
pub fn require_root() {
    let euid = nix::unistd::geteuid().as_raw();
    assert_eq!(
        euid, 0,
        "the integration tests must run as root (they switch to uid 65534 and nest user namespaces)"
    );
}

/// The `tuixiu-sandbox` launcher, installed where every caller can execute
/// it, with `tuixiu-sandbox-full` next to it.
pub fn binary() -> &'static Path {
    install::launcher()
}

/// A scratch directory with a workspace and a home, owned by the caller.
pub struct Fixture {
    pub caller: Caller,
    pub dir: PathBuf,
    pub workspace: PathBuf,
    pub home: PathBuf,
}

impl Fixture {
    pub fn new(caller: Caller) -> Fixture {
        require_root();
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tuixiu-sandbox-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let workspace = dir.join("workspace");
        let home = dir.join("home");
        for d in [&workspace, &home] {
            std::fs::create_dir(d).unwrap();
            chown(d, Some(caller.host_uid()), Some(caller.host_uid())).unwrap();
        }
        Fixture { caller, dir, workspace, home }
    }

    /// `tuixiu-sandbox ARGS...` as this fixture's caller, from the fixture dir.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.caller.command(binary(), args);
        cmd.current_dir(&self.dir);
        cmd.stdin(Stdio::null());
        cmd
    }

    /// `tuixiu-sandbox run --workspace WS EXTRA... -- COMMAND...`, waited for.
    pub fn run(&self, extra: &[&str], command: &[&str]) -> Output {
        let ws = self.workspace.to_str().unwrap().to_string();
        let mut args = vec!["run", "--workspace", ws.as_str()];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(command);
        self.command(&args).output().unwrap()
    }

    /// Runs `sh -c SCRIPT` in the sandbox and returns stdout, asserting success.
    pub fn sh(&self, extra: &[&str], script: &str) -> String {
        let out = self.run(extra, &["sh", "-c", script]);
        assert!(
            out.status.success(),
            "sandbox failed ({:?}): stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Stderr as text, for assertions.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Declares one test per caller: `mod NAME { fn root(); fn unprivileged(); fn nested(); }`.
#[macro_export]
macro_rules! for_each_caller {
    ($name:ident, $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn root() {
                ($body)($crate::common::Caller::Root)
            }
            #[test]
            fn unprivileged() {
                ($body)($crate::common::Caller::Unprivileged)
            }
            #[test]
            fn nested() {
                ($body)($crate::common::Caller::Nested)
            }
        }
    };
}

/// A sandbox started in the background with `--json-status-fd`: the
/// launcher's pid and the host pid of the sandbox's PID 1. Killed on drop.
pub struct Started {
    pub child: std::process::Child,
    /// The launcher (the shell wrapper execs it, so it keeps the pid).
    pub launcher: u32,
    pub pid1: u32,
}

impl Fixture {
    /// `run --workspace WS --json-status-fd 3 EXTRA... -- COMMAND...` in the
    /// background, with `env` added to the caller's environment; returns once
    /// the command runs.
    pub fn start(&self, extra: &[&str], command: &[&str], env: &[(&str, &str)]) -> Started {
        // In the caller's own directory: the shell runs as the caller.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let status = self.home.join(format!("status-{}.json", NEXT.fetch_add(1, Ordering::Relaxed)));
        let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
        let mut line = format!(
            "exec 3>{} && exec {} run --workspace {} --json-status-fd 3",
            quote(status.to_str().unwrap()),
            quote(binary().to_str().unwrap()),
            quote(self.workspace.to_str().unwrap())
        );
        for a in extra.iter().chain(["--"].iter()).chain(command) {
            line.push(' ');
            line.push_str(&quote(a));
        }
        let mut cmd = self.caller.command(Path::new("/bin/sh"), &["-c", &line]);
        cmd.current_dir(&self.dir).stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let pid1 = loop {
            let text = std::fs::read_to_string(&status).unwrap_or_default();
            if let Some(line) = text.lines().next() {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                break v["child-pid"].as_u64().unwrap() as u32;
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!("the sandbox ended before it started: {st:?}");
            }
            assert!(std::time::Instant::now() < deadline, "the sandbox never started");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let launcher = child.id();
        Started { child, launcher, pid1 }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The children of `pid`, with their state letters (`S`, `Z`, ...).
pub fn children(pid: u32) -> Vec<(u32, char)> {
    let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    list.split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
        .map(|c| {
            let stat = std::fs::read_to_string(format!("/proc/{c}/stat")).unwrap_or_default();
            let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()).unwrap_or('?');
            (c, state)
        })
        .collect()
}

/// `name value` lines (a probe's output) as pairs.
pub fn pairs(stdout: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
        .collect()
}
