//! Host git processes of the daemon (`git_push`, the workspace's
//! preparation for `TUIXIU_REPO_URL`): their environment, credentials and
//! hardening, in one place.
//!
//! * Credentials come from the run's variables (`init.env`, or the
//!   control's `env`) and reach git only through its environment:
//!   `TUIXIU_GIT_HTTP_PASSWORD` (user `TUIXIU_GIT_HTTP_USERNAME`, default
//!   `x-access-token`) through an askpass script that prints variables;
//!   with `TUIXIU_GIT_AUTH_MODE=ssh`, a key (`TUIXIU_GIT_SSH_KEY` or
//!   `_B64`) written 0600 into a private temporary directory, or
//!   `TUIXIU_GIT_SSH_COMMAND`. Never in argv, never in a log.
//! * git starts hardened by [`crate::git::Hardened`]: a cleared
//!   environment, no system or user config (its `HOME` is the private
//!   temporary directory), no terminal prompts, hooks, fsmonitor,
//!   credential helpers or `ext::` transport, in its own process group,
//!   which is killed at the deadline.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a git operation of the daemon could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error(transparent)]
    Dir(#[from] super::identity::IdentityError),
    #[error("create {}: {}", .path.display(), sandbox::error::io_error_text(.source))]
    Create { path: PathBuf, source: std::io::Error },
    #[error("write {}: {source}", .path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("TUIXIU_GIT_SSH_KEY_B64 is not base64")]
    KeyNotBase64,
    #[error("TUIXIU_GIT_SSH_KEY_B64 is not a text key")]
    KeyNotText,
    #[error("ssh auth needs TUIXIU_GIT_SSH_KEY(_B64) or TUIXIU_GIT_SSH_COMMAND")]
    NoSshKey,
    #[error("git: {}", sandbox::error::io_error_text(.0))]
    Spawn(std::io::Error),
    #[error("git: {0}")]
    Wait(std::io::Error),
    #[error("timed out")]
    TimedOut,
    #[error("branch {0:?} is not a valid branch name")]
    BadBranch(String),
}

/// The askpass helper: answers git's prompts from variables, so the
/// password is in no file and no argv.
const ASKPASS: &str = "#!/bin/sh\ncase \"$1\" in\n  Username*|username*) printf '%s\\n' \"$TUIXIU_ASKPASS_USERNAME\" ;;\n  *) printf '%s\\n' \"$TUIXIU_ASKPASS_PASSWORD\" ;;\nesac\n";

/// A private temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), GitError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(mode)
        .open(path)
        .map_err(|source| GitError::Create { path: path.to_path_buf(), source })?;
    f.write_all(text.as_bytes()).map_err(|source| GitError::Write { path: path.to_path_buf(), source })
}

/// The environment of the daemon's git processes for one operation.
pub struct GitEnv {
    tmp: TempDir,
    pub env: Vec<(String, String)>,
}

impl GitEnv {
    /// `get` looks a run variable up (empty counts as unset).
    pub fn new(state_dir: &Path, get: &(dyn Fn(&str) -> Option<String> + Sync)) -> Result<GitEnv, GitError> {
        let tmp = state_dir.join("tmp").join(format!("git-{}", uuid::Uuid::new_v4()));
        super::identity::private_dir(&tmp)?;
        let tmp = TempDir(tmp);
        // Credentials only: the rest of git's environment is the hardened
        // one (`crate::git`).
        let mut env: Vec<(String, String)> = Vec::new();
        let ssh = get("TUIXIU_GIT_AUTH_MODE").is_some_and(|m| m.eq_ignore_ascii_case("ssh"));
        if ssh {
            let command = match (
                get("TUIXIU_GIT_SSH_COMMAND"),
                get("TUIXIU_GIT_SSH_KEY_B64"),
                get("TUIXIU_GIT_SSH_KEY"),
            ) {
                (Some(cmd), _, _) => cmd,
                (None, b64, key) => {
                    let key = match (b64, key) {
                        (Some(b64), _) => {
                            use base64::Engine;
                            let bytes = base64::engine::general_purpose::STANDARD
                                .decode(b64.trim())
                                .map_err(|_| GitError::KeyNotBase64)?;
                            String::from_utf8(bytes).map_err(|_| GitError::KeyNotText)?
                        }
                        (None, Some(key)) => key,
                        (None, None) => return Err(GitError::NoSshKey),
                    };
                    let path = tmp.0.join("id");
                    let key = if key.ends_with('\n') { key } else { format!("{key}\n") };
                    write_file(&path, &key, 0o600)?;
                    format!(
                        "ssh -i {} -o IdentitiesOnly=yes -o StrictHostKeyChecking=accept-new -o BatchMode=yes",
                        path.display()
                    )
                }
            };
            env.push(("GIT_SSH_COMMAND".into(), command));
        } else {
            // Even without credentials, a repository's core.sshCommand must
            // not run: the hardened environment's GIT_SSH_COMMAND takes
            // precedence over the config.
            if let Some(password) = get("TUIXIU_GIT_HTTP_PASSWORD") {
                let askpass = tmp.0.join("askpass");
                write_file(&askpass, ASKPASS, 0o700)?;
                let _ = std::fs::set_permissions(&askpass, std::fs::Permissions::from_mode(0o700));
                env.push(("GIT_ASKPASS".into(), askpass.display().to_string()));
                env.push((
                    "TUIXIU_ASKPASS_USERNAME".into(),
                    get("TUIXIU_GIT_HTTP_USERNAME").unwrap_or_else(|| "x-access-token".into()),
                ));
                env.push(("TUIXIU_ASKPASS_PASSWORD".into(), password));
            }
        }
        Ok(GitEnv { tmp, env })
    }

