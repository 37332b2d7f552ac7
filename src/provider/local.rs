//! The instance life cycle shared by the providers whose instances are
//! records in the state directory (native and host): create or reuse by
//! name, inspect, stop (end every recorded process), remove, list.
//!
//! These are short file operations; they run directly on the caller's
//! task. Only waiting for processes to end after a signal sleeps (async).

use std::path::Path;
use std::time::Duration;

use super::records::{LiveProc, ProcKind, Record, Records, make_private_dir};
use super::{
    ConflictError, InstanceConfig, InstanceInfo, InstanceStatus, InvalidError, ProviderError, ProviderKind,
    names,
};

/// How long processes get between SIGTERM and SIGKILL on `stop`.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

#[derive(Clone, Debug)]
pub(crate) struct LocalInstances {
    pub kind: ProviderKind,
    pub records: Records,
    pub prefix: String,
}

impl LocalInstances {
    pub fn new(kind: ProviderKind, state_dir: &Path, prefix: &str) -> Result<Self, ProviderError> {
        names::validate_prefix(prefix)?;
        Ok(LocalInstances { kind, records: Records::new(state_dir, kind), prefix: prefix.to_string() })
    }

    pub fn check_name(&self, name: &str) -> Result<(), ProviderError> {
        Ok(names::validate_instance_name(name, &self.prefix)?)
    }

    /// Checks what every provider requires of a config.
    pub fn check_config(&self, config: &InstanceConfig) -> Result<(), ProviderError> {
        self.check_name(&config.name)?;
        names::validate_run_id(&config.run_id)?;
        config.user.validate().map_err(InvalidError::UserView)?;
        super::check_env(&config.env)?;
        super::check_mounts(&config.mounts)?;
        if (config.network == sandbox::Network::Proxied) != config.egress.is_some() {
            return Err(InvalidError::EgressPolicy { network: config.network }.into());
        }
        Ok(())
    }

    /// Creates the record, or reuses it: a stopped instance becomes running.
    /// `check` vets a new record (its home already created) before it is
    /// saved; if it fails, nothing is left behind.
    pub fn ensure(
        &self,
        config: &InstanceConfig,
        check: impl Fn(&Record) -> Result<(), ProviderError>,
    ) -> Result<(InstanceInfo, Record), ProviderError> {
        let workspace = super::canonical_dir("workspace", &config.workspace)?;
        let home = match &config.home {
            Some(dir) => Some(super::canonical_dir("home", dir)?),
            None => None,
        };
        let _lock = self.records.lock()?;
        if let Some(mut record) = self.records.load(&config.name)? {
            self.check_reuse(&record, config, &workspace)?;
            // What must stay hidden applies to every process started from
            // now on, also in an instance made before it was asked for.
            let hidden_changed = record.config.hidden != config.hidden;
            if record.stopped || hidden_changed {
                record.stopped = false;
                record.config.hidden = config.hidden.clone();
                self.records.save(&record)?;
            }
            return Ok((record.info(self.kind), record));
        }
        let record = self.records.new_record(config, workspace, home);
        let created = (|| {
            if record.owns_home {
                make_private_dir(&record.home)?;
                super::records::restrict_dir(&record.home)?;
                if let Some(ids) = config.host_ids {
                    std::os::unix::fs::chown(&record.home, Some(ids.uid), Some(ids.gid)).map_err(|e| {
                        ProviderError::File { op: "chown", path: record.home.to_path_buf(), source: e }
                    })?;
                }
            }
            check(&record)?;
            self.records.save(&record)
        })();
        if let Err(e) = created {
            let _ = self.records.delete(&config.name);
            return Err(e);
        }
        tracing::info!(
            "{}: created instance {} (workspace {})",
            self.kind.cli_name(),
            config.name,
            record.workspace.display()
        );
        Ok((record.info(self.kind), record))
    }

    fn check_reuse(
        &self,
        record: &Record,
        config: &InstanceConfig,
        workspace: &Path,
    ) -> Result<(), ProviderError> {
        if record.config.run_id != config.run_id {
            return Err(ConflictError::OtherRun {
                name: config.name.clone(),
                found: record.config.run_id.clone(),
                wanted: config.run_id.clone(),
            }
            .into());
        }
        if record.workspace != workspace {
            return Err(ConflictError::OtherWorkspace {
                name: config.name.clone(),
                existing: record.workspace.clone(),
                workspace: workspace.to_path_buf(),
            }
            .into());
        }
        Ok(())
    }

