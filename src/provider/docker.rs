//! The docker provider (`container_oci`): instances are containers driven
//! through the `docker` CLI (or `podman`, `nerdctl`); no daemon API client.
//!
//! * An instance is `docker run -d --init --name <instance_name>` with the
//!   labels `acp-proxy.managed=1`, `acp-proxy.run_id=<run_id>`,
//!   `acp-proxy.agent_mode=exec` (the Node proxy's labels, so its
//!   containers are recognised), the workspace bound at `/workspace`, the
//!   home bound at the user's home, the user view's `/etc/passwd` and
//!   `/etc/group` bound read-only, `--user uid:gid`, `--cap-drop=ALL`,
//!   `no-new-privileges`, limits, and a keeper as its main process.
//! * Processes are `docker exec -i`, killed inside the container (the CLI
//!   does not forward signals to an exec'd process).
//! * Environment variables reach the CLI through `--env-file=/dev/fd/N`, an
//!   in-memory file: never on a command line (`ps` would show secrets),
//!   never on disk.
//! * Status and inventory come from `inspect` and `ps -a --filter
//!   label=acp-proxy.managed=1`; "no such container" means `missing`; every
//!   other CLI failure is an error carrying the CLI's own stderr.
//!
//! Names and images are validated before any CLI call, and nothing the
//! provider did not create (label `acp-proxy.managed=1`) is ever stopped,
//! removed or reused.

pub mod argv;
mod inspect;
mod volumes;

pub use argv::kill_command;
pub use volumes::{SCRATCH, Volumes, as_container_user, as_user};

use self::inspect::Inspected;
use self::volumes::give_to_user;

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::argv::{AGENT_MODE_EXEC, EXEC_MARKER, InstancePaths, LABEL_AGENT_MODE, LABEL_MANAGED};
use super::process::{Killer, Process, memfd_with, pass_fd, random_hex, set_stdio};
use super::records::{make_private_dir, restrict_dir};
use super::{
    ConflictError, InstanceConfig, InstanceInfo, InstanceStatus, InvalidError, Mount, ProcessSpec, Provider,
    ProviderError, ProviderKind, check_env, check_guest_cwd, names,
};

/// The container CLIs this provider can drive.
pub const SUPPORTED_CLIS: &[&str] = &["docker", "podman", "nerdctl"];

/// How much of a CLI's stderr an error message carries.
const STDERR_LIMIT: usize = 2000;

pub struct DockerProvider {
    cli: String,
    prefix: String,
    /// `<state>/docker`: per-instance homes and user databases.
    state: PathBuf,
    /// Names with an `ensure` in progress: reported as `creating`.
    creating: Mutex<HashSet<String>>,
    /// One lock per name, so two ensures of one instance do not race.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The docker CLI process of each instance's live agent.
    agents: Mutex<HashMap<String, super::records::LiveProc>>,
}

impl DockerProvider {
    /// `cli` is `docker`, `podman` or `nerdctl` (looked up in `PATH`).
    pub fn new(cli: &str, state_dir: &Path, prefix: &str) -> Result<Self, ProviderError> {
        if !SUPPORTED_CLIS.contains(&cli) {
            return Err(
                InvalidError::UnsupportedCli { cli: cli.to_string(), supported: SUPPORTED_CLIS }.into()
            );
        }
        names::validate_prefix(prefix)?;
        Ok(DockerProvider {
            cli: cli.to_string(),
            prefix: prefix.to_string(),
            state: state_dir.join(ProviderKind::Docker.cli_name()),
            creating: Mutex::new(HashSet::new()),
            locks: Mutex::new(HashMap::new()),
            agents: Mutex::new(HashMap::new()),
        })
    }

    pub fn cli(&self) -> &str {
        &self.cli
    }

    /// A fresh name for a one-off container: the prefix and 12 random hex digits.
    pub fn one_off_name(&self) -> String {
        format!("{}{}", self.prefix, &random_hex()[..12])
    }

    pub fn check_name(&self, name: &str) -> Result<(), ProviderError> {
        Ok(names::validate_instance_name(name, &self.prefix)?)
    }

