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

use super::landing::{self, LandingError};
use super::lane::{Job, Lane, RunContext, RunState, init_env, reply_prompt, reply_session, send, user_name};
use super::protocol::{AcpReply, Content, PromptResult, ProxyUpdate, RunMessage, str_field};
use super::repo::RepoError;
use crate::acp::client::{Client, Spawner};
use crate::acp::fs::GuestFs;
use crate::acp::host::Agent;
use crate::env::{Allowlist, EnvError, UserVars};
use crate::inputs::landed::Landed;
use crate::manifest::ManifestError;
use crate::provider::{AnyProvider, ProcessSpec, Provider, ProviderError, Stdio};

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
    #[error("the run is not prepared")]
    NotPrepared,
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error("timeout after {0}s")]
    Timeout(u64),
    #[error("exitCode={0}")]
    Exit(i32),
}

/// The agent's environment: init.env → user view → envPatch → allowlist.
pub fn run_env(
    d: &RunContext,
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
    let allow = match &d.cfg().agent_env_allowlist {
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

impl Lane {
    /// The live agent of this run, if any.
    pub fn live_agent(&self) -> Option<Arc<Agent>> {
        self.agent_slot().live()
    }

    /// Part 2's entry point: start (or reuse) the run's agent in its
    /// instance. Every failure names the item or step.
    pub async fn open_agent(&mut self, cwd: &Value) -> Result<(), AgentError> {
        if self.live_agent().is_some() {
            return Ok(());
        }
        if self.ctx().runs().stopping() {
            return Err(AgentError::ShuttingDown);
        }
        self.agent_slot_mut().clear();
        let d = self.ctx().clone();
        let state = self.state().cloned().ok_or(AgentError::NotPrepared)?;
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
        let env = run_env(&d, &state, &init, &patch_ref)?;
        let cwd = match str_field(cwd) {
            Some(c) => crate::provider::check_guest_cwd_pub(c, &state.home_guest).map_err(AgentError::Cwd)?,
            None => sandbox::WORKSPACE.to_string(),
        };

        // TUIXIU_REPO_URL: the workspace becomes a checkout first.
        self.prepare_repo(&state, &init).await?;
        // agentInputs, in order, into the host directories behind the
        // instance (binds were declared when the instance was made).
        let (records, landing) = self.apply_inputs(&state, manifest).await;
        if let (Some(st), Some(records)) = (self.state_mut(), records)
            && st.landed != records
        {
            st.landed = records;
            self.persist();
        }
        landing?;
        if let Some(b) = d.cfg().sandbox.bootstrap.clone() {
            self.bootstrap(&state, &env, &b).await?;
        }
        if let Some(script) = init.get("script").and_then(Value::as_str).filter(|s| !s.trim().is_empty()) {
            let timeout = init
                .get("timeout_seconds")
                .and_then(Value::as_f64)
                .filter(|t| t.is_finite())
                .map_or(300, |t| (t.max(1.0) as u64).clamp(1, 3600));
            self.init_script(&state, &env, script, timeout).await?;
        }
        self.start_agent(&state, env, cwd).await
    }

    /// Host-side git preparation of the workspace (`repo.rs`); a failure is
    /// also an `init_step` `init` `failed`, as the Node proxy reports it.
    async fn prepare_repo(&self, state: &RunState, init: &Value) -> Result<(), AgentError> {
        let d = &self.ctx();
        let env = init_env(Some(init));
        let fail = |e: RepoError| {
            self.step("init", "failed", Some(e.to_string()));
            AgentError::Git(e)
        };
        let Some(req) = d.checkouts().request(&env).map_err(fail)? else {
            return Ok(());
        };
        let step = |stage: &str, status: &str, message: Option<String>| self.step(stage, status, message);
        let redact = |text: &str| d.report().redact(text);
        let blocking = d.pool().share(self.run_id());
        let (host, owner) = (d.checkouts().host(&redact, &blocking), d.checkouts().owner(state_user(state)));
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
        let d = self.ctx();
        let to = landing::Target::new(
            self.run_id(),
            d.mounts().scratch_dir_of(self.run_id()),
            d.mounts().incoming_dir(self.run_id()),
            d.report().redactor(),
            d.pool().share(self.run_id()),
        );
        let out = d.landing().land(state, manifest, to).await;
        let (left_alone, records, result) = out.finish(self.run_id(), &state.home_guest);
        for text in left_alone {
            tracing::warn!("run {}: {text}", self.run_id());
            self.text(format!("[proxy] {text}"));
        }
        (records, result.map_err(AgentError::from))
    }

    /// Runs `argv` in the instance; lines go to `on_line(is_stderr, line)`.
    /// Returns the exit code, or `Err` on spawn failure / timeout (never
    /// [`ExecError::Exit`]).
    async fn exec_lines(
        &self,
        argv: Vec<String>,
        env: &[(String, String)],
        timeout: Duration,
        mut on_line: impl FnMut(bool, &str),
    ) -> Result<i32, ExecError> {
        let d = &self.ctx();
        let state = self.state().ok_or(ExecError::NotPrepared)?;
        let spec = ProcessSpec {
            argv,
            env: env.to_vec(),
            cwd: Some(sandbox::WORKSPACE.into()),
            cwd_dir: None,
            stdio: Stdio::Piped,
        };
        let mut proc = d.provider().exec(&state.instance_name, &spec).await?;
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

    fn text(&self, text: String) {
        let t = self.ctx().report().redact(&text);
        self.ctx().report().push(&ProxyUpdate::new(self.run_id(), Content::text(t)));
    }

    fn step(&self, stage: &str, status: &str, message: Option<String>) {
        let message = message.map(|m| self.ctx().report().redact(&m));
        self.ctx()
            .report()
            .push(&ProxyUpdate::new(self.run_id(), Content::init_step(stage, status, message)));
    }

    /// `init.script` with `bash -lc` in the instance (docs/protocol.md, "The
    /// init script").
    async fn init_script(
        &self,
        _state: &RunState,
        env: &[(String, String)],
        script: &str,
        timeout: u64,
    ) -> Result<(), AgentError> {
        self.text(format!("[init] start (bash, timeout={timeout}s)"));
        let argv = vec!["bash".to_string(), "-lc".to_string(), script.to_string()];
        let outcome = self
            .exec_lines(argv, env, Duration::from_secs(timeout), |is_err, line| {
                if let Some(rest) = line.strip_prefix("__TUIXIU_INIT_STEP__:") {
                    let mut parts = rest.splitn(3, ':');
                    let stage = parts.next().unwrap_or("").trim();
                    if !stage.is_empty() {
                        let status =
                            parts.next().map(str::trim).filter(|s| !s.is_empty()).unwrap_or("progress");
                        self.step(stage, status, parts.next().map(str::to_string));
                        return;
                    }
                }
                if !line.trim().is_empty() {
                    self.text(format!("[init:{}] {line}", if is_err { "stderr" } else { "stdout" }));
                }
            })
            .await;
        let result = |r| self.ctx().report().push(&ProxyUpdate::new(self.run_id(), Content::init_result(r)));
        match outcome {
            Ok(0) => {
                result(Ok(()));
                self.text("[init] done".into());
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
                self.step("init", "failed", Some(text.clone()));
                result(Err((self.ctx().report().redact(&text), None)));
                Err(AgentError::InitStart(spawn))
            }
        }
    }

    /// `[sandbox.bootstrap]`: check, else install (stages `bootstrap`,
    /// `bootstrap_check`, `bootstrap_install`).
    async fn bootstrap(
        &self,
        _state: &RunState,
        env: &[(String, String)],
        b: &super::config::Bootstrap,
    ) -> Result<(), AgentError> {
        let timeout = Duration::from_secs(b.timeout_seconds);
        self.step("bootstrap", "start", None);
        let sh = |c: &str| vec!["sh".to_string(), "-c".to_string(), c.to_string()];
        let echo = |is_err: bool, line: &str| {
            if !line.trim().is_empty() {
                self.text(format!("[bootstrap:{}] {line}", if is_err { "stderr" } else { "stdout" }));
            }
        };
        if let Some(check) = &b.check_command {
            self.step("bootstrap_check", "start", None);
            match self.exec_lines(sh(check), env, timeout, echo).await {
                Ok(0) => {
                    self.step("bootstrap_check", "done", None);
                    self.step("bootstrap_install", "skip", None);
                    self.step("bootstrap", "done", None);
                    return Ok(());
                }
                Ok(code) => self.step("bootstrap_check", "failed", Some(ExecError::Exit(code).to_string())),
                Err(e) => self.step("bootstrap_check", "failed", Some(e.to_string())),
            }
        }
        let Some(install) = &b.install_command else {
            self.step(
                "bootstrap",
                "failed",
                Some("the check failed and no installCommand is configured".into()),
            );
            return Err(AgentError::BootstrapNoInstall);
        };
        self.step("bootstrap_install", "start", None);
        match self.exec_lines(sh(install), env, timeout, echo).await {
            Ok(0) => {
                self.step("bootstrap_install", "done", None);
                self.step("bootstrap", "done", None);
                Ok(())
            }
            other => {
                let why = match other {
                    Ok(code) => ExecError::Exit(code),
                    Err(e) => e,
                };
                let text = why.to_string();
                self.step("bootstrap_install", "failed", Some(text.clone()));
                self.step("bootstrap", "failed", Some(text));
                Err(AgentError::BootstrapInstall(why))
            }
        }
    }

    /// The agent's process in the instance and its ACP connection: the
    /// spec, the guest filesystem, the client, `initialize`. Long because
    /// each step uses what the one before made; the timings logged at the
    /// end cover them all (docs/benchmarks.md, "Execution-plane daemon").
    async fn start_agent(
        &mut self,
        state: &RunState,
        env: Vec<(String, String)>,
        cwd: String,
    ) -> Result<(), AgentError> {
        let d = self.ctx().clone();
        if d.cfg().agent_command.is_empty() {
            return Err(AgentError::NoAgentCommand);
        }
        let spec = ProcessSpec {
            argv: d.cfg().agent_command.clone(),
            env: env.clone(),
            cwd: Some(cwd),
            cwd_dir: None,
            stdio: Stdio::Piped,
        };
        let name = state.instance_name.clone();
        let allowed = [sandbox::WORKSPACE, state.home_guest.as_str()];
        let t0 = std::time::Instant::now();
        let (process, fs, pid1) = match d.provider() {
            AnyProvider::Native(p) => {
                // This lane has no agent: one still recorded is stale.
                p.end_stale_agent(&name).await;
                let (process, pid1) =
                    p.spawn_agent_reporting(&name, &spec).await.map_err(AgentError::Start)?;
                (process, GuestFs::sandbox_root(pid1, &allowed), Some(pid1))
            }
            other => {
                if let AnyProvider::Host(p) = other {
                    // Host processes do not die with the daemon: one left
                    // running by a previous daemon is ended first.
                    p.end_stale_agent(&name).await;
                }
                let process = other.spawn_agent(&name, &spec).await.map_err(AgentError::Start)?;
                let owner = matches!(other, AnyProvider::Docker(_)).then(|| state_user(state));
                let owner = owner.filter(|_| nix::unistd::geteuid().is_root());
                let mut fs = GuestFs::host_dirs(
                    &[(sandbox::WORKSPACE, &state.workspace), (&state.home_guest, &state.home)],
                    owner,
                );
                // The agent's state directory is mounted over part of its
                // home (usually): fs/* must see what the agent sees there.
                if let (Some(guest), AnyProvider::Docker(_)) = (&d.cfg().agent.state_path, other) {
                    let host = d.mounts().agent_state_dir();
                    fs = fs.and_then(|fs| fs.with_mount(guest, &host));
                }
                (process, fs, None)
            }
        };
        let spawner = spawner(d.clone(), name.clone(), pid1);
        let cx = d.acp_context();
        let mut client = Client::new(
            cx.clone(),
            self.run_id().to_string(),
            name.clone(),
            fs,
            spawner,
            env,
            state.home_guest.clone(),
        );
        client.sandbox_pid1 = pid1;
        let generation = self.agent_slot_mut().next_generation();
        let (dd, run) = (d.clone(), self.run_id().to_string());
        let on_exit = Box::new(move |_status| send(&dd, &run, Job::AgentExited { generation }));
        let spawned = t0.elapsed();
        if let Some(m) = d.report().metrics() {
            m.sandbox_started(d.report().wire_provider(), spawned);
        }
        let agent =
            Agent::attach(cx, self.run_id(), &name, process, client, on_exit).map_err(AgentError::Acp)?;
        if let Err(e) = agent.initialize().await {
            agent.shutdown("initialize failed").await;
            return Err(AgentError::Acp(e));
        }
        tracing::debug!(
            "run {}: agent spawned in {spawned:?} (launcher started, sandbox made), initialize answered after {:?}",
            self.run_id(),
            t0.elapsed()
        );
        d.runs().set_agent(self.run_id(), Some(agent.clone()));
        self.agent_slot_mut().set(agent);
        if let Ok(info) = d.provider().inspect(&name).await {
            d.report().status(self.run_id(), &info);
        }
        Ok(())
    }

    /// Closes the agent (acp_close, stop, remove, keepalive expiry).
    pub async fn close_agent(&mut self, reason: &str) {
        if let Some(agent) = self.agent_slot_mut().take() {
            self.ctx().runs().set_agent(self.run_id(), None);
            if !agent.has_exited() {
                agent.shutdown(reason).await;
            }
        }
    }

    /// `prompt_send` after the open: the turn runs on its own task.
    pub fn start_prompt(&mut self, m: RunMessage) {
        let Some(agent) = self.live_agent() else {
            reply_prompt(self.ctx().report(), &m, Err(AgentError::NotRunning));
            return;
        };
        let d = self.ctx().clone();
        let run = self.run_id().to_string();
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
        self.agent_slot_mut().prompt_started();
        d.runs().turn(true);
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
                Ok(o) => d.report().push(&PromptResult::done(
                    &Value::from(run.as_str()),
                    &Value::from(prompt_id),
                    &o,
                )),
                Err(e) => reply_prompt(d.report(), &m, Err(e)),
            }
            d.runs().turn(false);
            send(&d, &run, Job::PromptDone);
        });
    }
}

