//! The native provider: the namespace sandbox of the `sandbox` crate.
//!
//! An instance is the run's host directories (workspace and home) plus the
//! sandbox template (user view, network, hostname, extra mounts, base
//! environment), recorded in `<state>/native/<name>/`. Nothing runs while
//! no process does: every process is a fresh sandbox built from the
//! template, so files in the workspace and the home persist between
//! processes, and a process started later sees what an earlier one wrote.
//!
//! Processes are launched by `tuixiu-sandbox __exec --spec-fd N` (the
//! single-threaded launcher; a threaded caller must never clone into
//! namespaces itself) with the spec on an in-memory file.
//!
//! Joining the namespaces of a sandbox that is already running (a terminal
//! next to the agent, sharing its `/tmp` and processes) is not done here:
//! [`NativeProvider::exec`] starts a sibling sandbox over the same
//! directories. The seam for it is [`NativeProvider::spec_for`], which
//! yields the exact spec a joining launcher would need.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use sandbox::{Home, MountOp, NestedUserns, SandboxBuilder, SandboxSpec};

use super::local::LocalInstances;
use super::process::{Killer, Process, memfd_with, pass_fd, set_stdio};
use super::records::{ProcKind, Record};
use super::{InstanceConfig, InstanceInfo, InvalidError, Mount, ProcessSpec, ProviderError, ProviderKind};
use crate::egress;

pub struct NativeProvider {
    local: LocalInstances,
    launcher: PathBuf,
    /// `(read end, write end)` of the lifeline every launcher watches
    /// (`__exec --lifeline-fd`): only this process holds the write end, so
    /// when it exits, however it exits, its sandboxes are killed.
    lifeline: Option<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)>,
    /// How the proxies of instances with `--network allow` are served.
    egress: Egress,
    /// Counters every sandbox's portal adds to (`__exec
    /// --nested-counts-fd`), with the file handed to the launchers.
    nested_counts: Option<(sandbox::nested::Tally, std::os::fd::OwnedFd)>,
}

/// Where a proxied sandbox's refusals go, with the instance's run id (the
/// daemon: an event to the backend).
pub trait EgressReports: Send + Sync + 'static {
    fn denied(&self, run_id: &str, instance: &str, denial: &egress::Denial);
}

/// Refusals as log lines.
struct LogReports;

impl EgressReports for LogReports {
    fn denied(&self, _run_id: &str, instance: &str, denial: &egress::Denial) {
        tracing::warn!("{instance}: egress proxy: {denial}");
    }
}

/// The proxies of this provider's sandboxes, served on the caller's
/// runtime: one per sandbox, with counters per instance (kept in its
/// directory for `instances` and `inspect`).
struct Egress {
    reports: Arc<dyn EgressReports>,
    resolver: egress::Resolver,
    stats: Mutex<HashMap<String, Weak<egress::Stats>>>,
}

/// One sandbox's reports: its instance and run.
struct SandboxReports {
    reports: Arc<dyn EgressReports>,
    run_id: String,
    instance: String,
}

impl egress::Events for SandboxReports {
    fn denied(&self, denial: &egress::Denial) {
        self.reports.denied(&self.run_id, &self.instance, denial);
    }
}

impl NativeProvider {
    /// A provider keeping its records under `state_dir/native`, launching
    /// sandboxes with `launcher` (the `tuixiu-sandbox` binary), accepting
    /// instance names with `prefix`.
    pub fn new(state_dir: &Path, launcher: impl Into<PathBuf>, prefix: &str) -> Result<Self, ProviderError> {
        let resolver = egress::Resolver::from_env()
            .map_err(|e| ProviderError::Sys { op: "set up the egress proxies' resolver", source: e })?;
        Ok(NativeProvider {
            local: LocalInstances::new(ProviderKind::Native, state_dir, prefix)?,
            launcher: launcher.into(),
            lifeline: None,
            nested_counts: None,
            egress: Egress { reports: Arc::new(LogReports), resolver, stats: Mutex::default() },
        })
    }

