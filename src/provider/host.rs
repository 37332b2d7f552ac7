//! The host provider (`host_process`): commands run directly on this
//! machine, in the run's workspace, with the same explicit environment as
//! the sandboxed providers, and **no isolation at all**.
//!
//! It exists for developing agents and the daemon on machines where
//! neither namespaces nor a container engine are available. It must be
//! enabled explicitly (`--i-know-there-is-no-isolation`), and it warns on
//! every process it starts. Instances are records in `<state>/host/`, as
//! for the native provider.

use std::path::{Path, PathBuf};

use sandbox::{DEFAULT_PATH, Network, UserView, set_var};

use super::local::LocalInstances;
use super::process::set_stdio;
use super::process::{Killer, Process};
use super::records::{ProcKind, make_private_dir};
use super::{InstanceConfig, InstanceInfo, InvalidError, ProcessSpec, ProviderError, ProviderKind};

/// Printed (as a warning) every time the host provider starts a process.
pub const WARNING: &str =
    "host provider: running directly on this machine WITHOUT ANY ISOLATION (development only)";

pub struct HostProvider {
    local: LocalInstances,
    state_dir: PathBuf,
    acknowledged: bool,
}

impl HostProvider {
    /// Without `no_isolation_acknowledged`, the provider can inspect, list,
    /// stop and remove instances, but refuses to create one or to start
    /// any process ([`ProviderError::HostNotAcknowledged`]).
    pub fn new(
        state_dir: &Path,
        prefix: &str,
        no_isolation_acknowledged: bool,
    ) -> Result<Self, ProviderError> {
        Ok(HostProvider {
            local: LocalInstances::new(ProviderKind::Host, state_dir, prefix)?,
            state_dir: state_dir.to_path_buf(),
            acknowledged: no_isolation_acknowledged,
        })
    }

    /// Refuses to run anything unless the lack of isolation was acknowledged.
    pub fn check_acknowledged(&self) -> Result<(), ProviderError> {
        if self.acknowledged { Ok(()) } else { Err(ProviderError::HostNotAcknowledged) }
    }

    /// Checks an instance name (characters, length, prefix).
    pub fn check_name(&self, name: &str) -> Result<(), ProviderError> {
        self.local.check_name(name)
    }

    /// See `LocalInstances::end_stale_agent`.
    pub async fn end_stale_agent(&self, name: &str) -> bool {
        self.local.end_stale_agent(name).await
    }

    /// Records this process (which is about to `exec` the command, keeping
    /// its pid) so `stop` and `rm` reach it.
    pub fn track_self(&self, name: &str) -> Result<(), ProviderError> {
        self.local.track(name, std::process::id(), ProcKind::Exec).map(drop)
    }

    fn check_config(&self, config: &InstanceConfig) -> Result<(), ProviderError> {
        self.check_acknowledged()?;
        self.local.check_config(config)?;
        check_supported(config)
    }

    /// The home of a host run that is not an instance: the given directory,
    /// else `<state>/host/default-home`.
    pub fn default_home(&self) -> Result<PathBuf, ProviderError> {
        let home = self.state_dir.join(ProviderKind::Host.cli_name()).join("default-home");
        make_private_dir(&home)?;
        Ok(home)
    }

    /// [`Provider::ensure`] without a runtime (for the synchronous CLI).
    pub fn ensure_blocking(&self, config: &InstanceConfig) -> Result<InstanceInfo, ProviderError> {
        self.check_config(config)?;
        Ok(self.local.ensure(config, |_| Ok(()))?.0)
    }

    /// The command of a process in the (running) instance `name`.
    pub fn command_for(
        &self,
        name: &str,
        process: &ProcessSpec,
    ) -> Result<std::process::Command, ProviderError> {
        self.check_acknowledged()?;
        let record = self.local.running(name)?;
        command(&record.workspace, &record.home, &record.config.user, &record.config.env, process)
    }

    fn spawn(&self, name: &str, process: &ProcessSpec, kind: ProcKind) -> Result<Process, ProviderError> {
        let _lock = self.local.records.lock()?;
        if kind == ProcKind::Agent {
            self.local.check_no_agent(name)?;
        }
        let mut cmd = self.command_for(name, process)?;
        set_stdio(&mut cmd, process.stdio);
        // Its own process group, so a kill reaches what it starts.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        tracing::warn!("{WARNING}: {name}: {}", process.argv.join(" "));
        let child = tokio::process::Command::from(cmd)
            .spawn()
            .map_err(|e| ProviderError::Spawn { program: process.argv[0].clone(), source: e })?;
        let pid = child.id().ok_or(InvalidError::ExitedAtOnce("the process"))?;
        let forget = self.local.track(name, pid, kind)?;
        Ok(Process::new(child, Killer::for_pid(pid, true), Some(forget)))
    }
}

/// What the host provider cannot honour is refused, never ignored.
pub fn check_supported(config: &InstanceConfig) -> Result<(), ProviderError> {
    let refuse = |what: &'static str| Err(InvalidError::HostCannot { what }.into());
    if config.image.is_some() {
        return refuse("--image");
    }
    match config.network {
        Network::Off => return refuse("--network off"),
        Network::Proxied => return refuse("--network allow"),
        Network::On => {}
    }
    if config.workspace_read_only {
        return refuse("a read-only workspace");
    }
    if !config.limits.is_empty() {
        return refuse("resource limits");
    }
    if !config.mounts.is_empty() {
        return refuse("extra mounts");
    }
    if config.host_ids.is_some() {
        return refuse("--map-uid/--map-gid");
    }
    Ok(())
}

