//! `git_push`: the run's workspace pushed with the daemon's credentials,
//! hardened (docs/proxy.md, "Protections").

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use super::cleanup::under_root;
use super::{ControlError, ControlPart};
use crate::provider::names;
use crate::proxy::config::Config;
use crate::proxy::gitenv::{GitEnv, check_branch};
use crate::proxy::lane::Lane;
use crate::proxy::protocol::{SandboxControl, str_field};
use serde_json::json;

/// Tail of git's output kept in the result.
const OUTPUT_TAIL: usize = 8000;

pub(super) fn check_remote(r: &str) -> Result<(), ControlError> {
    let ok = r.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && r.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok { Ok(()) } else { Err(ControlError::Remote(r.to_string())) }
}

pub(super) fn tail(bytes: &[u8], d: &ControlPart) -> String {
    let text = d.report().redact(&String::from_utf8_lossy(bytes));
    if text.len() <= OUTPUT_TAIL {
        return text;
    }
    let mut start = text.len() - OUTPUT_TAIL;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &text[start..])
}

/// What `git_push` needs of the daemon's config, copied once.
pub(super) struct GitPushSettings {
    /// `sandbox.gitPush`.
    enabled: bool,
    /// `git_push_timeout_max_seconds`.
    timeout_max: u64,
    /// Where the credentials' private directory is made.
    state_dir: PathBuf,
}

impl GitPushSettings {
    pub(super) fn new(cfg: &Config) -> GitPushSettings {
        GitPushSettings {
            enabled: cfg.sandbox.git_push,
            timeout_max: cfg.git_push_timeout_max_seconds,
            state_dir: cfg.state_dir.clone(),
        }
    }
}

/// A `git_push` control's fields, checked.
struct PushRequest {
    branch: String,
    remote: String,
    timeout: u64,
    /// `env`: the credentials and `TUIXIU_REPO_URL`.
    env: Vec<(String, String)>,
}

impl PushRequest {
    /// The branch, then the remote, the timeout (clamped to `max`) and
    /// `env`, each checked in that order.
    fn from_control(c: &SandboxControl, max: u64) -> Result<PushRequest, ControlError> {
        let field = |k: &str| c.extra.get(k).unwrap_or(&Value::Null);
        let branch = str_field(field("branch")).ok_or(ControlError::NoBranch)?.to_string();
        check_branch(&branch).map_err(ControlError::Branch)?;
        let remote = str_field(field("remote")).unwrap_or("origin").to_string();
        check_remote(&remote)?;
        let timeout = field("timeout_seconds")
            .as_f64()
            .filter(|n| n.is_finite())
            .map_or(300, |n| (n as u64).clamp(5, max));
        let mut env: Vec<(String, String)> = Vec::new();
        if let Some(map) = field("env").as_object() {
            for (k, v) in map {
                let v = v
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| if v.is_null() { String::new() } else { v.to_string() });
                names::validate_env(k, &v).map_err(ControlError::Env)?;
                env.push((k.clone(), v));
            }
        }
        Ok(PushRequest { branch, remote, timeout, env })
    }

    /// A non-empty `env` value.
    fn get(&self, k: &str) -> Option<String> {
        self.env.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()).filter(|v| !v.is_empty())
    }
}