    pub fn inspect(&self, name: &str) -> Result<InstanceInfo, ProviderError> {
        self.check_name(name)?;
        Ok(self.records.info(name, self.kind)?.unwrap_or_else(|| InstanceInfo::missing(self.kind, name)))
    }

    /// The record of a running instance, for starting a process in it.
    pub fn running(&self, name: &str) -> Result<Record, ProviderError> {
        self.check_name(name)?;
        let record = self.records.load(name)?.ok_or_else(|| ProviderError::Missing(name.to_string()))?;
        let info = record.info(self.kind);
        match info.status {
            InstanceStatus::Running => Ok(record),
            InstanceStatus::Error => Err(InvalidError::InstanceError {
                name: name.to_string(),
                last_error: info.last_error.unwrap_or_default(),
            }
            .into()),
            status => Err(ProviderError::NotRunning { name: name.to_string(), status: status.as_str() }),
        }
    }

    /// Refuses a second live agent in one instance.
    pub fn check_no_agent(&self, name: &str) -> Result<(), ProviderError> {
        if let Some(agent) =
            self.records.live_procs(name).iter().find(|p| p.kind == ProcKind::Agent && p.alive())
        {
            return Err(ConflictError::AgentRunning { name: name.to_string(), pid: agent.pid }.into());
        }
        Ok(())
    }

    /// Ends an agent left running by a previous daemon (its stdio is gone
    /// with that daemon, so nobody can talk to it) and waits until it has
    /// really exited, so the new one can start; true if there was one.
    pub async fn end_stale_agent(&self, name: &str) -> bool {
        let agents: Vec<_> = self
            .records
            .live_procs(name)
            .into_iter()
            .filter(|p| p.kind == ProcKind::Agent && p.alive())
            .collect();
        if agents.is_empty() {
            return false;
        }
        tracing::warn!("{name}: ending an agent a previous daemon left running (pid {})", agents[0].pid);
        end_processes(agents).await;
        true
    }

    /// Marks the instance stopped (no new process can start) and ends its
    /// processes: SIGTERM, then SIGKILL after [`STOP_GRACE`].
    pub async fn stop(&self, name: &str) -> Result<InstanceInfo, ProviderError> {
        self.check_name(name)?;
        {
            let _lock = self.records.lock()?;
            let Some(mut record) = self.records.load(name)? else {
                return Ok(InstanceInfo::missing(self.kind, name));
            };
            if !record.stopped {
                record.stopped = true;
                self.records.save(&record)?;
            }
        }
        end_processes(self.records.live_procs(name)).await;
        self.inspect(name)
    }

    /// Stops the instance and deletes its record and default home.
    pub async fn remove(&self, name: &str) -> Result<InstanceInfo, ProviderError> {
        self.stop(name).await?;
        let _lock = self.records.lock()?;
        self.records.delete(name)?;
        Ok(InstanceInfo::missing(self.kind, name))
    }

    pub fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError> {
        let mut out = Vec::new();
        for name in self.records.names()? {
            if self.check_name(&name).is_err() {
                continue;
            }
            out.push(match self.records.info(&name, self.kind) {
                Ok(Some(info)) => info,
                Ok(None) => continue,
                Err(e) => {
                    let mut info = InstanceInfo::missing(self.kind, &name);
                    info.status = InstanceStatus::Error;
                    info.last_error = Some(e.to_string());
                    info
                }
            });
        }
        Ok(out)
    }

    /// Records a process so `stop` can find it; returns the hook that
    /// forgets it once reaped.
    pub fn track(
        &self,
        name: &str,
        pid: u32,
        kind: ProcKind,
    ) -> Result<Box<dyn FnOnce() + Send + Sync>, ProviderError> {
        self.records.add_proc(name, pid, kind)?;
        let records = self.records.clone();
        let name = name.to_string();
        Ok(Box::new(move || records.remove_proc(&name, pid)))
    }
}

