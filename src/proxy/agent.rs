//! The run's agent, as its lane drives it (docs/protocol.md, "acp_open",
//! "prompt_send", "The init script"): `acp_open` lands agentInputs, runs the
//! bootstrap and the init script, starts `agent_command` in the instance and
//! `initialize`s it; `prompt_send` runs one turn on its own task; session
//! controls, `session_cancel`, `session_permission` and `acp_message` reach the
//! agent directly, never queued behind a prompt.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use super::config::{Bootstrap, Config};
use super::landing::{self, Landing, LandingError};
use super::mounts::Mounts;
use super::protocol::{AcpReply, Content, PromptResult, ProxyUpdate, RunMessage, str_field};
use super::repo::{Checkouts, RepoError};
use super::report::Reporter;
use super::shared::{
    AgentSlot, Job, RunSlot, RunState, Runs, init_env, reply_prompt, reply_session, send, user_name,
};
use crate::acp::client::{Client, Spawner};
use crate::acp::fs::{GuestError, GuestFs};
use crate::acp::host::Agent;
use crate::acp::port::Context;
use crate::env::{Allowlist, EnvError, UserVars};
use crate::inputs::landed::Landed;
use crate::manifest::ManifestError;
use crate::provider::{AnyProvider, Process, ProcessSpec, Provider, ProviderError, Stdio};

/// Prompt timeout bounds (docs/protocol.md, "prompt_send").
const PROMPT_TIMEOUT_DEFAULT: u64 = 3_600_000;
const PROMPT_TIMEOUT_MIN: u64 = 5_000;
const PROMPT_TIMEOUT_MAX: u64 = 86_400_000;