    /// The private directory of this operation (removed with `self`).
    pub fn dir(&self) -> &Path {
        &self.tmp.0
    }

    /// The hardened `git` ([`crate::git::Hardened`]) with this operation's
    /// credentials, stdin closed, in its own process group, killed if
    /// dropped.
    pub fn command(&self, safe_directory: Option<&Path>) -> tokio::process::Command {
        let mut cmd =
            crate::git::Hardened { home: &self.tmp.0, global_config: None, path: None, safe_directory }
                .async_command();
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd
    }
}

/// Runs `cmd` to its end or until `deadline`, when its whole process
/// group is killed (git runs helpers: remote-https, ssh).
pub async fn output(
    mut cmd: tokio::process::Command,
    deadline: tokio::time::Instant,
) -> Result<std::process::Output, GitError> {
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let child = cmd.spawn().map_err(GitError::Spawn)?;
    let pid = child.id();
    match tokio::time::timeout_at(deadline, child.wait_with_output()).await {
        Ok(r) => r.map_err(GitError::Wait),
        Err(_) => {
            if let Some(pid) = pid {
                // SAFETY: kill(2) on the process group we created for git.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            Err(GitError::TimedOut)
        }
    }
}

/// Time left until `deadline`, for messages.
pub fn left(deadline: tokio::time::Instant) -> Duration {
    deadline.saturating_duration_since(tokio::time::Instant::now())
}

/// A branch name git would accept and that cannot become an option.
pub fn check_branch(b: &str) -> Result<(), GitError> {
    let bad = b.is_empty()
        || b.starts_with(['-', '/', '.'])
        || b.ends_with(['/', '.'])
        || b.ends_with(".lock")
        || b.contains("..")
        || b.contains("//")
        || b.contains("@{")
        || b == "@"
        || b.chars().any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c));
    if bad { Err(GitError::BadBranch(b.to_string())) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn askpass_answers_from_the_environment() {
        let dir = std::env::temp_dir().join(format!("tuixiu-askpass-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("askpass");
        write_file(&script, ASKPASS, 0o700).unwrap();
        let ask = |prompt: &str| {
            let out = std::process::Command::new(&script)
                .arg(prompt)
                .env_clear()
                .env("TUIXIU_ASKPASS_USERNAME", "x-access-token")
                .env("TUIXIU_ASKPASS_PASSWORD", "pa ss'word")
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap()
        };
        assert_eq!(ask("Username for 'https://example.com': "), "x-access-token\n");
        assert_eq!(ask("Password for 'https://x-access-token@example.com': "), "pa ss'word\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn branches() {
        for ok in ["main", "run/issue-1", "feature_x.y"] {
            assert!(check_branch(ok).is_ok(), "{ok}");
        }
        for bad in ["-f", "--force", "a..b", "a b", "x.lock", "/x", "a//b", "@", "a@{1}", "a:b"] {
            assert!(check_branch(bad).is_err(), "{bad}");
        }
    }
}
