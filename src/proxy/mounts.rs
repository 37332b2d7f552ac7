//! What the daemon mounts into every run's instance besides `/workspace`,
//! the home and `sandbox.volumes`:
//!
//! | guest path | host side | access |
//! |---|---|---|
//! | `/scratch` | `<state>/scratch/<run_id>` (0700), the manifest's SCRATCH root | rw |
//! | `agent.statePath` | `<state>/agents/<agent id>/state` (0700), shared by the agent's runs | rw |
//! | `/run/secrets/<name>` | `[sandbox.secretFiles]` (native: the file itself; docker: a 0400 copy owned by the container user) | ro |
//!
//! Not mounted, but kept here per run too: `<state>/incoming/<run_id>`, the
//! new content of agentInputs items left alone over the agent's work
//! ([`Mounts::incoming_dir`]).
//!
//! The scratch is a host directory rather than a tmpfs (which `run
//! --manifest` uses): SCRATCH items land before the agent starts, and the
//! init script, the agent and its terminals are separate processes that
//! must all see them. It lives as long as the instance and is removed with
//! it ([`discard`]).
//!
//! The agent's state directory keeps what the agent itself stores (its session
//! files, e.g. `~/.codex/sessions`) across runs and sandboxes, so
//! `session/load` finds a session after the sandbox was recreated (docs/acp.md,
//! "What every instance gets"). It is shared by every run of this daemon's
//! agent: an agent can read the sessions of its other runs, which is what it
//! needs to load them. It is opt-in (`agent.statePath`).
//!
//! Secret files never pass through the workspace or the home, and their
//! content is added to the redactor, so an agent echoing one on stderr
//! shows `[REDACTED]`.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sandbox::{Access, UserView};

use super::config::{Config, ProviderChoice};
use super::identity::IdentityError;
use crate::provider::Mount;
use sandbox::error::io_error_text;

/// Why the host side of an instance's mounts could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(transparent)]
    Dir(#[from] IdentityError),
    #[error(
        "agent.statePath {guest} would hide the run's home {home}: \
         mount it below the home (e.g. {home}/.codex/sessions) or elsewhere"
    )]
    StateOverHome { guest: String, home: String },
    #[error("secret file {}: {}", .file.display(), io_error_text(.source))]
    ReadSecret { file: PathBuf, source: std::io::Error },
    #[error("staging secret {}: {}", .dst.display(), io_error_text(.source))]
    StageSecret { dst: PathBuf, source: std::io::Error },
}

/// Guest directory of the secret files.
pub const SECRETS_DIR: &str = "/run/secrets";
/// Guest path of the SCRATCH root.
pub const SCRATCH_DIR: &str = crate::manifest::SCRATCH_DIR;
/// Largest secret file read for redaction (bigger ones are mounted, not redacted).
const REDACT_MAX: u64 = 64 * 1024;

/// What the instances' extra mounts are made from: the part of the config
/// they need, taken once when the daemon starts (shared by the instance and
/// agent parts and the lanes' loop).
pub struct Mounts {
    state_dir: PathBuf,
    provider: ProviderChoice,
    /// `agent.statePath`.
    state_path: Option<String>,
    /// `[sandbox.secretFiles]`.
    secret_files: Vec<(String, PathBuf)>,
    proxy_id: String,
    /// The workspace root and the state directory, canonical: no
    /// instance may see them (`InstanceConfig::hidden`).
    hidden: Vec<PathBuf>,
}

impl Mounts {
    pub fn new(cfg: &Config, proxy_id: &str) -> Mounts {
        Mounts {
            state_dir: cfg.state_dir.clone(),
            provider: cfg.sandbox.provider,
            state_path: cfg.agent.state_path.clone(),
            secret_files: cfg.sandbox.secret_files.clone(),
            proxy_id: proxy_id.to_string(),
            hidden: [&cfg.sandbox.workspace_host_root, &cfg.state_dir]
                .into_iter()
                .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
                .collect(),
        }
    }