    /// Refusals of the egress proxies go to `reports` (by default, log lines).
    pub fn with_egress_reports(mut self, reports: Arc<dyn EgressReports>) -> Self {
        self.egress.reports = reports;
        self
    }

    /// The egress policy of instance `name` (`--network allow`), if any.
    pub fn egress_policy(&self, name: &str) -> Result<Option<egress::Policy>, ProviderError> {
        Ok(self.local.running(name)?.config.egress)
    }

    /// The file where instance `name`'s egress counters are kept.
    pub fn egress_counts_file(&self, name: &str) -> PathBuf {
        self.local.records.dir(name).join(egress::COUNTS_FILE)
    }

    /// Sandboxes started from now on count how their nested requests end
    /// (the daemon's metrics): one set of counters for all of them.
    pub fn with_nested_counts(mut self) -> Result<Self, ProviderError> {
        let counts = sandbox::nested::Tally::create().map_err(|e| ProviderError::Sys {
            op: "make the nested sandboxes' counters",
            source: std::io::Error::other(e),
        })?;
        self.nested_counts = Some(counts);
        Ok(self)
    }

    /// How the nested requests of every sandbox started since
    /// [`NativeProvider::with_nested_counts`] ended, so far.
    pub fn nested_counts(&self) -> Option<sandbox::nested::NestedCounts> {
        self.nested_counts.as_ref().map(|(tally, _)| tally.counts())
    }