    /// `<state>/docker/<name>`: what this provider keeps for an instance.
    fn instance_dir(&self, name: &str) -> PathBuf {
        self.state.join(name)
    }

    /// `<state>/docker/<name>/landed.json`: what `run --manifest` landed
    /// in the instance's volumes (`inputs::landed`); removed with it.
    pub fn landed_file(&self, name: &str) -> PathBuf {
        self.instance_dir(name).join("landed.json")
    }

    /// `<state>/docker/<name>/incoming`: the new content of items left
    /// alone over the command's work (`inputs::landed::land_aside`).
    pub fn incoming_dir(&self, name: &str) -> PathBuf {
        self.instance_dir(name).join("incoming")
    }

    fn command(&self, args: &[String]) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.cli);
        cmd.args(args);
        cmd
    }

    /// Runs the CLI to completion; a non-zero exit becomes
    /// [`ProviderError::Cli`] with its stderr.
    async fn run(&self, args: &[String], target: &str) -> Result<std::process::Output, ProviderError> {
        tracing::debug!("{} {}", self.cli, args.join(" "));
        let mut cmd = tokio::process::Command::from(self.command(args));
        cmd.stdin(std::process::Stdio::null());
        let out = cmd.output().await.map_err(|e| self.spawn_error(e))?;
        if out.status.success() {
            return Ok(out);
        }
        Err(self.cli_error(args, target, &out))
    }

    pub(crate) fn spawn_error(&self, e: std::io::Error) -> ProviderError {
        ProviderError::CliSpawn { program: self.cli.clone(), source: e }
    }

    fn cli_error(&self, args: &[String], target: &str, out: &std::process::Output) -> ProviderError {
        let sub = args.first().map(String::as_str).unwrap_or("");
        ProviderError::Cli {
            cli: self.cli.clone(),
            sub: sub.to_string(),
            target: target.to_string(),
            status: out.status,
            stderr: clip(&String::from_utf8_lossy(&out.stderr)),
        }
    }

    fn name_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(name.to_string()).or_default().clone()
    }

    /// Checks a config before anything runs.
    pub fn check_config(&self, config: &InstanceConfig) -> Result<String, ProviderError> {
        self.check_name(&config.name)?;
        names::validate_run_id(&config.run_id)?;
        let image = config.image.as_deref().ok_or(InvalidError::NoImage)?;
        names::validate_image(image)?;
        config.user.validate().map_err(InvalidError::UserView)?;
        names::validate_instance_name(&config.hostname, "")
            .map_err(|e| InvalidError::Hostname { hostname: config.hostname.clone(), source: e })?;
        check_env(&config.env)?;
        super::check_mounts(&config.mounts)?;
        if config.network == sandbox::Network::Proxied || config.egress.is_some() {
            return Err(InvalidError::DockerProxied.into());
        }
        check_mount_path("workspace", &config.workspace.to_string_lossy())?;
        if let Some(home) = &config.home {
            check_mount_path("home", &home.to_string_lossy())?;
        }
        for mount in &config.mounts {
            let dst = match mount {
                Mount::Bind { src, dst, .. } => {
                    check_mount_path("bind source", &src.to_string_lossy())?;
                    dst
                }
                Mount::Tmpfs { dst } => dst,
            };
            let norm = sandbox::guest_path::normalize(dst).map_err(|why| InvalidError::NotClean {
                what: "mount destination",
                path: dst.to_string(),
                why,
            })?;
            check_mount_path("mount destination", &norm)?;
            if norm == "/" || norm == sandbox::WORKSPACE || norm == config.user.home {
                return Err(InvalidError::HidesMount { dst: dst.to_string() }.into());
            }
        }
        let limits = &config.limits;
        if let Some(cpus) = limits.cpus
            && !(cpus.is_finite() && cpus > 0.0)
        {
            return Err(InvalidError::Cpus(cpus).into());
        }
        if limits.memory == Some(0) || limits.pids == Some(0) {
            return Err(InvalidError::ZeroLimit.into());
        }
        Ok(image.to_string())
    }

    /// Writes what an instance's container binds from the host: the user
    /// database and, unless the caller gave one, the home.
    fn prepare_host_files(
        &self,
        config: &InstanceConfig,
        with_home: bool,
    ) -> Result<HostFiles, ProviderError> {
        let dir = self.instance_dir(&config.name);
        make_private_dir(&dir)?;
        let etc = dir.join("etc");
        make_private_dir(&etc)?;
        // The engine (root) reads these through the 0700 directories.
        let passwd = etc.join("passwd");
        let group = etc.join("group");
        for (path, bytes) in [(&passwd, config.user.passwd_bytes()), (&group, config.user.group_bytes())] {
            std::fs::write(path, bytes).map_err(|e| ProviderError::File {
                op: "write",
                path: path.to_path_buf(),
                source: e,
            })?;
        }
        let home = match (&config.home, with_home) {
            (Some(home), _) => Some(super::canonical_dir("home", home)?),
            (None, true) => {
                let home = dir.join("home");
                make_private_dir(&home)?;
                restrict_dir(&home)?;
                give_to_user(&home, &config.user)?;
                Some(home)
            }
            (None, false) => None,
        };
        Ok(HostFiles { dir, passwd, group, home })
    }

    /// `inspect` of one container; a missing one is `None`.
    async fn inspect_one(&self, name: &str) -> Result<Option<Inspected>, ProviderError> {
        let args = vec!["inspect".to_string(), "--type=container".into(), "--".into(), name.to_string()];
        let out = match self.run(&args, name).await {
            Ok(out) => out,
            Err(ProviderError::Cli { stderr, .. }) if inspect::is_no_such(&stderr) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(inspect::parse(&self.cli, &out.stdout)?.into_iter().find(|i| i.info.name == name))
    }

    /// The container of a managed instance, or why it cannot be used.
    async fn managed(&self, name: &str) -> Result<Option<Inspected>, ProviderError> {
        self.check_name(name)?;
        match self.inspect_one(name).await? {
            Some(found) if !found.managed => Err(ProviderError::NotManaged(name.to_string())),
            other => Ok(other),
        }
    }

    fn info_of(&self, name: &str, found: Option<Inspected>) -> InstanceInfo {
        let mut info = match found {
            Some(found) => found.info,
            None => InstanceInfo {
                runtime: Some(self.cli.clone()),
                ..InstanceInfo::missing(ProviderKind::Docker, name)
            },
        };
        let creating = self.creating.lock().unwrap_or_else(|p| p.into_inner()).contains(name);
        if creating && info.status != InstanceStatus::Running {
            info.status = InstanceStatus::Creating;
        }
        info
    }

    async fn ensure_locked(
        &self,
        config: &InstanceConfig,
        image: &str,
    ) -> Result<InstanceInfo, ProviderError> {
        let name = &config.name;
        let mut found = self.managed(name).await?;
        if found.is_none() {
            found = self.create(config, image).await?;
        }
        let Some(found) = found else {
            return Err(ProviderError::Missing(name.clone()));
        };
        self.check_reuse(config, image, &found)?;
        match found.info.status {
            InstanceStatus::Running => return Ok(found.info),
            InstanceStatus::Error => {
                return Err(ConflictError::InError {
                    name: name.clone(),
                    last_error: found.info.last_error.unwrap_or_default(),
                }
                .into());
            }
            _ if found.paused => {
                self.run(&["unpause".into(), "--".into(), name.clone()], name).await?;
            }
            InstanceStatus::Stopped => {
                // The host files behind its binds may have been cleaned
                // away (a wiped state directory): recreate them, or the
                // engine refuses to start it.
                if !self.instance_dir(name).join("etc/passwd").exists() {
                    self.prepare_host_files(config, true)?;
                }
                self.run(&["start".into(), "--".into(), name.clone()], name).await?;
            }
            // Created or restarting: the engine is on it; wait below.
            _ => {}
        }
        // Starting is asynchronous in some engines: wait until it runs.
        for _ in 0..100 {
            let now = self.inspect_one(name).await?.ok_or_else(|| ProviderError::Missing(name.clone()))?;
            match now.info.status {
                InstanceStatus::Running => return Ok(now.info),
                InstanceStatus::Stopped | InstanceStatus::Error if !now.paused => {
                    return Err(ConflictError::DidNotStay {
                        name: name.clone(),
                        state: now.info.status.as_str(),
                        last_error: now.info.last_error,
                    }
                    .into());
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        Err(ConflictError::NotRunningInTime { name: name.clone() }.into())
    }

    fn check_reuse(
        &self,
        config: &InstanceConfig,
        image: &str,
        found: &Inspected,
    ) -> Result<(), ProviderError> {
        let name = &config.name;
        if found.agent_mode.as_deref() != Some(AGENT_MODE_EXEC) {
            return Err(ConflictError::AgentMode {
                name: name.to_string(),
                label: LABEL_AGENT_MODE,
                agent_mode: found.agent_mode.clone().unwrap_or_default(),
            }
            .into());
        }
        if found.info.run_id.as_deref() != Some(config.run_id.as_str()) {
            return Err(ConflictError::OtherRun {
                name: name.to_string(),
                found: found.info.run_id.clone().unwrap_or_default(),
                wanted: config.run_id.clone(),
            }
            .into());
        }
        if let Some(existing) = &found.info.image
            && existing != image
        {
            return Err(ConflictError::OtherImage {
                name: name.to_string(),
                existing: existing.clone(),
                image: image.to_string(),
            }
            .into());
        }
        let workspace = super::canonical_dir("workspace", &config.workspace)?;
        if let Some(existing) = &found.info.workspace
            && *existing != workspace
        {
            return Err(ConflictError::OtherWorkspace {
                name: name.to_string(),
                existing: existing.clone(),
                workspace: workspace.clone(),
            }
            .into());
        }
        Ok(())
    }

    /// `run -d`. Returns the new container's state, or the one that a
    /// concurrent creator made first.
    async fn create(&self, config: &InstanceConfig, image: &str) -> Result<Option<Inspected>, ProviderError> {
        let name = &config.name;
        let workspace = super::canonical_dir("workspace", &config.workspace)?;
        let files = self.prepare_host_files(config, true)?;
        let env = instance_env(config);
        let env_fd = memfd_with("tuixiu-sandbox-env", &argv::env_file(&env))?;
        let seccomp_fd = memfd_with("tuixiu-sandbox-seccomp", sandbox::seccomp::engine_profile().as_bytes())?;
        let seccomp = fd_path(&seccomp_fd);
        let paths = InstancePaths {
            workspace: &workspace,
            home: files.home.as_deref(),
            passwd: &files.passwd,
            group: &files.group,
            seccomp: &seccomp,
        };
        let args = argv::create(config, &paths, image, &fd_path(&env_fd));
        tracing::debug!("{} {}", self.cli, args.join(" "));
        let mut cmd = self.command(&args);
        cmd.stdin(std::process::Stdio::null());
        pass_fd(&mut cmd, env_fd.as_raw_fd());
        pass_fd(&mut cmd, seccomp_fd.as_raw_fd());
        let out = tokio::process::Command::from(cmd).output().await.map_err(|e| self.spawn_error(e))?;
        drop((env_fd, seccomp_fd));
        if out.status.success() {
            tracing::info!("docker: created instance {name} from {image}");
            return self.inspect_one(name).await;
        }
        let err = self.cli_error(&args, name, &out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("already in use") {
            // Another creator won the race; reuse what it made.
            return self.managed(name).await;
        }
        // `run -d` creates before it starts: a failed start leaves a
        // container behind, which is ours (the name was free).
        let _ = self.run(&["rm".into(), "-f".into(), "--".into(), name.clone()], name).await;
        let _ = std::fs::remove_dir_all(&files.dir);
        Err(err)
    }

    /// Makes the host directories behind an instance's volumes and points
    /// `config` at them, so inputs can be written into them before the
    /// container starts (a manifest's copy, writeFile and downloadExtract
    /// items; its bind items become [`Mount::Bind`]s of `config`):
    ///
    /// * the workspace: `config.workspace`, as given;
    /// * the home: `config.home`, else `<state>/docker/<name>/home`, which
    ///   becomes `config.home` (so a one-off container binds it instead of
    ///   a tmpfs, and it is removed with the instance's other host files);
    /// * with `scratch`, `<state>/docker/<name>/scratch`, bound read-write
    ///   at [`SCRATCH`].
    ///
    /// Directories made here belong to the container's user when we are
    /// root. Write into them through [`Volumes::writable`] under
    /// [`as_container_user`], so what lands there belongs to that user too.
    pub fn prepare_volumes(
        &self,
        config: &mut InstanceConfig,
        scratch: bool,
    ) -> Result<Volumes, ProviderError> {
        self.check_name(&config.name)?;
        let workspace = super::canonical_dir("workspace", &config.workspace)?;
        let dir = self.instance_dir(&config.name);
        make_private_dir(&dir)?;
        let user = config.user.clone();
        let own_dir = |sub: &str| -> Result<PathBuf, ProviderError> {
            let path = dir.join(sub);
            make_private_dir(&path)?;
            restrict_dir(&path)?;
            give_to_user(&path, &user)?;
            Ok(path)
        };
        let home = match &config.home {
            Some(home) => super::canonical_dir("home", home)?,
            None => own_dir("home")?,
        };
        config.home = Some(home.clone());
        let scratch = if scratch {
            let path = own_dir("scratch")?;
            config.mounts.push(Mount::Bind {
                src: path.clone(),
                dst: SCRATCH.into(),
                access: sandbox::Access::Rw,
            });
            Some(path)
        } else {
            None
        };
        Volumes::open(workspace, home, scratch)
    }

    /// Builds the `exec` of one process in a running instance: the command,
    /// the env memfd it reads, and the exec marker.
    pub fn exec_command(
        &self,
        name: &str,
        process: &ProcessSpec,
        home: &str,
    ) -> Result<(std::process::Command, OwnedFd, String), ProviderError> {
        self.check_name(name)?;
        if process.argv.is_empty() {
            return Err(InvalidError::EmptyCommand.into());
        }
        check_env(&process.env)?;
        let cwd = check_guest_cwd(process.cwd.as_deref().unwrap_or(sandbox::WORKSPACE), home)?;
        let exec_id = random_hex();
        let mut env = process.env.clone();
        env.push((EXEC_MARKER.to_string(), exec_id.clone()));
        let env_fd = memfd_with("tuixiu-sandbox-env", &argv::env_file(&env))?;
        let args = argv::exec(name, &fd_path(&env_fd), &cwd, &process.argv);
        tracing::debug!("{} {}", self.cli, args.join(" "));
        let mut cmd = self.command(&args);
        pass_fd(&mut cmd, env_fd.as_raw_fd());
        Ok((cmd, env_fd, exec_id))
    }

    /// Builds a one-off `run --rm -i` (no instance kept): the command, the
    /// memfds it reads (environment, seccomp profile) to keep open until
    /// it has run, and the host files to delete once it has ended.
    pub fn run_once_command(
        &self,
        config: &InstanceConfig,
        process: &ProcessSpec,
    ) -> Result<(std::process::Command, [OwnedFd; 2], HostFiles), ProviderError> {
        let image = self.check_config(config)?;
        if process.argv.is_empty() {
            return Err(InvalidError::EmptyCommand.into());
        }
        check_env(&process.env)?;
        let cwd = check_guest_cwd(process.cwd.as_deref().unwrap_or(sandbox::WORKSPACE), &config.user.home)?;
        let workspace = super::canonical_dir("workspace", &config.workspace)?;
        let files = self.prepare_host_files(config, false)?;
        let mut env = instance_env(config);
        env.extend(process.env.iter().cloned());
        let env_fd = memfd_with("tuixiu-sandbox-env", &argv::env_file(&env))?;
        let seccomp_fd = memfd_with("tuixiu-sandbox-seccomp", sandbox::seccomp::engine_profile().as_bytes())?;
        let seccomp = fd_path(&seccomp_fd);
        let paths = InstancePaths {
            workspace: &workspace,
            home: files.home.as_deref(),
            passwd: &files.passwd,
            group: &files.group,
            seccomp: &seccomp,
        };
        let args = argv::run_once(config, &paths, &image, &fd_path(&env_fd), &cwd, &process.argv);
        tracing::debug!("{} {}", self.cli, args.join(" "));
        let mut cmd = self.command(&args);
        pass_fd(&mut cmd, env_fd.as_raw_fd());
        pass_fd(&mut cmd, seccomp_fd.as_raw_fd());
        Ok((cmd, [env_fd, seccomp_fd], files))
    }

    /// The guest home of a running, managed instance (its `HOME`), after
    /// checking that it runs.
    async fn running_home(&self, name: &str) -> Result<String, ProviderError> {
        let found = self.managed(name).await?.ok_or_else(|| ProviderError::Missing(name.to_string()))?;
        if found.info.status != InstanceStatus::Running {
            return Err(ProviderError::NotRunning {
                name: name.to_string(),
                status: found.info.status.as_str(),
            });
        }
        Ok(found.home.unwrap_or_else(|| "/root".to_string()))
    }

    fn spawn(
        &self,
        name: &str,
        process: &ProcessSpec,
        home: &str,
        agent: bool,
    ) -> Result<Process, ProviderError> {
        // Held across the spawn, so two agents cannot start at once.
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        if agent && let Some(live) = agents.get(name).filter(|a| a.alive()) {
            return Err(ConflictError::AgentRunningCli { name: name.to_string(), pid: live.pid }.into());
        }
        let (mut cmd, env_fd, exec_id) = self.exec_command(name, process, home)?;
        set_stdio(&mut cmd, process.stdio);
        let child = tokio::process::Command::from(cmd).spawn().map_err(|e| self.spawn_error(e))?;
        drop(env_fd);
        let pid = child.id().ok_or(InvalidError::ExitedAtOnce("the docker CLI"))?;
        if agent && let Some(start) = super::records::start_time(pid as i32) {
            let live = super::records::LiveProc {
                pid: pid as i32,
                start,
                kind: super::records::ProcKind::Agent,
                sandbox: None,
            };
            agents.insert(name.to_string(), live);
        }
        drop(agents);
        let killer = Killer::for_container_exec(&self.cli, name, None, &exec_id, pid);
        Ok(Process::new(child, killer, None))
    }
}

/// The host files behind an instance container.
pub struct HostFiles {
    /// `<state>/docker/<name>`.
    pub dir: PathBuf,
    pub passwd: PathBuf,
    pub group: PathBuf,
    pub home: Option<PathBuf>,
}

impl HostFiles {
    /// Deletes what was made for a one-off container.
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The container-level environment: the user view, then the instance's own.
/// `PATH` stays the image's.
fn instance_env(config: &InstanceConfig) -> Vec<(String, String)> {
    let user = &config.user;
    let mut env = vec![
        ("HOME".to_string(), user.home.clone()),
        ("USER".to_string(), user.name.clone()),
        ("LOGNAME".to_string(), user.name.clone()),
        ("SHELL".to_string(), user.shell.clone()),
    ];
    env.extend(config.env.iter().cloned());
    env
}

fn fd_path(fd: &OwnedFd) -> String {
    format!("/dev/fd/{}", fd.as_raw_fd())
}

/// Paths end up in `--mount=type=bind,source=...` (CSV) and `--tmpfs=dst:opts`.
fn check_mount_path(what: &'static str, path: &str) -> Result<(), ProviderError> {
    if path.contains([',', '"', ':', '\n', '\0']) {
        return Err(InvalidError::CliPath { what, path: path.to_string() }.into());
    }
    Ok(())
}

fn clip(text: &str) -> String {
    let text = text.trim();
    let one_line: String =
        text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" / ");
    if one_line.len() <= STDERR_LIMIT {
        return one_line;
    }
    let mut cut = STDERR_LIMIT;
    while !one_line.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &one_line[..cut])
}

impl Provider for DockerProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Docker
    }

    fn runtime(&self) -> Option<&str> {
        Some(&self.cli)
    }

    async fn ensure(&self, config: &InstanceConfig) -> Result<InstanceInfo, ProviderError> {
        let image = self.check_config(config)?;
        let lock = self.name_lock(&config.name);
        let _guard = lock.lock().await;
        self.creating.lock().unwrap_or_else(|p| p.into_inner()).insert(config.name.clone());
        let result = self.ensure_locked(config, &image).await;
        self.creating.lock().unwrap_or_else(|p| p.into_inner()).remove(&config.name);
        result
    }

    async fn inspect(&self, name: &str) -> Result<InstanceInfo, ProviderError> {
        self.check_name(name)?;
        let found = self.inspect_one(name).await?;
        Ok(self.info_of(name, found))
    }

    async fn spawn_agent(&self, name: &str, spec: &ProcessSpec) -> Result<Process, ProviderError> {
        let home = self.running_home(name).await?;
        self.spawn(name, spec, &home, true)
    }

    async fn exec(&self, name: &str, spec: &ProcessSpec) -> Result<Process, ProviderError> {
        let home = self.running_home(name).await?;
        self.spawn(name, spec, &home, false)
    }

    async fn stop(&self, name: &str) -> Result<InstanceInfo, ProviderError> {
        let lock = self.name_lock(name);
        let _guard = lock.lock().await;
        let Some(found) = self.managed(name).await? else {
            return Ok(self.info_of(name, None));
        };
        if found.info.status != InstanceStatus::Stopped || found.paused {
            match self.run(&["stop".into(), "--".into(), name.to_string()], name).await {
                Ok(_) => {}
                Err(ProviderError::Cli { stderr, .. }) if inspect::is_no_such(&stderr) => {}
                Err(e) => return Err(e),
            }
        }
        let found = self.inspect_one(name).await?;
        Ok(self.info_of(name, found))
    }

    async fn remove(&self, name: &str) -> Result<InstanceInfo, ProviderError> {
        let lock = self.name_lock(name);
        let _guard = lock.lock().await;
        if self.managed(name).await?.is_some() {
            match self.run(&["rm".into(), "-f".into(), "--".into(), name.to_string()], name).await {
                Ok(_) => {}
                Err(ProviderError::Cli { stderr, .. }) if inspect::is_no_such(&stderr) => {}
                Err(e) => return Err(e),
            }
        }
        let dir = self.instance_dir(name);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ProviderError::File { op: "remove", path: dir.to_path_buf(), source: e }),
        }
        self.agents.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        Ok(self.info_of(name, None))
    }

    async fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError> {
        let args = vec![
            "ps".to_string(),
            "-a".into(),
            "--no-trunc".into(),
            format!("--filter=label={LABEL_MANAGED}=1"),
            "--format={{.Names}}".into(),
        ];
        let out = self.run(&args, "").await?;
        let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|n| self.check_name(n).is_ok())
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut args = vec!["inspect".to_string(), "--type=container".into(), "--".into()];
        args.extend(names.iter().cloned());
        let mut cmd = tokio::process::Command::from(self.command(&args));
        cmd.stdin(std::process::Stdio::null());
        let out = cmd.output().await.map_err(|e| self.spawn_error(e))?;
        // A container removed between `ps` and `inspect` makes the CLI fail
        // for that one name but still print the others.
        let inspected = match inspect::parse(&self.cli, &out.stdout) {
            Ok(found) => found,
            Err(_) if !out.status.success() => return Err(self.cli_error(&args, "", &out)),
            Err(e) => return Err(e),
        };
        let mut infos: Vec<InstanceInfo> = inspected
            .into_iter()
            .filter(|i| i.managed && names.contains(&i.info.name))
            .map(|i| i.info)
            .collect();
        infos.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(infos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_cli_is_refused() {
        let err = DockerProvider::new("sh", Path::new("/x"), "").err().unwrap().to_string();
        assert!(err.contains("not supported"), "{err}");
    }

    #[test]
    fn stderr_is_clipped_to_one_line() {
        assert_eq!(clip("a\n\n b \n"), "a / b");
        assert!(clip(&"x".repeat(5000)).len() < 2100);
    }
}