/// `git_push` (docs/proxy.md, "Protections"): the request's fields, the
/// workspace (under the root, a checkout), the workspace's own git config,
/// then the push, each step only after the ones before it passed.
pub(super) async fn git_push(
    d: &ControlPart,
    lane: &mut Lane,
    c: &SandboxControl,
    out: &mut Map<String, Value>,
) -> Result<(), ControlError> {
    if !d.git.enabled {
        return Err(ControlError::GitPushDisabled);
    }
    let req = PushRequest::from_control(c, d.git.timeout_max)?;
    d.report().add_secrets(req.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if lane.run_id().is_empty() {
        return Err(ControlError::GitPushNoRun);
    }
    let root = &d.workspace_host_root;
    let ws = lane
        .state()
        .map(|s| s.workspace.clone())
        .unwrap_or_else(|| root.join(format!("run-{}", lane.run_id())));
    let ws = under_root(root, &ws)?;
    if !ws.is_dir() || std::fs::symlink_metadata(ws.join(".git")).is_err() {
        return Err(ControlError::NotCheckout(ws));
    }
    let genv = GitEnv::new(&d.git.state_dir, &|k: &str| req.get(k)).map_err(ControlError::GitEnv)?;
    // The workspace is agent-writable: its config must not get to run
    // commands on the host or redirect the credentials.
    let git = |args: &[&str]| {
        let mut cmd = genv.command(Some(&ws));
        cmd.arg("-C").arg(&ws).args(args);
        cmd
    };
    check_repo(d, &git, &req).await?;
    let child = git(&["push", "-u", "--", &req.remote, &req.branch])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(ControlError::GitSpawn)?;
    wait_push(d, child, req.timeout, out).await
}

/// Refuses a workspace whose repository config could run a command on
/// the host or send the credentials elsewhere (per-URL credential helpers
/// survive the `credential.helper=` override), and one whose remote does
/// not push to `TUIXIU_REPO_URL` (when given).
async fn check_repo(
    d: &ControlPart,
    git: &(dyn Fn(&[&str]) -> tokio::process::Command + Sync),
    req: &PushRequest,
) -> Result<(), ControlError> {
    let listed = git(&["config", "--local", "--includes", "--name-only", "--list"])
        .output()
        .await
        .map_err(ControlError::GitSpawn)?;
    if let Some(key) = String::from_utf8_lossy(&listed.stdout).lines().find(|k| dangerous_git_key(k)) {
        return Err(ControlError::DangerousConfig(key.to_string()));
    }
    if let Some(repo_url) = req.get("TUIXIU_REPO_URL") {
        let got =
            git(&["remote", "get-url", "--push", &req.remote]).output().await.map_err(ControlError::Git)?;
        let url = String::from_utf8_lossy(&got.stdout).trim().to_string();
        if !got.status.success() || url != repo_url.trim() {
            return Err(ControlError::RemoteMismatch {
                remote: req.remote.clone(),
                url: d.report().redact(&url),
            });
        }
    }
    Ok(())
}

/// Waits for the push at most `timeout` seconds (then kills its process
/// group); its output's tails, exit code and signal go in the result.
async fn wait_push(
    d: &ControlPart,
    child: tokio::process::Child,
    timeout: u64,
    out: &mut Map<String, Value>,
) -> Result<(), ControlError> {
    let pid = child.id();
    match tokio::time::timeout(Duration::from_secs(timeout), child.wait_with_output()).await {
        Ok(Ok(output)) => {
            use std::os::unix::process::ExitStatusExt;
            out.insert("stdout".into(), json!(tail(&output.stdout, d)));
            out.insert("stderr".into(), json!(tail(&output.stderr, d)));
            out.insert("code".into(), json!(output.status.code()));
            out.insert("signal".into(), json!(output.status.signal().map(signal_name)));
            if output.status.success() {
                Ok(())
            } else {
                let mut e =
                    format!("exitCode={}", output.status.code().map_or("null".into(), |c| c.to_string()));
                if let Some(s) = output.status.signal() {
                    e.push_str(&format!(" signal={}", signal_name(s)));
                }
                Err(ControlError::Partial(e))
            }
        }
        Ok(Err(e)) => Err(ControlError::Git(e)),
        Err(_) => {
            if let Some(pid) = pid {
                // SAFETY: kill(2) on the process group we created for git.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            Err(ControlError::Partial(format!("timeout after {timeout}s")))
        }
    }
}

/// Config keys (lower-cased by git) that make `git push` run a program or
/// talk to another endpoint: credential helpers, ssh/proxy commands, remote
/// helpers and pack programs, includes (which could bring any of these),
/// HTTP proxies.
pub(super) fn dangerous_git_key(key: &str) -> bool {
    let k = key.trim().to_ascii_lowercase();
    let parts: Vec<&str> = k.split('.').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    match first {
        "credential" => last == "helper" || last == "usehttppath",
        "core" => matches!(last, "sshcommand" | "gitproxy" | "askpass" | "hookspath" | "fsmonitor"),
        "remote" => matches!(last, "receivepack" | "uploadpack" | "vcs" | "proxy" | "pushurl"),
        "include" | "includeif" => true,
        "http" => last == "proxy" || last == "proxyauthmethod",
        "url" => last == "pushinsteadof" || last == "insteadof",
        "protocol" => true,
        _ => false,
    }
}

pub(super) fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| sig.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangerous_git_keys() {
        for bad in [
            "credential.helper",
            "credential.https://github.com.helper",
            "core.sshcommand",
            "remote.origin.receivepack",
            "remote.origin.vcs",
            "include.path",
            "includeif.gitdir:/x.path",
            "http.proxy",
            "http.https://h.proxy",
            "url.https://evil/.insteadof",
            "protocol.ext.allow",
        ] {
            assert!(dangerous_git_key(bad), "{bad}");
        }
        for ok in ["remote.origin.url", "remote.origin.fetch", "branch.main.remote", "user.name", "core.bare"]
        {
            assert!(!dangerous_git_key(ok), "{ok}");
        }
    }

    #[test]
    fn branches_and_remotes() {
        for ok in ["run/x", "feature/a-b_c.1"] {
            check_branch(ok).unwrap();
        }
        for bad in ["", "-f", "--force", "a..b", "a b", "a:b", "x.lock", "/a", "a/", "a@{1}"] {
            assert!(check_branch(bad).is_err(), "{bad:?}");
        }
        check_remote("origin").unwrap();
        assert!(check_remote("-x").is_err());
        assert!(check_remote("a/b").is_err());
    }
}