/// How long a process may take to exit after SIGKILL (its sandbox's
/// teardown: the kernel reaps a whole pid namespace) before we give up.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// SIGTERM to every process, SIGKILL to those still alive after the grace,
/// then waits (on pidfds) until each has really exited.
async fn end_processes(procs: Vec<LiveProc>) {
    // The pidfds are opened (and checked against the recorded start
    // times) once: every signal and wait below is about these processes,
    // never about a recycled pid.
    let sandboxes: Vec<(LiveProc, std::os::fd::OwnedFd)> = procs
        .iter()
        .filter_map(|p| p.sandbox)
        .map(|(pid, start)| LiveProc { pid, start, kind: ProcKind::Exec, sandbox: None })
        .filter_map(|p| p.pidfd().map(|fd| (p, fd)))
        .collect();
    let procs: Vec<(LiveProc, std::os::fd::OwnedFd)> =
        procs.into_iter().filter_map(|p| p.pidfd().map(|fd| (p, fd))).collect();
    if procs.is_empty() && sandboxes.is_empty() {
        return;
    }
    for (p, _) in &procs {
        p.signal(libc::SIGTERM);
    }
    let mut left = wait_exits(procs, STOP_GRACE).await;
    for (p, _) in &left {
        tracing::warn!("process {} did not end within {:?} of SIGTERM: sending SIGKILL", p.pid, STOP_GRACE);
        p.signal(libc::SIGKILL);
    }
    left = wait_exits(left, KILL_WAIT).await;
    // A sandbox's PID 1 dies with its launcher (parent-death signal), and
    // its pid namespace with it; until then its processes still run.
    let mut sandboxes = wait_exits(sandboxes, KILL_WAIT).await;
    for (p, _) in &sandboxes {
        tracing::warn!("the sandbox of PID 1 {} outlived its launcher: sending SIGKILL", p.pid);
        p.signal(libc::SIGKILL);
    }
    sandboxes = wait_exits(sandboxes, KILL_WAIT).await;
    for (p, _) in left.iter().chain(&sandboxes) {
        tracing::error!("process {} is still running {:?} after SIGKILL", p.pid, KILL_WAIT);
    }
}

/// Waits up to `bound` for the processes to exit (their pidfds become
/// readable); returns those still running.
async fn wait_exits(
    procs: Vec<(LiveProc, std::os::fd::OwnedFd)>,
    bound: Duration,
) -> Vec<(LiveProc, std::os::fd::OwnedFd)> {
    let deadline = tokio::time::Instant::now() + bound;
    let mut left = Vec::new();
    for (p, fd) in procs {
        if !crate::pidfd::exited_by(&fd, deadline).await {
            left.push((p, fd));
        }
    }
    left
}

/// `Provider` for a provider whose instances are [`LocalInstances`]
/// (native, host): `ensure_blocking`, `spawn` and the shared life cycle.
macro_rules! local_provider {
    ($ty:ty, $kind:expr) => {
        impl $ty {
            /// `inspect` without waiting: a read of the instance's record
            /// and a `statx` (microseconds), on the caller's thread.
            pub fn inspect_now(
                &self,
                name: &str,
            ) -> Result<$crate::provider::InstanceInfo, $crate::provider::ProviderError> {
                self.local.inspect(name)
            }
        }

        impl $crate::provider::Provider for $ty {
            fn kind(&self) -> $crate::provider::ProviderKind {
                $kind
            }

            async fn ensure(
                &self,
                config: &$crate::provider::InstanceConfig,
            ) -> Result<$crate::provider::InstanceInfo, $crate::provider::ProviderError> {
                self.ensure_blocking(config)
            }

            async fn inspect(
                &self,
                name: &str,
            ) -> Result<$crate::provider::InstanceInfo, $crate::provider::ProviderError> {
                self.local.inspect(name)
            }

            async fn spawn_agent(
                &self,
                name: &str,
                spec: &$crate::provider::ProcessSpec,
            ) -> Result<$crate::provider::Process, $crate::provider::ProviderError> {
                self.spawn(name, spec, $crate::provider::records::ProcKind::Agent)
            }

            async fn exec(
                &self,
                name: &str,
                spec: &$crate::provider::ProcessSpec,
            ) -> Result<$crate::provider::Process, $crate::provider::ProviderError> {
                self.spawn(name, spec, $crate::provider::records::ProcKind::Exec)
            }

            async fn stop(
                &self,
                name: &str,
            ) -> Result<$crate::provider::InstanceInfo, $crate::provider::ProviderError> {
                self.local.stop(name).await
            }

            async fn remove(
                &self,
                name: &str,
            ) -> Result<$crate::provider::InstanceInfo, $crate::provider::ProviderError> {
                self.local.remove(name).await
            }

            async fn list(
                &self,
            ) -> Result<Vec<$crate::provider::InstanceInfo>, $crate::provider::ProviderError> {
                self.local.list()
            }
        }
    };
}
pub(crate) use local_provider;