    /// Sandboxes started from now on die with this process (the daemon:
    /// nobody could talk to an agent whose stdio went with it). A
    /// parent-death signal would not do: it fires when the *thread* that
    /// spawned the launcher ends, not the process.
    pub fn with_lifeline(mut self) -> Result<Self, ProviderError> {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| ProviderError::Sys {
            op: "pipe2 (the sandboxes' lifeline)",
            source: std::io::Error::from(e),
        })?;
        self.lifeline = Some((r, w));
        Ok(self)
    }

    /// As [`NativeProvider::new`], launching with the small launcher next
    /// to this executable (or this executable itself).
    pub fn with_current_exe(state_dir: &Path, prefix: &str) -> Result<Self, ProviderError> {
        let exe = crate::exe::launcher_exe()
            .map_err(|e| ProviderError::Sys { op: "find the launcher executable", source: e })?;
        Self::new(state_dir, exe, prefix)
    }

    /// Checks an instance name (characters, length, prefix).
    pub fn check_name(&self, name: &str) -> Result<(), ProviderError> {
        self.local.check_name(name)
    }

    fn check_config(&self, config: &InstanceConfig) -> Result<(), ProviderError> {
        self.local.check_config(config)?;
        if config.image.is_some() {
            return Err(InvalidError::NativeImage.into());
        }
        if !config.limits.is_empty() {
            return Err(InvalidError::NativeLimits.into());
        }
        Ok(())
    }

    /// [`Provider::ensure`] without a runtime (for the synchronous CLI).
    pub fn ensure_blocking(&self, config: &InstanceConfig) -> Result<InstanceInfo, ProviderError> {
        self.check_config(config)?;
        // Building a throw-away spec checks the template now (mount
        // sources and destinations, user view) rather than at the first process.
        let (info, _) =
            self.local.ensure(config, |record| build_spec(record, &ProcessSpec::new(["true"])).map(drop))?;
        Ok(info)
    }

    /// The sandbox spec of a process in the (running) instance `name`.
    /// `tuixiu-sandbox run --provider native --instance-name N` launches it
    /// in-process; the daemon hands it to `__exec`.
    pub fn spec_for(&self, name: &str, process: &ProcessSpec) -> Result<SandboxSpec, ProviderError> {
        let record = self.local.running(name)?;
        build_spec(&record, process)
    }

    /// Records an in-process launch (the CLI's own pid) so `stop` and `rm`
    /// reach it; the returned hook forgets it.
    pub fn track_self(&self, name: &str) -> Result<Box<dyn FnOnce() + Send + Sync>, ProviderError> {
        self.local.track(name, std::process::id(), ProcKind::Exec)
    }

    /// Starts the agent and waits until it runs; returns it with the host
    /// pid of its sandbox's PID 1 (from the launcher's `--json-status-fd`),
    /// whose `/proc/<pid>/root` is the agent's filesystem and whose
    /// namespaces terminals join.
    pub async fn spawn_agent_reporting(
        &self,
        name: &str,
        process: &ProcessSpec,
    ) -> Result<(Process, u32), ProviderError> {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| ProviderError::Sys { op: "pipe2", source: std::io::Error::from(e) })?;
        let mut proc = self.spawn_with(name, process, ProcKind::Agent, Some(w), None)?;
        let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(r)
            .map_err(|e| ProviderError::Sys { op: "watch the launcher's status", source: e })?;
        let mut lines = tokio::io::BufReader::new(reader);
        let mut line = String::new();
        loop {
            line.clear();
            let n = tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut line)
                .await
                .map_err(|e| ProviderError::Sys { op: "read the launcher's status", source: e })?;
            if n == 0 {
                // The launcher ended before the command ran: its exit
                // status and stderr tell why.
                let status = proc.wait().await?;
                let mut why = String::new();
                if let Some(mut err) = proc.stderr.take() {
                    let _ = tokio::io::AsyncReadExt::read_to_string(&mut err, &mut why).await;
                }
                let stderr = why.lines().last().unwrap_or("").trim().to_string();
                return Err(InvalidError::SandboxStart { status, stderr }.into());
            }
            let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_default();
            if let Some(pid) = v.get("child-pid").and_then(serde_json::Value::as_u64) {
                // A later daemon that finds this agent left over waits for
                // its whole sandbox, not only its launcher.
                if let Some(launcher) = proc.pid()
                    && let Err(e) =
                        self.local.records.note_sandbox(name, launcher, ProcKind::Agent, pid as u32)
                {
                    tracing::warn!("{name}: recording the agent's sandbox: {e}");
                }
                return Ok((proc, pid as u32));
            }
        }
    }

    /// See `LocalInstances::end_stale_agent`.
    pub async fn end_stale_agent(&self, name: &str) -> bool {
        self.local.end_stale_agent(name).await
    }

    /// A process in the running sandbox of PID `pid1` (the agent's): the
    /// same mount tree, `/tmp`, processes and user view.
    pub async fn exec_joined(
        &self,
        name: &str,
        pid1: u32,
        process: &ProcessSpec,
    ) -> Result<Process, ProviderError> {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| ProviderError::Sys { op: "pipe2", source: std::io::Error::from(e) })?;
        let mut proc = self.spawn_with(name, process, ProcKind::Exec, Some(w), Some(pid1))?;
        let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(r)
            .map_err(|e| ProviderError::Sys { op: "watch the joiner's status", source: e })?;
        let mut line = String::new();
        let n = tokio::io::AsyncBufReadExt::read_line(&mut tokio::io::BufReader::new(reader), &mut line)
            .await
            .map_err(|e| ProviderError::Sys { op: "read the joiner's status", source: e })?;
        let child = serde_json::from_str::<serde_json::Value>(line.trim())
            .ok()
            .and_then(|v| v.get("child-pid").and_then(serde_json::Value::as_u64));
        match child {
            Some(pid) if n > 0 => {
                proc.group_killer = Some(Killer::for_pid(pid as u32, true));
                Ok(proc)
            }
            _ => {
                // The joiner ended before the command ran: its stderr says why.
                let status = proc.wait().await?;
                let mut why = String::new();
                if let Some(mut err) = proc.stderr.take() {
                    let _ = tokio::io::AsyncReadExt::read_to_string(&mut err, &mut why).await;
                }
                let stderr = why.lines().last().unwrap_or("").trim().to_string();
                Err(InvalidError::JoinFailed { status, stderr }.into())
            }
        }
    }

    fn spawn(&self, name: &str, process: &ProcessSpec, kind: ProcKind) -> Result<Process, ProviderError> {
        self.spawn_with(name, process, kind, None, None)
    }

    /// The launcher's arguments for what it joins or is tied to: the
    /// sandbox to join (and the directory to start in), else the lifeline
    /// and the nested counters; the status descriptor when asked for.
    fn pass_descriptors(
        &self,
        cmd: &mut std::process::Command,
        process: &ProcessSpec,
        join_pid: Option<u32>,
        status_fd: Option<&std::os::fd::OwnedFd>,
    ) {
        match (join_pid, &self.lifeline) {
            (Some(pid), _) => {
                cmd.arg(format!("--join-pid={pid}"));
                if let Some(dir) = &process.cwd_dir {
                    // Open until `spawn` below has exec'd the launcher.
                    cmd.arg(format!("--cwd-fd={}", dir.0.as_raw_fd()));
                    pass_fd(cmd, dir.0.as_raw_fd());
                }
            }
            (None, Some((lifeline, _))) => {
                cmd.arg(format!("--lifeline-fd={}", lifeline.as_raw_fd()));
                pass_fd(cmd, lifeline.as_raw_fd());
            }
            (None, None) => {}
        }
        if let (None, Some((_, fd))) = (join_pid, &self.nested_counts) {
            cmd.arg(format!("--nested-counts-fd={}", fd.as_raw_fd()));
            pass_fd(cmd, fd.as_raw_fd());
        }
        if let Some(fd) = status_fd {
            cmd.arg(format!("--json-status-fd={}", fd.as_raw_fd()));
            pass_fd(cmd, fd.as_raw_fd());
        }
    }

    /// The egress proxy of sandbox `name`, reporting to the run.
    fn egress_proxy(&self, name: &str, run_id: &str, policy: &egress::Policy) -> egress::Proxy {
        egress::Proxy {
            policy: policy.clone(),
            limits: egress::Limits::default(),
            resolver: self.egress.resolver.clone(),
            stats: self.egress_stats(name),
            events: Arc::new(SandboxReports {
                reports: self.egress.reports.clone(),
                run_id: run_id.to_string(),
                instance: name.to_string(),
            }),
        }
    }

    fn spawn_with(
        &self,
        name: &str,
        process: &ProcessSpec,
        kind: ProcKind,
        status_fd: Option<std::os::fd::OwnedFd>,
        join_pid: Option<u32>,
    ) -> Result<Process, ProviderError> {
        let _lock = self.local.records.lock()?;
        let record = self.local.running(name)?;
        if kind == ProcKind::Agent {
            self.local.check_no_agent(name)?;
        }
        let spec = build_spec(&record, process)?;
        let spec_fd = memfd_with("tuixiu-sandbox-spec", &spec.to_json())?;
        let mut cmd = std::process::Command::new(&self.launcher);
        cmd.arg("__exec").arg(format!("--spec-fd={}", spec_fd.as_raw_fd()));
        // The launcher needs nothing from our environment: the command's
        // environment is in the spec.
        cmd.env_clear();
        if let Some(filter) = std::env::var_os("TUIXIU_LOG") {
            cmd.env("TUIXIU_LOG", filter);
        }
        set_stdio(&mut cmd, process.stdio);
        pass_fd(&mut cmd, spec_fd.as_raw_fd());
        self.pass_descriptors(&mut cmd, process, join_pid, status_fd.as_ref());
        // A sandbox of its own with a proxied network: its listener comes
        // back on this socket, and its proxy lives as long as its launcher.
        let handoff = match (&record.config.egress, join_pid) {
            (Some(_), None) => {
                let (launcher_end, ours) = egress::socket_pair().map_err(|e| ProviderError::Sys {
                    op: "socketpair (the egress listener's)",
                    source: e,
                })?;
                cmd.arg(format!("--egress-fd={}", launcher_end.as_raw_fd()));
                pass_fd(&mut cmd, launcher_end.as_raw_fd());
                Some((launcher_end, egress::Handoff::new(ours)))
            }
            _ => None,
        };
        let child = tokio::process::Command::from(cmd)
            .spawn()
            .map_err(|e| ProviderError::Spawn { program: self.launcher.display().to_string(), source: e })?;
        drop(spec_fd);
        drop(status_fd);
        let pid = child.id().ok_or(InvalidError::ExitedAtOnce("the launcher"))?;
        let forget = self.local.track(name, pid, kind)?;
        let on_exit: Box<dyn FnOnce() + Send + Sync> = match (handoff, &record.config.egress) {
            (Some((launcher_end, handoff)), Some(policy)) => {
                drop(launcher_end);
                let proxy = self.egress_proxy(name, &record.config.run_id, policy);
                let task = handoff
                    .serve(Arc::new(proxy))
                    .map_err(|e| ProviderError::Sys { op: "serve the egress proxy", source: e })?;
                Box::new(move || {
                    drop(task);
                    forget();
                })
            }
            _ => forget,
        };
        Ok(Process::new(child, Killer::for_pid(pid, false), Some(on_exit)))
    }

    /// The egress counters of instance `name`, shared by its sandboxes and
    /// kept in its directory while any of them runs.
    fn egress_stats(&self, name: &str) -> Arc<egress::Stats> {
        let mut all = self.egress.stats.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(stats) = all.get(name).and_then(Weak::upgrade) {
            return stats;
        }
        // The counters' writer goes with the proxies, off the caller's runtime.
        let _proxies = egress::proxies().ok().map(|handle| handle.enter());
        let stats = egress::keep_counts(self.egress_counts_file(name));
        all.retain(|_, weak| weak.strong_count() > 0);
        all.insert(name.to_string(), Arc::downgrade(&stats));
        stats
    }
}

