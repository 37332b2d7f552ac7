//! The daemon's end-to-end test support: the shared fake backend
//! (tests/fake, re-exported here), a scratch directory with the daemon's
//! config, and a handle on the real `tuixiu-sandbox proxy` process.

#![allow(dead_code)]

pub mod agent;
#[path = "../fake/mod.rs"]
pub mod fake;
#[path = "../install/mod.rs"]
mod install;
pub mod net;
#[path = "../pki/mod.rs"]
mod pki;
pub mod pongless;
pub use fake::backend::*;
pub use pki::Pki;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fake::config::ProxyToml;
use serde_json::Value;

impl Backend {
    /// A `wss://localhost:<port>/ws/agent` backend; with
    /// `require_client_cert`, clients must present a certificate of the CA.
    pub async fn start_tls(pki: &Pki, require_client_cert: bool) -> Backend {
        Self::start_with(Some(Arc::new(pki.server_config(require_client_cert)))).await
    }

    /// A backend on a listener made elsewhere (e.g. bound inside a network
    /// namespace of the test's own), over TLS with `pki`'s server
    /// certificate when given. `url` is what `self.url` says.
    pub fn start_on(listener: std::net::TcpListener, pki: Option<&Pki>, url: String) -> Backend {
        Self::start_on_with(listener, pki.map(|p| Arc::new(p.server_config(false))), url)
    }
}

/// Scratch directory of one test: state, workspace root, config.
pub struct Scratch {
    pub dir: PathBuf,
    pub state: PathBuf,
    pub root: PathBuf,
}

impl Scratch {
    pub fn new(label: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tuixiu-proxy-{}-{}-{label}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.join("workspaces");
        std::fs::create_dir_all(&root).unwrap();
        Scratch { state: dir.join("state"), root, dir }
    }

    /// A config with short intervals for tests; `extra` is appended to the
    /// top level, `sandbox_extra` to `[sandbox]`.
    pub fn config(&self, url: &str, extra: &str, sandbox_extra: &str) -> String {
        self.toml(url, extra).sandbox(sandbox_extra).build()
    }

    /// [`Scratch::config`]'s top level, as a builder for more tables.
    pub fn toml(&self, url: &str, extra: &str) -> ProxyToml {
        let mut defaults = String::new();
        for line in [
            "heartbeat_seconds = 1",
            "inventory_interval_seconds = 0",
            "reconnect_max_seconds = 1",
            "keepalive_min_seconds = 1",
        ] {
            let key = line.split(' ').next().unwrap();
            if !extra.lines().any(|l| l.trim_start().starts_with(&format!("{key} "))) {
                defaults.push_str(line);
                defaults.push('\n');
            }
        }
        ProxyToml::new(url, &self.state, "proxy-test", &self.root).top(&defaults).top(extra)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The daemon process.
pub struct Daemon {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `tuixiu-sandbox proxy --config <dir>/<name>.toml` with `config`.
    pub fn start(scratch: &Scratch, name: &str, config: &str) -> Daemon {
        Self::start_env(scratch, name, config, &[])
    }

    pub fn start_env(scratch: &Scratch, name: &str, config: &str, env: &[(&str, &str)]) -> Daemon {
        Self::spawn(scratch, name, config, env, &[], &[])
    }

    /// Starts the daemon as uid/gid 65534 (`nested`: inside `unshare -U -r`
    /// as well), with the scratch directory handed to that user.
    pub fn start_unprivileged(scratch: &Scratch, name: &str, config: &str, nested: bool) -> Daemon {
        Self::start_unprivileged_env(scratch, name, config, nested, &[])
    }

    /// As [`Daemon::start_unprivileged`], with variables for the daemon.
    pub fn start_unprivileged_env(
        scratch: &Scratch,
        name: &str,
        config: &str,
        nested: bool,
        env: &[(&str, &str)],
    ) -> Daemon {
        let chown = |p: &Path| std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        chown(&scratch.dir);
        chown(&scratch.root);
        let mut wrapper = vec!["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"];
        if nested {
            wrapper.extend(["unshare", "-U", "-r"]);
        }
        Self::spawn(scratch, name, config, env, &wrapper, &[])
    }

    /// Starts the daemon through `wrapper` (e.g. `nsenter --target PID --net --`).
    pub fn start_wrapped(
        scratch: &Scratch,
        name: &str,
        config: &str,
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Daemon {
        Self::spawn(scratch, name, config, env, wrapper, &[])
    }

    /// Starts the daemon with more `proxy` options after `--config`.
    pub fn start_args(scratch: &Scratch, name: &str, config: &str, args: &[&str]) -> Daemon {
        Self::spawn(scratch, name, config, &[], &[], args)
    }

    /// As [`Daemon::start_args`], with variables for the daemon.
    pub fn start_args_env(
        scratch: &Scratch,
        name: &str,
        config: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        Self::spawn(scratch, name, config, env, &[], args)
    }

    fn spawn(
        scratch: &Scratch,
        name: &str,
        config: &str,
        env: &[(&str, &str)],
        wrapper: &[&str],
        args: &[&str],
    ) -> Daemon {
        let path = scratch.dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let log = scratch.dir.join(format!("{name}.log"));
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(binary());
                c
            }
            None => Command::new(binary()),
        };
        cmd.args(["proxy", "--config"]).arg(&path).args(args);
        cmd.env_clear();
        cmd.env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        cmd.env("TUIXIU_LOG", "debug");
        cmd.env("HOME", &scratch.dir);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("spawn tuixiu-sandbox proxy");
        Daemon { child: Some(child), log }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            if Instant::now() > deadline {
                panic!("the daemon did not exit within {timeout:?}; stderr:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// SIGTERM, then waits (the daemon closes its link properly).
    pub fn stop(&mut self) -> ExitStatus {
        if let Some(child) = &self.child {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        self.wait_exit(Duration::from_secs(15))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub const SECS: Duration = Duration::from_secs(1);

/// The launcher, installed where every user can execute it (the checkout
/// may not be reachable for uid 65534), with the full tool next to it.
pub fn binary() -> &'static Path {
    install::launcher()
}

/// The positions of messages in `msgs` by type, for order checks.
pub fn position(msgs: &[Value], pred: impl Fn(&Value) -> bool) -> Option<usize> {
    msgs.iter().position(pred)
}

/// The run state file at `path` once it satisfies `pred`. Lanes hand run
/// state to a background writer (src/proxy/persist.rs) and, except for
/// `acp_opened`, reply without waiting for it, so a reply can reach the
/// backend before the file is replaced: wait (bounded) for the write rather
/// than racing it.
pub async fn persisted(path: &Path, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: Option<Value> = std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok());
        match now {
            Some(v) if pred(&v) => return v,
            _ if Instant::now() > deadline => {
                panic!("{what}: {} never reached the expected state (now: {now:?})", path.display())
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Waits (bounded) until the run state file at `path` is gone.
pub async fn unpersisted(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while path.exists() {
        assert!(Instant::now() < deadline, "{what}: {} still exists", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