/// Why the run's agent could not be started. Every text names the item
/// or step; it goes to the backend (`acp_opened`, `prompt_result`).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the proxy is shutting down: no agent starts now; retry after it is back")]
    ShuttingDown,
    #[error("the run is not prepared")]
    NotPrepared,
    #[error("init.agentInputs missing: the run has no init (send acp_open with init)")]
    NoInit,
    #[error("init.agentInputs missing")]
    NoAgentInputs,
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// Landing the agentInputs ([`super::landing`]).
    #[error(transparent)]
    Landing(#[from] LandingError),
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("cwd: {0}")]
    Cwd(#[source] ProviderError),
    #[error("git: {0}")]
    Git(#[source] RepoError),
    #[error("init_failed: init.script exited with exitCode={0}")]
    InitExit(i32),
    #[error("init_failed: init.script {0}")]
    InitTimeout(#[source] ExecError),
    #[error("init_failed: init.script could not start: {0}")]
    InitStart(#[source] ExecError),
    #[error("bootstrap failed: checkCommand failed and no installCommand is configured")]
    BootstrapNoInstall,
    #[error("bootstrap failed: installCommand {0}")]
    BootstrapInstall(#[source] ExecError),
    #[error("agent_command is not configured")]
    NoAgentCommand,
    #[error("start agent_command: {0}")]
    Start(#[source] ProviderError),
    /// The ACP host (`acp/`): attaching to the agent, or its `initialize`.
    #[error("{0}")]
    Acp(#[source] crate::acp::host::AgentError),
    #[error("the agent is not running")]
    NotRunning,
}

/// A command the daemon runs in the instance (bootstrap, init script)
/// that did not exit 0.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error("timeout after {0}s")]
    Timeout(u64),
    #[error("exitCode={0}")]
    Exit(i32),
}

/// The agent's environment: init.env → user view → envPatch → allowlist.
pub fn run_env(
    allowlist: Option<&[String]>,
    state: &RunState,
    init: &Value,
    patch: &[(&str, &str)],
) -> Result<Vec<(String, String)>, AgentError> {
    let mut env: Vec<(String, String)> = Vec::new();
    if let Some(obj) = init.get("env").and_then(Value::as_object) {
        for (k, v) in obj {
            let v = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            env.push((k.clone(), v));
        }
    }
    for key in ["USER_HOME", "HOME"] {
        if !env.iter().any(|(k, v)| k == key && !v.is_empty()) {
            env.push((key.to_string(), state.home_guest.clone()));
        }
    }
    let allow = match allowlist {
        Some(list) => Allowlist::new(false, list.iter().map(String::as_str)),
        None => Allowlist::new(true, []),
    }?;
    let user = user_name(&env);
    let composed =
        crate::env::compose(&env, &UserVars { home: &state.home_guest, user: &user }, patch, &allow);
    if !composed.dropped.is_empty() {
        tracing::info!(
            "run {}: init.env keys not passed to the agent (agent_env_allowlist): {}",
            state.run_id,
            composed.dropped.join(", ")
        );
    }
    Ok(composed.vars)
}

/// The config an agent is started with, copied once from [`Config`].
struct AgentSettings {
    /// `agent_command`.
    command: Vec<String>,
    /// `agent_env_allowlist` (`None`: the default list).
    env_allowlist: Option<Vec<String>>,
    /// `[sandbox.bootstrap]`.
    bootstrap: Option<Bootstrap>,
    /// `agent.state_path`: the agent's state directory inside the instance.
    state_path: Option<String>,
}

impl AgentSettings {
    fn new(cfg: &Config) -> AgentSettings {
        AgentSettings {
            command: cfg.agent_command.clone(),
            env_allowlist: cfg.agent_env_allowlist.clone(),
            bootstrap: cfg.sandbox.bootstrap.clone(),
            state_path: cfg.agent.state_path.clone(),
        }
    }
}

/// The agent part of every lane: what starting, driving and closing a
/// run's agent needs, and nothing else. The landing (the one holder of the
/// download token) and the git checkouts are here, as only an agent's
/// start uses them. Each call is given the run it acts on (its
/// [`RunSlot`], and its [`AgentSlot`]).
pub struct AgentPart {
    runs: Arc<Runs>,
    provider: Arc<AnyProvider>,
    report: Arc<Reporter>,
    mounts: Arc<Mounts>,
    landing: Landing,
    checkouts: Checkouts,
    pool: Arc<crate::blocking::Pool>,
    /// What each agent's ACP host gets (`acp_sink.rs`).
    acp: Context,
    settings: AgentSettings,
}

impl AgentPart {
    /// The agent part, with the services it uses and its values of `cfg`
    /// (its settings, the ACP host's, the git checkouts'). It alone gets
    /// the `landing`, which holds the download token.
    pub fn new(
        cfg: &Config,
        runs: Arc<Runs>,
        provider: Arc<AnyProvider>,
        report: Arc<Reporter>,
        mounts: Arc<Mounts>,
        pool: Arc<crate::blocking::Pool>,
        landing: Landing,
    ) -> AgentPart {
        let acp = super::acp_sink::context(cfg, report.clone(), pool.clone());
        let (checkouts, settings) = (Checkouts::new(cfg), AgentSettings::new(cfg));
        AgentPart { runs, provider, report, mounts, landing, checkouts, pool, acp, settings }
    }

    /// What an agent of a run gets: the settings and the reporter as the
    /// sink.
    pub fn acp_context(&self) -> Context {
        self.acp.clone()
    }

    /// Part 2's entry point: start (or reuse) the run's agent in its
    /// instance. Every failure names the item or step.
    pub async fn open(&self, run: &mut RunSlot, slot: &mut AgentSlot, cwd: &Value) -> Result<(), AgentError> {
        if slot.live().is_some() {
            return Ok(());
        }
        if self.runs.stopping() {
            return Err(AgentError::ShuttingDown);
        }
        slot.clear();
        let state = run.state().cloned().ok_or(AgentError::NotPrepared)?;
        let Some(init) = state.init.clone() else {
            return Err(AgentError::NoInit);
        };
        let Some(manifest_value) = init.get("agentInputs").filter(|v| !v.is_null()) else {
            return Err(AgentError::NoAgentInputs);
        };
        let manifest = crate::manifest::parse_value(manifest_value)?;
        let patch: Vec<(String, String)> = [
            ("HOME", manifest.env_patch.home.clone()),
            ("USER", manifest.env_patch.user.clone()),
            ("LOGNAME", manifest.env_patch.logname.clone()),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
        .collect();
        let patch_ref: Vec<(&str, &str)> = patch.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let env = run_env(self.settings.env_allowlist.as_deref(), &state, &init, &patch_ref)?;
        let cwd = match str_field(cwd) {
            Some(c) => crate::provider::check_guest_cwd_pub(c, &state.home_guest).map_err(AgentError::Cwd)?,
            None => sandbox::WORKSPACE.to_string(),
        };

        // TUIXIU_REPO_URL: the workspace becomes a checkout first.
        self.prepare_repo(&state, &init).await?;
        // agentInputs, in order, into the host directories behind the
        // instance (binds were declared when the instance was made).
        let (records, landing) = self.apply_inputs(&state, manifest).await;
        if let (Some(st), Some(records)) = (run.state_mut(), records)
            && st.landed != records
        {
            st.landed = records;
            run.persist();
        }
        landing?;
        if let Some(b) = &self.settings.bootstrap {
            self.bootstrap(&state, &env, b).await?;
        }
        if let Some(script) = init.get("script").and_then(Value::as_str).filter(|s| !s.trim().is_empty()) {
            let timeout = init
                .get("timeout_seconds")
                .and_then(Value::as_f64)
                .filter(|t| t.is_finite())
                .map_or(300, |t| (t.max(1.0) as u64).clamp(1, 3600));
            self.init_script(&state, &env, script, timeout).await?;
        }
        self.start_agent(&state, slot, env, cwd).await
    }

    /// Host-side git preparation of the workspace (`repo.rs`); a failure is
    /// also an `init_step` `init` `failed`, as the Node proxy reports it.
    async fn prepare_repo(&self, state: &RunState, init: &Value) -> Result<(), AgentError> {
        let run_id = state.run_id.as_str();
        let env = init_env(Some(init));
        let fail = |e: RepoError| {
            self.step(run_id, "init", "failed", Some(e.to_string()));
            AgentError::Git(e)
        };
        let Some(req) = self.checkouts.request(&env).map_err(fail)? else {
            return Ok(());
        };
        let step =
            |stage: &str, status: &str, message: Option<String>| self.step(run_id, stage, status, message);
        let redact = |text: &str| self.report.redact(text);
        let blocking = self.pool.share(run_id);
        let (host, owner) =
            (self.checkouts.host(&redact, &blocking), self.checkouts.owner(state_user(state)));
        super::repo::prepare(host, &req, &state.workspace, &env, owner, &step).await.map_err(fail)
    }

    /// Lands the manifest's items into the host directories behind the
    /// instance ([`super::landing`]) and reports the items left alone.
    /// Returns the records of what is landed now and the landing's outcome.
    async fn apply_inputs(
        &self,
        state: &RunState,
        manifest: crate::manifest::Manifest,
    ) -> (Option<Landed>, Result<(), AgentError>) {
        let run_id = state.run_id.as_str();
        let to = landing::Target::new(
            run_id,
            self.mounts.scratch_dir_of(run_id),
            self.mounts.incoming_dir(run_id),
            self.report.redactor(),
            self.pool.share(run_id),
        );
        let out = self.landing.land(state, manifest, to).await;
        let (left_alone, records, result) = out.finish(run_id, &state.home_guest);
        for text in left_alone {
            tracing::warn!("run {run_id}: {text}");
            self.text(run_id, format!("[proxy] {text}"));
        }
        (records, result.map_err(AgentError::from))
    }

    /// Runs `argv` in the run's instance; lines go to `on_line(is_stderr,
    /// line)`. Returns the exit code, or `Err` on spawn failure / timeout
    /// (never [`ExecError::Exit`]).
    async fn exec_lines(
        &self,
        state: &RunState,
        argv: Vec<String>,
        env: &[(String, String)],
        timeout: Duration,
        mut on_line: impl FnMut(bool, &str),
    ) -> Result<i32, ExecError> {
        let spec = ProcessSpec {
            argv,
            env: env.to_vec(),
            cwd: Some(sandbox::WORKSPACE.into()),
            cwd_dir: None,
            stdio: Stdio::Piped,
        };
        let mut proc = self.provider.exec(&state.instance_name, &spec).await?;
        drop(proc.stdin.take());
        let killer = proc.killer();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(bool, String)>();
        for (is_err, r) in [
            (false, proc.stdout.take().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>)),
            (true, proc.stderr.take().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>)),
        ] {
            if let Some(r) = r {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(r).split(b'\n');
                    while let Ok(Some(l)) = lines.next_segment().await {
                        let _ = tx.send((is_err, String::from_utf8_lossy(&l).trim_end().to_string()));
                    }
                });
            }
        }
        drop(tx);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut wait = Box::pin(proc.wait());
        let mut status = None;
        let mut lines_open = true;
        loop {
            tokio::select! {
                l = rx.recv(), if lines_open => match l {
                    Some((e, line)) => on_line(e, &line),
                    None => lines_open = false,
                },
                s = &mut wait, if status.is_none() => status = Some(s),
                _ = tokio::time::sleep_until(deadline) => {
                    let _ = killer.kill(libc::SIGKILL).await;
                    return Err(ExecError::Timeout(timeout.as_secs()));
                }
            }
            if status.is_some() && !lines_open {
                break;
            }
        }
        let status = status.expect("set")?;
        Ok(status.code_or_signal())
    }

    fn text(&self, run_id: &str, text: String) {
        let t = self.report.redact(&text);
        self.report.push(&ProxyUpdate::new(run_id, Content::text(t)));
    }

    fn step(&self, run_id: &str, stage: &str, status: &str, message: Option<String>) {
        let message = message.map(|m| self.report.redact(&m));
        self.report.push(&ProxyUpdate::new(run_id, Content::init_step(stage, status, message)));
    }

    /// `init.script` with `bash -lc` in the instance (docs/protocol.md, "The
    /// init script").
    async fn init_script(
        &self,
        state: &RunState,
        env: &[(String, String)],
        script: &str,
        timeout: u64,
    ) -> Result<(), AgentError> {
        let run_id = state.run_id.as_str();
        self.text(run_id, format!("[init] start (bash, timeout={timeout}s)"));
        let argv = vec!["bash".to_string(), "-lc".to_string(), script.to_string()];
        let outcome = self
            .exec_lines(state, argv, env, Duration::from_secs(timeout), |is_err, line| {
                if let Some(rest) = line.strip_prefix("__TUIXIU_INIT_STEP__:") {
                    let mut parts = rest.splitn(3, ':');
                    let stage = parts.next().unwrap_or("").trim();
                    if !stage.is_empty() {
                        let status =
                            parts.next().map(str::trim).filter(|s| !s.is_empty()).unwrap_or("progress");
                        self.step(run_id, stage, status, parts.next().map(str::to_string));
                        return;
                    }
                }
                if !line.trim().is_empty() {
                    self.text(run_id, format!("[init:{}] {line}", if is_err { "stderr" } else { "stdout" }));
                }
            })
            .await;
        let result = |r| self.report.push(&ProxyUpdate::new(run_id, Content::init_result(r)));
        match outcome {
            Ok(0) => {
                result(Ok(()));
                self.text(run_id, "[init] done".into());
                Ok(())
            }
            Ok(code) => {
                result(Err((format!("exitCode={code}"), Some(code))));
                Err(AgentError::InitExit(code))
            }
            Err(timeout @ ExecError::Timeout(_)) => {
                result(Err((timeout.to_string(), None)));
                Err(AgentError::InitTimeout(timeout))
            }
            Err(spawn) => {
                let text = spawn.to_string();
                self.step(run_id, "init", "failed", Some(text.clone()));
                result(Err((self.report.redact(&text), None)));
                Err(AgentError::InitStart(spawn))
            }
        }
    }

    /// `[sandbox.bootstrap]`: check, else install (stages `bootstrap`,
    /// `bootstrap_check`, `bootstrap_install`).
    async fn bootstrap(
        &self,
        state: &RunState,
        env: &[(String, String)],
        b: &Bootstrap,
    ) -> Result<(), AgentError> {
        let run_id = state.run_id.as_str();
        let step =
            |stage: &str, status: &str, message: Option<String>| self.step(run_id, stage, status, message);
        let timeout = Duration::from_secs(b.timeout_seconds);
        step("bootstrap", "start", None);
        let sh = |c: &str| vec!["sh".to_string(), "-c".to_string(), c.to_string()];
        let echo = |is_err: bool, line: &str| {
            if !line.trim().is_empty() {
                self.text(run_id, format!("[bootstrap:{}] {line}", if is_err { "stderr" } else { "stdout" }));
            }
        };
        if let Some(check) = &b.check_command {
            step("bootstrap_check", "start", None);
            match self.exec_lines(state, sh(check), env, timeout, echo).await {
                Ok(0) => {
                    step("bootstrap_check", "done", None);
                    step("bootstrap_install", "skip", None);
                    step("bootstrap", "done", None);
                    return Ok(());
                }
                Ok(code) => step("bootstrap_check", "failed", Some(ExecError::Exit(code).to_string())),
                Err(e) => step("bootstrap_check", "failed", Some(e.to_string())),
            }
        }
        let Some(install) = &b.install_command else {
            step("bootstrap", "failed", Some("the check failed and no installCommand is configured".into()));
            return Err(AgentError::BootstrapNoInstall);
        };
        step("bootstrap_install", "start", None);
        match self.exec_lines(state, sh(install), env, timeout, echo).await {
            Ok(0) => {
                step("bootstrap_install", "done", None);
                step("bootstrap", "done", None);
                Ok(())
            }
            other => {
                let why = match other {
                    Ok(code) => ExecError::Exit(code),
                    Err(e) => e,
                };
                let text = why.to_string();
                step("bootstrap_install", "failed", Some(text.clone()));
                step("bootstrap", "failed", Some(text));
                Err(AgentError::BootstrapInstall(why))
            }
        }
    }

    /// The agent's process in the instance and its ACP connection: the
    /// process and the guest filesystem, the client, `initialize`. The
    /// timings logged at the end cover every step (docs/benchmarks.md,
    /// "Execution-plane daemon").
    async fn start_agent(
        &self,
        state: &RunState,
        slot: &mut AgentSlot,
        env: Vec<(String, String)>,
        cwd: String,
    ) -> Result<(), AgentError> {
        if self.settings.command.is_empty() {
            return Err(AgentError::NoAgentCommand);
        }
        let run_id = state.run_id.as_str();
        let spec = ProcessSpec {
            argv: self.settings.command.clone(),
            env: env.clone(),
            cwd: Some(cwd),
            cwd_dir: None,
            stdio: Stdio::Piped,
        };
        let name = state.instance_name.clone();
        let t0 = std::time::Instant::now();
        let (process, fs, pid1) = self.spawn_process(state, &spec).await?;
        let spawner = spawner(self.provider.clone(), name.clone(), pid1);
        let cx = self.acp.clone();
        let mut client = Client::new(
            cx.clone(),
            run_id.to_string(),
            name.clone(),
            fs,
            spawner,
            env,
            state.home_guest.clone(),
        );
        client.sandbox_pid1 = pid1;
        let generation = slot.next_generation();
        let (runs, run) = (self.runs.clone(), run_id.to_string());
        let on_exit = Box::new(move |_status| send(&runs, &run, Job::AgentExited { generation }));
        let spawned = t0.elapsed();
        if let Some(m) = self.report.metrics() {
            m.sandbox_started(self.report.wire_provider(), spawned);
        }
        let agent = Agent::attach(cx, run_id, &name, process, client, on_exit).map_err(AgentError::Acp)?;
        if let Err(e) = agent.initialize().await {
            agent.shutdown("initialize failed").await;
            return Err(AgentError::Acp(e));
        }
        tracing::debug!(
            "run {run_id}: agent spawned in {spawned:?} (launcher started, sandbox made), initialize answered after {:?}",
            t0.elapsed()
        );
        self.runs.set_agent(run_id, Some(agent.clone()));
        slot.set(agent);
        if let Ok(info) = self.provider.inspect(&name).await {
            self.report.status(run_id, &info);
        }
        Ok(())
    }

    /// The agent's process in the run's instance, and the guest filesystem
    /// its `fs/*` calls see: the sandbox's own root (native), or the host
    /// directories behind the instance (docker, host). `pid1`: the native
    /// sandbox's, which terminals join.
    async fn spawn_process(
        &self,
        state: &RunState,
        spec: &ProcessSpec,
    ) -> Result<(Process, Result<GuestFs, GuestError>, Option<u32>), AgentError> {
        let name = state.instance_name.as_str();
        let allowed = [sandbox::WORKSPACE, state.home_guest.as_str()];
        match &*self.provider {
            AnyProvider::Native(p) => {
                // This lane has no agent: one still recorded is stale.
                p.end_stale_agent(name).await;
                let (process, pid1) = p.spawn_agent_reporting(name, spec).await.map_err(AgentError::Start)?;
                Ok((process, GuestFs::sandbox_root(pid1, &allowed), Some(pid1)))
            }
            other => {
                if let AnyProvider::Host(p) = other {
                    // Host processes do not die with the daemon: one left
                    // running by a previous daemon is ended first.
                    p.end_stale_agent(name).await;
                }
                let process = other.spawn_agent(name, spec).await.map_err(AgentError::Start)?;
                let owner = matches!(other, AnyProvider::Docker(_)).then(|| state_user(state));
                let owner = owner.filter(|_| nix::unistd::geteuid().is_root());
                let mut fs = GuestFs::host_dirs(
                    &[(sandbox::WORKSPACE, &state.workspace), (&state.home_guest, &state.home)],
                    owner,
                );
                // The agent's state directory is mounted over part of its
                // home (usually): fs/* must see what the agent sees there.
                if let (Some(guest), AnyProvider::Docker(_)) = (&self.settings.state_path, other) {
                    let host = self.mounts.agent_state_dir();
                    fs = fs.and_then(|fs| fs.with_mount(guest, &host));
                }
                Ok((process, fs, None))
            }
        }
    }

    /// Closes the run's agent (acp_close, stop, remove, keepalive expiry).
    pub async fn close(&self, run_id: &str, slot: &mut AgentSlot, reason: &str) {
        if let Some(agent) = slot.take() {
            self.runs.set_agent(run_id, None);
            if !agent.has_exited() {
                agent.shutdown(reason).await;
            }
        }
    }

    /// `prompt_send` after the open: the turn runs on its own task.
    pub fn start_prompt(&self, run_id: &str, slot: &mut AgentSlot, m: RunMessage) {
        let Some(agent) = slot.live() else {
            reply_prompt(&self.report, &m, Err(AgentError::NotRunning));
            return;
        };
        let (report, runs) = (self.report.clone(), self.runs.clone());
        let run = run_id.to_string();
        let prompt_id = str_field(&m.prompt_id).unwrap_or_default().to_string();
        let session_id = str_field(&m.session_id).map(str::to_string);
        let cwd = str_field(&m.cwd).unwrap_or(sandbox::WORKSPACE).to_string();
        let context = m.extra.get("context").and_then(Value::as_str).map(str::to_string);
        let prompt = m.extra.get("prompt").and_then(Value::as_array).cloned().unwrap_or_default();
        let timeout = m
            .extra
            .get("timeout_ms")
            .and_then(Value::as_f64)
            .filter(|t| t.is_finite())
            .map_or(PROMPT_TIMEOUT_DEFAULT, |t| {
                (t.max(0.0) as u64).clamp(PROMPT_TIMEOUT_MIN, PROMPT_TIMEOUT_MAX)
            });
        slot.prompt_started();
        runs.turn(true);
        tokio::spawn(async move {
            let r = agent
                .prompt(
                    &prompt_id,
                    session_id.as_deref(),
                    &cwd,
                    context.as_deref(),
                    prompt,
                    Duration::from_millis(timeout),
                )
                .await;
            match r {
                Ok(o) => {
                    report.push(&PromptResult::done(&Value::from(run.as_str()), &Value::from(prompt_id), &o))
                }
                Err(e) => reply_prompt(&report, &m, Err(e)),
            }
            runs.turn(false);
            send(&runs, &run, Job::PromptDone);
        });
    }

    /// Session controls, `session_permission` and `acp_message`, which go
    /// to the run's agent directly (not through the lane): `true` when
    /// handled.
    pub fn direct(&self, run_id: &str, kind: &str, msg: &RunMessage) -> bool {
        let Some(agent) = self.runs.agent(run_id) else { return false };
        match kind {
            "session_cancel" => {
                let sid = str_field(&msg.session_id).unwrap_or_default();
                agent.cancel(sid);
                reply_session(&self.report, msg, Ok::<(), std::convert::Infallible>(()));
            }
            "session_set_mode" | "session_set_model" | "session_set_config_option" => {
                let (report, kind) = (self.report.clone(), kind.to_string());
                let sid = str_field(&msg.session_id).unwrap_or_default().to_string();
                let msg = RunMessage {
                    run_id: msg.run_id.clone(),
                    control_id: msg.control_id.clone(),
                    extra: msg.extra.clone(),
                    ..RunMessage::default()
                };
                self.runs.spawn(async move {
                    let r = agent.control(&kind, &sid, &msg.extra).await;
                    reply_session(&report, &msg, r);
                });
            }
            "session_permission" => {
                let outcome = msg.extra.get("outcome").and_then(Value::as_str).unwrap_or("cancelled");
                let option = msg.extra.get("option_id").and_then(Value::as_str);
                let rid = msg.extra.get("request_id").cloned().unwrap_or(Value::Null);
                if !agent.client.resolve_permission(&rid, outcome, option) {
                    tracing::info!(
                        "run {run_id}: session_permission for request {rid}: no such pending request"
                    );
                }
            }
            "acp_message" => {
                let message = msg.extra.get("message").cloned().unwrap_or(Value::Null);
                self.forward_raw(run_id, &agent, message);
            }
            _ => return false,
        }
        true
    }

    /// The raw tunnel: a backend JSON-RPC message forwarded to the agent as
    /// it is; a request gets an id of ours (the agent's id space is shared
    /// with the daemon's own requests), and its response goes back as
    /// `acp_message` with the backend's id.
    fn forward_raw(&self, run_id: &str, agent: &Arc<Agent>, message: Value) {
        let Value::Object(mut m) = message else {
            tracing::warn!("run {run_id}: acp_message without a JSON-RPC object dropped");
            return;
        };
        match (m.get("method").is_some(), m.remove("id")) {
            (true, Some(backend_id)) if !backend_id.is_null() => {
                let (id, rx) = agent.transport.reserve();
                m.insert("id".into(), json!(id));
                m.insert("jsonrpc".into(), json!("2.0"));
                agent.transport.send_raw(&Value::Object(m));
                let (report, run) = (self.report.clone(), run_id.to_string());
                self.runs.spawn(async move {
                    report.push(&AcpReply::new(&run, &backend_id, rx.await.ok()));
                });
            }
            (true, _) => agent.transport.send_raw(&Value::Object(m)),
            (false, _) => {
                tracing::warn!("run {run_id}: acp_message that is not a request or notification dropped")
            }
        }
    }
}

fn state_user(state: &RunState) -> (u32, u32) {
    (state.uid, state.gid)
}

/// How terminals of this run start: joined to the agent's sandbox
/// (native), or through the provider's exec (docker, host).
fn spawner(provider: Arc<AnyProvider>, name: String, pid1: Option<u32>) -> Spawner {
    Arc::new(move |spec: ProcessSpec| {
        let (provider, name) = (provider.clone(), name.clone());
        Box::pin(async move {
            let process = match (&*provider, pid1) {
                (AnyProvider::Native(p), Some(pid)) => p.exec_joined(&name, pid, &spec).await,
                (p, _) => p.exec(&name, &spec).await,
            }?;
            let killer = process.group_killer();
            Ok((process, killer))
        })
    })
}