    /// What no instance may see by any path: every run's workspace and
    /// home (the workspace root) and the daemon's state.
    pub fn hidden(&self) -> &[PathBuf] {
        &self.hidden
    }

    fn scratch_dir(&self, run_id: &str) -> PathBuf {
        self.state_dir.join("scratch").join(run_id)
    }

    fn secrets_dir(&self, run_id: &str) -> PathBuf {
        self.state_dir.join("secrets").join(run_id)
    }

    /// `<state>/incoming/<run_id>`: the new content of agentInputs items
    /// that were left alone because the agent changed their targets
    /// (`inputs::landed::land_aside`). It belongs to the run, not to its
    /// instance: only forgetting the run removes it.
    pub fn incoming_dir(&self, run_id: &str) -> PathBuf {
        self.state_dir.join("incoming").join(run_id)
    }

    /// The host directory behind `/scratch` of run `run_id` (`None` for the
    /// host provider, which cannot show it there).
    pub fn scratch_dir_of(&self, run_id: &str) -> Option<PathBuf> {
        (self.provider != ProviderChoice::Host).then(|| self.scratch_dir(run_id))
    }

    /// `<state>/agents/<agent id>/state` (the proxy id is validated: letters,
    /// digits, `_.-`).
    pub fn agent_state_dir(&self) -> PathBuf {
        self.state_dir.join("agents").join(&self.proxy_id).join("state")
    }

    /// Makes the host directories and files and returns the mounts for the
    /// run's instance. `home_guest` is the run's home: the state directory
    /// must lie below it or elsewhere, never over it.
    pub fn prepare(&self, run_id: &str, user: &UserView, home_guest: &str) -> Result<Vec<Mount>, MountError> {
        let provider = self.provider;
        if provider == ProviderChoice::Host {
            // No mount namespace: nothing can be shown at a guest path (the
            // config refuses statePath and secretFiles with this provider).
            return Ok(Vec::new());
        }
        let docker = provider == ProviderChoice::Docker;
        let mut mounts = Vec::new();

        let scratch = self.scratch_dir(run_id);
        private_dir(&scratch)?;
        if docker {
            chown_new(&scratch, user);
        }
        mounts.push(Mount::Bind { src: scratch.clone(), dst: SCRATCH_DIR.into(), access: Access::Rw });

        if let Some(guest) = &self.state_path {
            if sandbox::guest_path::is_within(home_guest, guest) {
                return Err(MountError::StateOverHome { guest: guest.clone(), home: home_guest.to_string() });
            }
            let host = self.agent_state_dir();
            private_dir(&host)?;
            if docker {
                chown_new(&host, user);
            }
            mounts.push(Mount::Bind { src: host, dst: guest.clone(), access: Access::Rw });
        }

        if !self.secret_files.is_empty() {
            let staged = self.secrets_dir(run_id);
            if docker {
                private_dir(&staged)?;
            }
            for (name, file) in &self.secret_files {
                let src = if docker { stage_secret(file, &staged.join(name), user)? } else { file.clone() };
                mounts.push(Mount::Bind { src, dst: format!("{SECRETS_DIR}/{name}"), access: Access::Ro });
            }
        }
        Ok(mounts)
    }

    /// Removes the run's scratch and staged secrets (its instance is gone):
    /// renamed aside at once, so a new instance of the same run starts empty,
    /// and deleted off the daemon's thread (a scratch can be large).
    pub fn discard(&self, run_id: &str) {
        self.discard_dirs(run_id, [self.scratch_dir(run_id), self.secrets_dir(run_id)]);
    }

    /// Removes what the run kept aside ([`Mounts::incoming_dir`]), as
    /// [`Mounts::discard`] does.
    pub fn discard_incoming(&self, run_id: &str) {
        self.discard_dirs(run_id, [self.incoming_dir(run_id)]);
    }