/// The sandbox of one process: the instance's template, then the process's
/// command, environment and working directory.
fn build_spec(record: &Record, process: &ProcessSpec) -> Result<SandboxSpec, ProviderError> {
    let config = &record.config;
    let Some((program, args)) = process.argv.split_first() else {
        return Err(InvalidError::EmptyCommand.into());
    };
    super::check_env(&process.env)?;
    let mut builder = SandboxBuilder::new(program.clone())
        .args(args.iter().cloned())
        .user(config.user.clone())
        .home(Home::Bind(record.home.clone()))
        .network(config.network)
        .hostname(config.hostname.clone())
        .new_session(true)
        .nested(config.nested)
        .nested_userns(if config.nested_userns { NestedUserns::On } else { NestedUserns::Off });
    builder = if config.workspace_read_only {
        // The builder's workspace is read-write; a read-only one is a bind
        // of its own, still the default working directory.
        builder
            .mount(MountOp::Bind {
                src: record.workspace.clone(),
                dst: sandbox::WORKSPACE.into(),
                access: sandbox::Access::Ro,
            })
            .cwd(sandbox::WORKSPACE)
    } else {
        builder.workspace(record.workspace.clone())
    };
    if let Some(ids) = config.host_ids {
        builder = builder.map_to_host(ids);
    }
    for mount in &config.mounts {
        builder = builder.mount(match mount {
            Mount::Bind { src, dst, access } => {
                MountOp::Bind { src: src.clone(), dst: dst.clone(), access: *access }
            }
            Mount::Tmpfs { dst } => {
                MountOp::Tmpfs { dst: dst.clone(), mode: 0o755, owned_by_user: true, size: None }
            }
        });
    }
    for host in &config.hidden {
        builder = builder.hide(host.clone());
    }
    for (key, value) in config.env.iter().chain(&process.env) {
        builder = builder.env(key.clone(), value.clone());
    }
    if let Some(cwd) = &process.cwd {
        builder = builder.cwd(cwd.clone());
    }
    builder.build().map_err(|e| InvalidError::Spec(e).into())
}

super::local::local_provider!(NativeProvider, ProviderKind::Native);
