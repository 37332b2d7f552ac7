//! Host-side git preparation of a run's workspace (docs/acp.md, "The workspace
//! as a git checkout"): when `init.env` carries `TUIXIU_REPO_URL`, the
//! workspace is made a checkout of `TUIXIU_RUN_BRANCH` (created from
//! `origin/<TUIXIU_BASE_BRANCH>`, default `main`) before agentInputs land,
//! reported as `init_step` stages `auth`, `clone`, `checkout`, `ready`.
//!
//! Two modes, as the Node proxy has them:
//!
//! * `TUIXIU_WORKSPACE_MODE=clone`: `git clone --branch <base>
//!   --single-branch` of the repository into the workspace;
//! * otherwise (`worktree`, the default): from a cache of the repository
//!   kept per URL in `<state>/git-cache/` (a bare clone, fetched under an
//!   exclusive lock so concurrent runs of one repository take turns), then
//!   a standalone clone of the cache into the workspace, whose `origin` is
//!   set back to the repository's URL. Each run's network transfer is one
//!   incremental fetch. Unlike the Node proxy this is not a `git worktree`:
//!   a worktree's metadata, refs and objects live in the shared base
//!   repository, which would have to be writable inside every run's
//!   sandbox at its host path, so one agent could rewrite the branches,
//!   objects and configuration that the other runs and the daemon's own
//!   git use. Here every workspace owns its `.git` and the cache is never
//!   visible to an agent.
//!
//! A workspace that already is a checkout is left as it is (`clone` and
//! `checkout` reported `skip`): a reopened run keeps its commits and
//! uncommitted work (the Node proxy fetched and reset the run branch to the
//! base). A workspace that is neither empty nor a checkout is refused,
//! never deleted.
//!
//! Safety: the URL must be https, http, ssh (URL or `user@host:path`),
//! git, or a local repository under `workspaceHostRoot` (a path or
//! `file://`); transport helpers (`ext::`) and options are refused, and a
//! password in the URL is refused (it would be on git's command line).
//! Credentials reach git through [`super::gitenv`] only; git's output is
//! redacted before it is reported. The daemon runs git only on
//! repositories it made itself (the cache, a fresh clone), never on one the
//! agent could have changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::Digest;

use super::gitenv::{self, GitEnv, GitError};
use super::identity::IdentityError;
use sandbox::error::io_error_text;

/// The whole preparation (lock wait excluded).
const TIMEOUT: Duration = Duration::from_secs(600);
/// How long a run waits for another one holding the cache of its repository.
const LOCK_WAIT: Duration = Duration::from_secs(300);
/// Output of a failed git kept in the error (its tail).
const ERROR_TAIL: usize = 2000;

/// A lane's git part: what making a run's workspace a checkout needs of
/// the daemon's config, and nothing else.
pub struct Checkouts {
    /// `<state>`: the repository caches and the credentials' directories.
    state_dir: PathBuf,
    /// `workspaceHostRoot`: where a local repository may lie.
    root: PathBuf,
    /// Docker instances: a root daemon hands the checkout to the sandbox
    /// user.
    docker: bool,
}

impl Checkouts {
    pub fn new(cfg: &super::config::Config) -> Checkouts {
        Checkouts {
            state_dir: cfg.state_dir.clone(),
            root: cfg.sandbox.workspace_host_root.clone(),
            docker: cfg.sandbox.provider == super::config::ProviderChoice::Docker,
        }
    }

    /// What `env` (a run's `init.env`) asks for: `None` without
    /// `TUIXIU_REPO_URL`.
    pub fn request(&self, env: &HashMap<String, String>) -> Result<Option<Request>, RepoError> {
        Request::from_env(env, &self.root)
    }

    /// Who owns the checkout: the sandbox user `user` when the instance
    /// is a container and the daemon root (else the daemon's user).
    pub fn owner(&self, user: (u32, u32)) -> Option<(u32, u32)> {
        (self.docker && nix::unistd::geteuid().is_root()).then_some(user)
    }

    /// What [`prepare`] needs, with the run's redaction and blocking share.
    pub fn host<'a>(
        &'a self,
        redact: &'a (dyn Fn(&str) -> String + Sync),
        blocking: &'a crate::blocking::Share,
    ) -> Host<'a> {
        Host { state_dir: &self.state_dir, redact, blocking }
    }
}