fn state_user(state: &RunState) -> (u32, u32) {
    (state.uid, state.gid)
}

/// How terminals of this run start: joined to the agent's sandbox
/// (native), or through the provider's exec (docker, host).
fn spawner(d: Arc<RunContext>, name: String, pid1: Option<u32>) -> Spawner {
    Arc::new(move |spec: ProcessSpec| {
        let (d, name) = (d.clone(), name.clone());
        Box::pin(async move {
            let process = match (d.provider(), pid1) {
                (AnyProvider::Native(p), Some(pid)) => p.exec_joined(&name, pid, &spec).await,
                (p, _) => p.exec(&name, &spec).await,
            }?;
            let killer = process.group_killer();
            Ok((process, killer))
        })
    })
}

/// Session controls, `session_permission` and `acp_message`, which go to
/// the run's agent directly (not through the lane): `true` when handled.
pub fn direct(d: &Arc<RunContext>, run_id: &str, kind: &str, msg: &RunMessage) -> bool {
    let Some(agent) = d.runs().agent(run_id) else { return false };
    match kind {
        "session_cancel" => {
            let sid = str_field(&msg.session_id).unwrap_or_default();
            agent.cancel(sid);
            reply_session(d.report(), msg, Ok::<(), std::convert::Infallible>(()));
        }
        "session_set_mode" | "session_set_model" | "session_set_config_option" => {
            let (d, kind) = (d.clone(), kind.to_string());
            let sid = str_field(&msg.session_id).unwrap_or_default().to_string();
            let msg = RunMessage {
                run_id: msg.run_id.clone(),
                control_id: msg.control_id.clone(),
                extra: msg.extra.clone(),
                ..RunMessage::default()
            };
            d.clone().spawn(async move {
                let r = agent.control(&kind, &sid, &msg.extra).await;
                reply_session(d.report(), &msg, r);
            });
        }
        "session_permission" => {
            let outcome = msg.extra.get("outcome").and_then(Value::as_str).unwrap_or("cancelled");
            let option = msg.extra.get("option_id").and_then(Value::as_str);
            let rid = msg.extra.get("request_id").cloned().unwrap_or(Value::Null);
            if !agent.client.resolve_permission(&rid, outcome, option) {
                tracing::info!("run {run_id}: session_permission for request {rid}: no such pending request");
            }
        }
        "acp_message" => {
            let message = msg.extra.get("message").cloned().unwrap_or(Value::Null);
            forward_raw(d, run_id, &agent, message);
        }
        _ => return false,
    }
    true
}

/// The raw tunnel: a backend JSON-RPC message forwarded to the agent as
/// it is; a request gets an id of ours (the agent's id space is shared
/// with the daemon's own requests), and its response goes back as
/// `acp_message` with the backend's id.
fn forward_raw(d: &Arc<RunContext>, run_id: &str, agent: &Arc<Agent>, message: Value) {
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
            let (d, run) = (d.clone(), run_id.to_string());
            d.clone().spawn(async move {
                d.report().push(&AcpReply::new(&run, &backend_id, rx.await.ok()));
            });
        }
        (true, _) => agent.transport.send_raw(&Value::Object(m)),
        (false, _) => {
            tracing::warn!("run {run_id}: acp_message that is not a request or notification dropped")
        }
    }
}
