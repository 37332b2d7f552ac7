//! `checkout` sources: a clone with the git CLI into a private temporary
//! directory, before the sandbox starts. The tree is copied into its target
//! at the item's turn.
//!
//! Credentials never appear on a command line or in a log: git asks for
//! them through `GIT_ASKPASS`, which points at this very binary in its
//! askpass mode ([`askpass_main`]), and the answers travel in the
//! environment of the git process only. git runs hardened by
//! [`crate::git::Hardened`] (no user or system config, no terminal prompts,
//! hooks disabled), with only the transport protocols the repository needs,
//! in its own process group, which is killed when the deadline passes.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::download::Secret;
use super::plan::GitRepo;
use crate::env::Redactor;

/// Marks a process started as git's askpass helper.
pub const ASKPASS_ENV: &str = "TUIXIU_SANDBOX_GIT_ASKPASS";
const ASKPASS_USER: &str = "TUIXIU_SANDBOX_GIT_USERNAME";
const ASKPASS_PASS: &str = "TUIXIU_SANDBOX_GIT_PASSWORD";

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// HTTP credentials for git.
#[derive(Clone, Debug)]
pub struct GitCredentials {
    pub username: String,
    pub password: Secret,
}

impl GitCredentials {
    /// From an environment (init.env first): `TUIXIU_GIT_HTTP_USERNAME` and
    /// `TUIXIU_GIT_HTTP_PASSWORD`, else a forge token (`GH_TOKEN`,
    /// `GITHUB_TOKEN`: user `x-access-token`; `GITLAB_TOKEN`,
    /// `GITLAB_ACCESS_TOKEN`: user `oauth2`).
    pub fn from_env(env: &[(String, String)]) -> Option<GitCredentials> {
        let get =
            |k: &str| env.iter().rev().find(|(key, v)| key == k && !v.is_empty()).map(|(_, v)| v.clone());
        if let Some(password) = get("TUIXIU_GIT_HTTP_PASSWORD") {
            let username = get("TUIXIU_GIT_HTTP_USERNAME").unwrap_or_else(|| "x-access-token".into());
            return Some(GitCredentials { username, password: Secret::new(password) });
        }
        for (key, username) in [
            ("GH_TOKEN", "x-access-token"),
            ("GITHUB_TOKEN", "x-access-token"),
            ("GITLAB_TOKEN", "oauth2"),
            ("GITLAB_ACCESS_TOKEN", "oauth2"),
        ] {
            if let Some(token) = get(key) {
                return Some(GitCredentials { username: username.into(), password: Secret::new(token) });
            }
        }
        None
    }
}

#[derive(Clone, Debug)]
pub struct GitOptions {
    pub timeout: Duration,
    pub credentials: Option<GitCredentials>,
    /// The program git runs as its askpass helper (this binary).
    pub askpass: PathBuf,
}

impl Default for GitOptions {
    fn default() -> Self {
        GitOptions {
            timeout: DEFAULT_TIMEOUT,
            credentials: None,
            askpass: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe")),
        }
    }
}

pub use super::error::GitFailure;