/// What the preparation needs from the daemon, and nothing else.
#[derive(Clone, Copy)]
pub struct Host<'a> {
    /// `<state>`: the repository caches (`git-cache/`) and the
    /// credentials' private directories.
    state_dir: &'a Path,
    /// Scrubs every known secret from git's output before it is reported.
    redact: &'a (dyn Fn(&str) -> String + Sync),
    /// Where tree walks go (the run's share of the blocking pool).
    blocking: &'a crate::blocking::Share,
}

/// Why the workspace could not be made a checkout. The text goes to the
/// backend (`init_step` messages, `acp_opened`).
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("TUIXIU_RUN_BRANCH is required with TUIXIU_REPO_URL (缺少 TUIXIU_RUN_BRANCH)")]
    NoRunBranch,
    #[error("TUIXIU_RUN_BRANCH: {0}")]
    RunBranch(#[source] GitError),
    #[error("TUIXIU_BASE_BRANCH: {0}")]
    BaseBranch(#[source] GitError),
    #[error("TUIXIU_REPO_URL {url:?}: {why}")]
    Url { url: String, why: UrlRefused },
    /// The credentials' private directory (`gitenv`).
    #[error("{0}")]
    Auth(#[source] GitError),
    #[error("{}: {}", .path.display(), io_error_text(.source))]
    ReadWorkspace { path: PathBuf, source: std::io::Error },
    #[error(
        "the workspace {} is neither empty nor a git checkout: refusing to replace it \
         (remove it with remove_workspace to start over)",
        .0.display()
    )]
    NotEmpty(PathBuf),
    /// git could not be run, or not within the deadline (`gitenv::output`).
    #[error("git {what}: {cause} (the preparation has {} s in all)", TIMEOUT.as_secs())]
    Run { what: &'static str, cause: GitError },
    /// git ran and failed: the tail of what it said, redacted.
    #[error("git {what} failed ({code}): {output}")]
    Git { what: &'static str, code: String, output: String },
    #[error(transparent)]
    CacheDir(#[from] IdentityError),
    #[error("rename the cache into place: {0}")]
    CacheRename(#[source] std::io::Error),
    #[error("open {}: {}", .path.display(), io_error_text(.source))]
    LockOpen { path: PathBuf, source: std::io::Error },
    #[error("the repository cache is busy (flock {}: {errno}) after {} s", .path.display(), LOCK_WAIT.as_secs())]
    LockBusy { path: PathBuf, errno: nix::errno::Errno },
    #[error("chown {}: {}", .path.display(), io_error_text(.source))]
    Chown { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Blocking(#[from] crate::blocking::Panicked),
    #[error("{}: {source}", .path.display())]
    Walk { path: PathBuf, source: std::io::Error },
}

/// Why `TUIXIU_REPO_URL` is refused.
#[derive(Debug, thiserror::Error)]
pub enum UrlRefused {
    #[error("not a repository URL")]
    NotUrl,
    #[error(
        "carries a password, which would be on git's command line: \
         give it in TUIXIU_GIT_HTTP_PASSWORD instead"
    )]
    Password,
    #[error("the {0}:// transport is not allowed")]
    Transport(String),
    #[error("not a repository URL (https://, ssh://, user@host:path, or a local path)")]
    NotRepositoryUrl,
    #[error("{}", io_error_text(.0))]
    Local(#[source] std::io::Error),
    #[error("a local repository must be under sandbox.workspaceHostRoot ({})", .0.display())]
    OutsideRoot(PathBuf),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Clone,
    Cached,
}

/// What `init.env` asks for.
#[derive(Clone, Debug)]
pub struct Request {
    pub url: String,
    pub branch: String,
    pub base: String,
    pub mode: Mode,
    /// `GIT_ALLOW_PROTOCOL` for fetching `url`.
    protocols: &'static str,
}

impl Request {
    /// `None` without `TUIXIU_REPO_URL`; an error names what is wrong.
    pub fn from_env(env: &HashMap<String, String>, root: &Path) -> Result<Option<Request>, RepoError> {
        let get = |k: &str| env.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let Some(url) = get("TUIXIU_REPO_URL") else { return Ok(None) };
        let branch = get("TUIXIU_RUN_BRANCH").ok_or(RepoError::NoRunBranch)?;
        gitenv::check_branch(branch).map_err(RepoError::RunBranch)?;
        let base = get("TUIXIU_BASE_BRANCH").unwrap_or("main");
        gitenv::check_branch(base).map_err(RepoError::BaseBranch)?;
        let mode = match get("TUIXIU_WORKSPACE_MODE") {
            Some(m) if m.eq_ignore_ascii_case("clone") => Mode::Clone,
            _ => Mode::Cached,
        };
        let protocols = check_url(url, root).map_err(|why| RepoError::Url { url: url.to_string(), why })?;
        Ok(Some(Request { url: url.to_string(), branch: branch.into(), base: base.into(), mode, protocols }))
    }
}

/// Which transports `url` needs, or why it is refused.
fn check_url(url: &str, root: &Path) -> Result<&'static str, UrlRefused> {
    if url.starts_with('-') || url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(UrlRefused::NotUrl);
    }
    let local = |path: &Path| -> Result<&'static str, UrlRefused> {
        let real = std::fs::canonicalize(path).map_err(UrlRefused::Local)?;
        if real.starts_with(root) { Ok("file") } else { Err(UrlRefused::OutsideRoot(root.to_path_buf())) }
    };
    if url.starts_with('/') {
        return local(Path::new(url));
    }
    match url::Url::parse(url) {
        Ok(u) => {
            if u.password().is_some() {
                return Err(UrlRefused::Password);
            }
            match u.scheme() {
                "https" | "http" | "ssh" | "git" => Ok("https:http:ssh:git"),
                "file" => local(Path::new(u.path())),
                other => Err(UrlRefused::Transport(other.to_string())),
            }
        }
        // scp-like `user@host:path`: ssh. (`x::y` is a transport helper.)
        Err(_) if !url.contains("::") && url.split_once(':').is_some_and(|(h, _)| !h.contains('/')) => {
            Ok("ssh")
        }
        Err(_) => Err(UrlRefused::NotRepositoryUrl),
    }
}

/// One git step's failure: what git said (its tail), redacted.
fn failed(h: Host<'_>, what: &'static str, out: &std::process::Output) -> RepoError {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    let text = (h.redact)(text.trim());
    let mut start = text.len().saturating_sub(ERROR_TAIL);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let code = out.status.code().map_or_else(|| "killed".to_string(), |c| format!("exit {c}"));
    RepoError::Git { what, code, output: text[start..].to_string() }
}

/// Prepares `workspace` for `req`, reporting stages through `step(stage,
/// status, message)`. `owner`: give the tree to these ids afterwards (a
/// docker container's user). On failure the workspace is left as empty as
/// it was found.
pub async fn prepare(
    h: Host<'_>,
    req: &Request,
    workspace: &Path,
    env: &HashMap<String, String>,
    owner: Option<(u32, u32)>,
    step: &(dyn Fn(&str, &str, Option<String>) + Sync),
) -> Result<(), RepoError> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    step("auth", "start", None);
    let get = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned();
    let genv = GitEnv::new(h.state_dir, &get).map_err(|e| {
        let e = RepoError::Auth(e);
        step("auth", "failed", Some(e.to_string()));
        e
    })?;
    step("auth", "done", None);

    let ws = workspace.to_path_buf();
    let (is_checkout, listed) = h
        .blocking
        .run(move || {
            let is_checkout = std::fs::symlink_metadata(ws.join(".git")).is_ok();
            let listed = std::fs::read_dir(&ws).map(|mut entries| entries.next().is_none());
            (is_checkout, listed)
        })
        .await?;
    if is_checkout {
        let note = Some("the workspace is already a git checkout; left as it is".to_string());
        step("clone", "skip", note.clone());
        step("checkout", "skip", note);
        step("ready", "done", None);
        return Ok(());
    }
    let empty =
        listed.map_err(|source| RepoError::ReadWorkspace { path: workspace.to_path_buf(), source })?;
    if !empty {
        return Err(RepoError::NotEmpty(workspace.to_path_buf()));
    }
    let result = async {
        step("clone", "start", None);
        clone(h, req, &genv, workspace, deadline)
            .await
            .inspect_err(|e| step("clone", "failed", Some(e.to_string())))?;
        step("clone", "done", None);
        step("checkout", "start", None);
        checkout(h, req, &genv, workspace, deadline)
            .await
            .inspect_err(|e| step("checkout", "failed", Some(e.to_string())))?;
        step("checkout", "done", None);
        Ok::<(), RepoError>(())
    }
    .await;
    if let Err(e) = result {
        let ws = workspace.to_path_buf();
        if let Err(panicked) = h.blocking.run(move || empty_dir(&ws)).await {
            tracing::warn!("cleaning {} after a failed git preparation: {panicked}", workspace.display());
        }
        return Err(e);
    }
    if let Some((uid, gid)) = owner {
        let ws = workspace.to_path_buf();
        h.blocking.run(move || chown_tree(&ws, uid, gid)).await??;
    }
    step("ready", "done", None);
    Ok(())
}

async fn git_ok(
    h: Host<'_>,
    what: &'static str,
    cmd: tokio::process::Command,
    deadline: tokio::time::Instant,
) -> Result<(), RepoError> {
    let out = gitenv::output(cmd, deadline).await.map_err(|cause| RepoError::Run { what, cause })?;
    if out.status.success() { Ok(()) } else { Err(failed(h, what, &out)) }
}

async fn clone(
    h: Host<'_>,
    req: &Request,
    genv: &GitEnv,
    workspace: &Path,
    deadline: tokio::time::Instant,
) -> Result<(), RepoError> {
    let ws = workspace.as_os_str();
    match req.mode {
        Mode::Clone => {
            let mut cmd = genv.command(None);
            cmd.env("GIT_ALLOW_PROTOCOL", req.protocols);
            cmd.args(["clone", "--quiet", "--template=", "--single-branch", "--branch", &req.base, "--"]);
            cmd.arg(&req.url).arg(ws);
            git_ok(h, "clone", cmd, deadline).await
        }
        Mode::Cached => {
            let cache = refresh_cache(h, req, genv, deadline).await?;
            let mut cmd = genv.command(None);
            cmd.env("GIT_ALLOW_PROTOCOL", "file");
            cmd.args([
                "clone",
                "--quiet",
                "--template=",
                "--no-hardlinks",
                "--single-branch",
                "--branch",
                &req.base,
                "--",
            ]);
            cmd.arg(&cache).arg(ws);
            git_ok(h, "clone (from the cache)", cmd, deadline).await?;
            let mut cmd = genv.command(Some(workspace));
            cmd.arg("-C").arg(ws).args(["remote", "set-url", "origin", "--", &req.url]);
            git_ok(h, "remote set-url", cmd, deadline).await
        }
    }
}

/// The cache of `req.url` with `req.base` fetched now; made if missing.
async fn refresh_cache(
    h: Host<'_>,
    req: &Request,
    genv: &GitEnv,
    deadline: tokio::time::Instant,
) -> Result<PathBuf, RepoError> {
    let dir = h.state_dir.join("git-cache");
    super::identity::private_dir(&dir)?;
    let key = hex::encode(&sha2::Sha256::digest(req.url.as_bytes())[..16]);
    let _lock = lock(&dir.join(format!("{key}.lock"))).await?;
    let cache = dir.join(format!("{key}.git"));
    if cache.is_dir() {
        let mut cmd = genv.command(None);
        cmd.env("GIT_ALLOW_PROTOCOL", req.protocols);
        let refspec = format!("+refs/heads/{0}:refs/heads/{0}", req.base);
        // No automatic gc in the cache: clones never depend on it, but a
        // repack while another run clones would only cost time.
        cmd.arg("-C").arg(&cache).args(["-c", "gc.auto=0", "fetch", "--quiet", "--prune", "--no-tags", "--"]);
        cmd.arg(&req.url).arg(refspec);
        git_ok(h, "fetch (the cache)", cmd, deadline).await?;
    } else {
        let tmp = dir.join(format!(".{key}.{}", uuid::Uuid::new_v4().simple()));
        let mut cmd = genv.command(None);
        cmd.env("GIT_ALLOW_PROTOCOL", req.protocols);
        cmd.args([
            "clone",
            "--quiet",
            "--bare",
            "--template=",
            "--single-branch",
            "--no-tags",
            "--branch",
            &req.base,
        ]);
        cmd.arg("--").arg(&req.url).arg(&tmp);
        let made = git_ok(h, "clone (the cache)", cmd, deadline).await;
        let made = made.and_then(|()| std::fs::rename(&tmp, &cache).map_err(RepoError::CacheRename));
        if let Err(e) = made {
            let _ = h.blocking.run(move || std::fs::remove_dir_all(&tmp)).await;
            return Err(e);
        }
    }
    Ok(cache)
}

/// An exclusive `flock` on `path`, waited for up to [`LOCK_WAIT`] (the
/// kernel releases it if the holder dies, unlike a lock file).
async fn lock(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, RepoError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| RepoError::LockOpen { path: path.to_path_buf(), source })?;
    let give_up = tokio::time::Instant::now() + LOCK_WAIT;
    let mut file = file;
    loop {
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if tokio::time::Instant::now() < give_up => {
                file = f;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err((_, errno)) => return Err(RepoError::LockBusy { path: path.to_path_buf(), errno }),
        }
    }
}