    fn discard_dirs<const N: usize>(&self, run_id: &str, dirs: [PathBuf; N]) {
        for dir in dirs {
            let trash = dir.with_file_name(format!(".{run_id}.removed-{}", uuid::Uuid::new_v4().simple()));
            match std::fs::rename(&dir, &trash) {
                Ok(()) => {
                    tokio::task::spawn_blocking(move || {
                        if let Err(e) = std::fs::remove_dir_all(&trash) {
                            tracing::warn!("removing {}: {e}", trash.display());
                        }
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("run {run_id}: removing {}: {e}", dir.display()),
            }
        }
    }

    /// At startup: what a previous daemon left half-removed (scratch and
    /// staged secrets renamed aside) and the private directories of git
    /// operations it did not finish (they may hold an SSH key).
    pub fn sweep_leftovers(&self) {
        let state = &self.state_dir;
        let mut doomed = Vec::new();
        for (dir, is_leftover) in [
            (
                state.join("scratch"),
                (|n: &str| n.starts_with('.') && n.contains(".removed-")) as fn(&str) -> bool,
            ),
            (state.join("secrets"), |n: &str| n.starts_with('.') && n.contains(".removed-")),
            (state.join("incoming"), |n: &str| n.starts_with('.') && n.contains(".removed-")),
            (state.join("tmp"), |n: &str| n.starts_with("git-")),
        ] {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for e in entries.flatten() {
                if e.file_name().to_str().is_some_and(is_leftover) {
                    doomed.push(e.path());
                }
            }
        }
        if doomed.is_empty() {
            return;
        }
        tokio::task::spawn_blocking(move || {
            for path in doomed {
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::warn!("removing the leftover {}: {e}", path.display());
                }
            }
        });
    }
}

fn private_dir(dir: &Path) -> Result<(), MountError> {
    Ok(super::identity::private_dir(dir)?)
}

/// Gives a directory the daemon just created to the container user (docker
/// runs processes as that uid, unlike the native sandbox's id map).
pub fn chown_new(dir: &Path, user: &UserView) {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    if let Ok(meta) = std::fs::metadata(dir)
        && std::os::unix::fs::MetadataExt::uid(&meta) == 0
        && let Err(e) = std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid))
    {
        tracing::warn!("chown {} to {}:{}: {e}", dir.display(), user.uid, user.gid);
    }
}

/// A copy of secret `file` at `dst`, 0400 and owned by the container user
/// (there is no user namespace between the host and a container: the
/// original, often root's 0600, would be unreadable inside). Rewritten in
/// place when the original changed, so the bind (of this inode) shows the
/// new content.
fn stage_secret(file: &Path, dst: &Path, user: &UserView) -> Result<PathBuf, MountError> {
    let content =
        std::fs::read(file).map_err(|source| MountError::ReadSecret { file: file.to_path_buf(), source })?;
    if std::fs::read(dst).is_ok_and(|old| old == content) {
        return Ok(dst.to_path_buf());
    }
    let what = |source: std::io::Error| MountError::StageSecret { dst: dst.to_path_buf(), source };
    let _ = std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o600));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dst)
        .map_err(what)?;
    f.write_all(&content).map_err(what)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o400)).map_err(what)?;
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::fchown(&f, Some(user.uid), Some(user.gid)).map_err(what)?;
    }
    Ok(dst.to_path_buf())
}

/// The contents of the secret files, for the redactor.
pub fn secret_values(files: &[(String, PathBuf)]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, path) in files {
        match std::fs::metadata(path) {
            Ok(m) if m.len() <= REDACT_MAX => match std::fs::read_to_string(path) {
                Ok(text) => out.push(text.trim().to_string()),
                Err(e) => tracing::warn!("sandbox.secretFiles.{name}: cannot read it for redaction: {e}"),
            },
            Ok(_) => tracing::warn!(
                "sandbox.secretFiles.{name}: larger than {REDACT_MAX} bytes, so its content is not redacted from logs"
            ),
            Err(e) => tracing::warn!("sandbox.secretFiles.{name}: {e}"),
        }
    }
    out
}