/// Clones `repo` at `git_ref` (branch, tag or commit; the remote's default
/// branch when `None`) into `dir` (which must not exist). Shallow when the
/// transport allows it.
pub fn checkout(
    repo: &GitRepo,
    git_ref: Option<&str>,
    dir: &Path,
    scratch: &Path,
    options: &GitOptions,
    redactor: &Redactor,
) -> Result<(), GitFailure> {
    let (url, protocols) = match repo {
        GitRepo::Remote(url) => (url.clone(), "https:http:ssh:git"),
        GitRepo::Local(host) => (host.canonical.to_string_lossy().into_owned(), "file"),
    };
    // git's only configuration: a file of ours. A local repository belongs
    // to whoever made it, and git refuses to read one owned by another user
    // unless it is named in protected configuration; only the allowlisted
    // repository itself is named, never `*`.
    let config = scratch.join("gitconfig");
    let config_text = match repo {
        GitRepo::Local(host) => format!("[safe]\n\tdirectory = {}\n", host.canonical.to_string_lossy()),
        GitRepo::Remote(_) => String::new(),
    };
    std::fs::write(&config, config_text).map_err(GitFailure::Config)?;
    // `file://` rather than a plain path, so that `--depth 1` applies.
    let url = match repo {
        GitRepo::Local(_) => format!("file://{url}"),
        GitRepo::Remote(_) => url,
    };
    let home = scratch.join("home");
    std::fs::create_dir_all(&home).map_err(GitFailure::Home)?;
    let deadline = Instant::now() + options.timeout;
    let git = |args: &[&str], cwd: Option<&Path>| -> Result<(), GitFailure> {
        run_git(args, cwd, &home, &config, protocols, options, redactor, deadline, scratch)
    };
    let target = dir.to_string_lossy().into_owned();
    let is_commit =
        git_ref.is_some_and(|r| r.len() >= 7 && r.len() <= 40 && r.bytes().all(|b| b.is_ascii_hexdigit()));
    match git_ref {
        Some(commit) if is_commit => {
            git(&["init", "--quiet", "--template=", "--", &target], None)?;
            git(&["remote", "add", "origin", "--", &url], Some(dir))?;
            // Servers may refuse an unadvertised commit in a shallow fetch;
            // then fetch everything and check the commit out.
            if git(&["fetch", "--quiet", "--depth", "1", "--no-tags", "origin", commit], Some(dir)).is_ok() {
                git(&["checkout", "--quiet", "--detach", "FETCH_HEAD"], Some(dir))?;
            } else {
                git(&["fetch", "--quiet", "--no-tags", "origin"], Some(dir))?;
                git(&["checkout", "--quiet", "--detach", commit], Some(dir))?;
            }
        }
        branch => {
            let mut args =
                vec!["clone", "--quiet", "--template=", "--depth", "1", "--single-branch", "--no-tags"];
            if let Some(branch) = branch {
                args.extend(["--branch", branch]);
            }
            args.extend(["--", url.as_str(), target.as_str()]);
            git(&args, None)?;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_git(
    args: &[&str],
    cwd: Option<&Path>,
    home: &Path,
    config: &Path,
    protocols: &str,
    options: &GitOptions,
    redactor: &Redactor,
    deadline: Instant,
    scratch: &Path,
) -> Result<(), GitFailure> {
    // git's stderr goes to a file, so no pipe can fill up while we wait.
    let mut log = tempfile::tempfile_in(scratch).map_err(GitFailure::LogFile)?;
    let mut cmd = crate::git::Hardened {
        home,
        global_config: Some(config),
        path: Some(std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"))),
        safe_directory: None,
    }
    .command();
    cmd.args(["-c", "advice.detachedHead=false", "-c", "init.defaultBranch=main"]);
    cmd.args(args);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    cmd.env("GIT_ALLOW_PROTOCOL", protocols)
        .env("GIT_ASKPASS", &options.askpass)
        .env(ASKPASS_ENV, "1")
        .stdout(Stdio::null())
        .stderr(log.try_clone().map_err(GitFailure::LogFile)?);
    if let Some(creds) = &options.credentials {
        cmd.env(ASKPASS_USER, &creds.username).env(ASKPASS_PASS, creds.password.expose());
    }
    // git dies with us (a killed launcher must not leave a clone running);
    // its helpers then see their pipes close. The thread that spawns git
    // waits for it below, so the signal is not sent early.
    let parent = std::process::id();
    let die_with_parent = move || {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
        if nix::unistd::getppid().as_raw() as u32 != parent {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: only async-signal-safe calls (prctl, getppid) between fork
    // and exec.
    unsafe { std::os::unix::process::CommandExt::pre_exec(&mut cmd, die_with_parent) };
    let mut child = cmd.spawn().map_err(GitFailure::Spawn)?;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(GitFailure::Wait(e)),
        }
        if Instant::now() >= deadline {
            // The whole group: git runs helpers (remote-https, ssh).
            // SAFETY: kill(2) with a negative pid signals that process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            return Err(GitFailure::TimedOut { command: args[0].to_string() });
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if status.success() {
        return Ok(());
    }
    let mut text = String::new();
    let _ = std::io::Seek::rewind(&mut log);
    let _ = log.take(4096).read_to_string(&mut text);
    let detail: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let detail = detail.iter().rev().take(3).rev().copied().collect::<Vec<_>>().join(" | ");
    // Only git's own text can carry a secret (a URL, a prompt's answer).
    Err(GitFailure::Failed {
        command: args[0].to_string(),
        status,
        stderr: redactor.redact(&detail).into_owned(),
    })
}

/// The askpass mode: git runs us with a prompt such as
/// `Username for 'https://host': ` and reads the answer from stdout.
pub fn askpass_main() -> u8 {
    let prompt = std::env::args().nth(1).unwrap_or_default();
    let key = if prompt.starts_with("Username") { ASKPASS_USER } else { ASKPASS_PASS };
    match std::env::var(key) {
        Ok(value) => {
            println!("{value}");
            0
        }
        // No credentials: fail, so git reports an authentication error
        // instead of waiting for a terminal.
        Err(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each variant renders exactly as the `format!` it replaced.
    #[test]
    fn texts_are_the_old_ones() {
        use std::os::unix::process::ExitStatusExt;
        let enoent = || std::io::Error::from_raw_os_error(libc::ENOENT);
        let e = enoent();
        let status = std::process::ExitStatus::from_raw(128 << 8);
        let detail = "fatal: repository 'x' not found";
        let cases: Vec<(GitFailure, String)> = vec![
            (GitFailure::Config(enoent()), format!("git config: {e}")),
            (GitFailure::Home(enoent()), format!("git home: {e}")),
            (GitFailure::LogFile(enoent()), format!("git log file: {e}")),
            (GitFailure::Spawn(enoent()), format!("cannot run git: {e}")),
            (GitFailure::Wait(enoent()), format!("waiting for git: {e}")),
            (GitFailure::TimedOut { command: "clone".into() }, format!("git {} timed out", "clone")),
            (
                GitFailure::Failed { command: "fetch".into(), status, stderr: detail.into() },
                format!("git {} failed ({status}): {detail}", "fetch"),
            ),
        ];
        for (error, old) in cases {
            assert_eq!(error.to_string(), old, "{error:?}");
            assert_eq!(error.timed_out(), matches!(error, GitFailure::TimedOut { .. }));
        }
    }
}