async fn checkout(
    h: Host<'_>,
    req: &Request,
    genv: &GitEnv,
    workspace: &Path,
    deadline: tokio::time::Instant,
) -> Result<(), RepoError> {
    let run = |start: Option<String>| {
        let mut cmd = genv.command(Some(workspace));
        cmd.arg("-C").arg(workspace).args(["checkout", "--quiet", "-B", &req.branch]);
        if let Some(start) = start {
            cmd.arg(start);
        }
        cmd.arg("--");
        cmd
    };
    match git_ok(h, "checkout", run(Some(format!("origin/{}", req.base))), deadline).await {
        Ok(()) => Ok(()),
        // No such remote branch (an empty repository): the branch starts here.
        Err(first) => git_ok(h, "checkout", run(None), deadline).await.map_err(|_| first),
    }
}

/// Removes everything in `dir` (which was empty before we started).
fn empty_dir(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let r = match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p),
            _ => std::fs::remove_file(&p),
        };
        if let Err(err) = r {
            tracing::warn!("cleaning {} after a failed git preparation: {err}", p.display());
        }
    }
}

/// `lchown -R`: never follows a symlink out of the tree.
fn chown_tree(dir: &Path, uid: u32, gid: u32) -> Result<(), RepoError> {
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        if let Err(source) = std::os::unix::fs::lchown(&p, Some(uid), Some(gid)) {
            return Err(RepoError::Chown { path: p, source });
        }
        let walk = |source| RepoError::Walk { path: p.clone(), source };
        let meta = std::fs::symlink_metadata(&p).map_err(walk)?;
        if meta.is_dir() {
            for e in std::fs::read_dir(&p).map_err(walk)? {
                todo.push(e.map_err(walk)?.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let root = std::env::temp_dir().join(format!("tuixiu-repo-urls-{}", std::process::id()));
        std::fs::create_dir_all(root.join("r.git")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        for ok in [
            "https://github.com/a/b.git",
            "http://127.0.0.1:8080/r.git",
            "ssh://git@h/a/b",
            "git@github.com:a/b.git",
        ] {
            assert!(check_url(ok, &root).is_ok(), "{ok}");
        }
        assert_eq!(check_url(&root.join("r.git").display().to_string(), &root).unwrap(), "file");
        assert_eq!(check_url(&format!("file://{}", root.join("r.git").display()), &root).unwrap(), "file");
        for bad in [
            "https://user:pw@github.com/a/b.git",
            "ext::sh -c touch% /tmp/pwned",
            "ext::sh",
            "-uhttps://x",
            "/etc",
            "file:///etc",
            "ftp://h/r.git",
            "relative/path",
            "https://h/a b",
        ] {
            assert!(check_url(bad, &root).is_err(), "{bad}");
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn requests_from_env() {
        let root = std::env::temp_dir();
        let env = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert!(Request::from_env(&env(&[]), &root).unwrap().is_none());
        let url = ("TUIXIU_REPO_URL", "https://h/r.git");
        assert!(
            Request::from_env(&env(&[url]), &root).unwrap_err().to_string().contains("TUIXIU_RUN_BRANCH")
        );
        let r = Request::from_env(&env(&[url, ("TUIXIU_RUN_BRANCH", "run/1")]), &root).unwrap().unwrap();
        assert_eq!((r.base.as_str(), r.mode), ("main", Mode::Cached));
        let r = Request::from_env(
            &env(&[url, ("TUIXIU_RUN_BRANCH", "run/1"), ("TUIXIU_WORKSPACE_MODE", "clone")]),
            &root,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.mode, Mode::Clone);
        assert!(Request::from_env(&env(&[url, ("TUIXIU_RUN_BRANCH", "--force")]), &root).is_err());
        let pw = ("TUIXIU_REPO_URL", "https://u:pw@h/r.git");
        assert_eq!(
            Request::from_env(&env(&[pw, ("TUIXIU_RUN_BRANCH", "run/1")]), &root).unwrap_err().to_string(),
            "TUIXIU_REPO_URL \"https://u:pw@h/r.git\": carries a password, which would be on git's command \
             line: give it in TUIXIU_GIT_HTTP_PASSWORD instead"
        );
    }
}