/// A host process for `process`: the environment of the user view with
/// `HOME` pointing at the host home, the working directory mapped from the
/// guest path onto the host directories (and checked to stay inside them,
/// symlinks resolved).
pub fn command(
    workspace: &Path,
    home: &Path,
    user: &UserView,
    base_env: &[(String, String)],
    process: &ProcessSpec,
) -> Result<std::process::Command, ProviderError> {
    let Some((program, args)) = process.argv.split_first() else {
        return Err(InvalidError::EmptyCommand.into());
    };
    super::check_env(base_env)?;
    super::check_env(&process.env)?;
    // A directory the caller resolved is entered by its descriptor; a path
    // is checked and mapped onto the host.
    let cwd = match &process.cwd_dir {
        Some(_) => None,
        None => {
            let guest =
                super::check_guest_cwd(process.cwd.as_deref().unwrap_or(sandbox::WORKSPACE), &user.home)?;
            Some(host_path(&guest, workspace, home, &user.home)?)
        }
    };

    let mut env = vec![
        ("PATH".to_string(), DEFAULT_PATH.to_string()),
        ("HOME".to_string(), home.display().to_string()),
        ("USER".to_string(), user.name.clone()),
        ("LOGNAME".to_string(), user.name.clone()),
        ("SHELL".to_string(), user.shell.clone()),
    ];
    for (k, v) in base_env.iter().chain(&process.env) {
        // The env pipeline speaks of the guest home; here it is the host's.
        let v = if k == "HOME" && *v == user.home { home.display().to_string() } else { v.clone() };
        set_var(&mut env, k.clone(), v);
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).env_clear().envs(env);
    match (cwd, &process.cwd_dir) {
        (Some(cwd), _) => {
            cmd.current_dir(cwd);
        }
        (None, Some(dir)) => {
            use std::os::unix::process::CommandExt;
            let dir = dir.0.clone();
            // SAFETY: fchdir is async-signal-safe; the closure owns the
            // descriptor, so it is open in the child.
            unsafe {
                cmd.pre_exec(move || {
                    nix::unistd::fchdir(std::os::fd::AsFd::as_fd(&*dir)).map_err(std::io::Error::from)
                })
            };
        }
        (None, None) => {}
    }
    Ok(cmd)
}

/// Maps a normalized guest path under `/workspace` or the guest home onto
/// the host, refusing one that a symlink leads out of its directory.
fn host_path(guest: &str, workspace: &Path, home: &Path, guest_home: &str) -> Result<PathBuf, ProviderError> {
    let (root, rest) = match guest.strip_prefix(sandbox::WORKSPACE) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => (workspace, rest),
        _ => (home, guest.strip_prefix(guest_home).unwrap_or("")),
    };
    let host = root.join(rest.trim_start_matches('/'));
    let canon = std::fs::canonicalize(&host).map_err(|e| ProviderError::WorkingDir {
        guest: guest.to_string(),
        host: host.clone(),
        source: e,
    })?;
    let root = std::fs::canonicalize(root)
        .map_err(|e| ProviderError::Canonicalize { path: root.to_path_buf(), source: e })?;
    if !canon.starts_with(&root) {
        return Err(InvalidError::SymlinkOut { guest: guest.to_string(), root }.into());
    }
    Ok(canon)
}

super::local::local_provider!(HostProvider, ProviderKind::Host);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_without_acknowledgement() {
        let state = std::env::temp_dir().join(format!("tuixiu-host-ack-{}", std::process::id()));
        let provider = HostProvider::new(&state, "", false).unwrap();
        let config = InstanceConfig::new("tuixiu-run-x", "x", "/");
        let err = provider.ensure_blocking(&config).unwrap_err();
        assert!(matches!(err, ProviderError::HostNotAcknowledged));
        assert!(err.to_string().contains("--i-know-there-is-no-isolation"), "{err}");
        let err = provider.command_for("tuixiu-run-x", &ProcessSpec::new(["true"])).unwrap_err();
        assert!(matches!(err, ProviderError::HostNotAcknowledged));
        assert!(!state.exists(), "nothing may be written before the acknowledgement");
    }

    #[test]
    fn guest_paths_map_onto_host_dirs() {
        let dir = std::env::temp_dir().join(format!("tuixiu-host-map-{}", std::process::id()));
        let ws = dir.join("ws");
        let home = dir.join("home");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        std::os::unix::fs::symlink("/etc", ws.join("out")).unwrap();
        let ws_c = std::fs::canonicalize(&ws).unwrap();
        assert_eq!(host_path("/workspace", &ws, &home, "/home/agent").unwrap(), ws_c);
        assert_eq!(host_path("/workspace/sub", &ws, &home, "/home/agent").unwrap(), ws_c.join("sub"));
        assert_eq!(
            host_path("/home/agent", &ws, &home, "/home/agent").unwrap(),
            std::fs::canonicalize(&home).unwrap()
        );
        let err = host_path("/workspace/out", &ws, &home, "/home/agent").unwrap_err().to_string();
        assert!(err.contains("leads out of"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
