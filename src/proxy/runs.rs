//! Run runtimes: one **lane** per `run_id`.
//!
//! A lane is a task with a FIFO of jobs: every message of one run is
//! handled in arrival order (so `stop` waits for the `acp_open` before it),
//! while different runs proceed concurrently. The lane owns the run's state
//! ([`RunState`]: instance, host paths, the last `init`, keepalive) and its
//! keepalive timer, so expiry is ordered with the run's messages too: a
//! `prompt_send` that arrives first cancels the expiry it races with.
//!
//! Run state is persisted in `<state>/runs/<run_id>.json` (0600 in a 0700
//! directory: `init.env` carries tokens) on every change and re-adopted at
//! startup, so runs and their instances survive a daemon restart and a
//! later `prompt_send` without `init` still finds the run's `init`
//! (reference §1.5.3 [QUIRK]).
//!
//! Keepalive: `keepalive_ttl_seconds` (clamped to
//! [`keepalive_min_seconds` (60), 86 400], default 1 800). The clock starts
//! at `acp_close` and — unless `expire_idle_runs = false` — whenever the
//! run becomes idle (the backend never sends `acp_close`, so with the Node
//! behaviour instances were never reclaimed: reference §3.6 [QUIRK]). New
//! work stops the clock. On expiry the instance is removed and
//! `sandbox_instance_status missing` reported; the run (its record and
//! `init`) and the workspace stay, so a later prompt re-creates the
//! instance and resumes (the backend removes runs with `remove`, workspaces
//! with `remove_workspace` or `gc`). `expire_idle_runs` defaults to false,
//! as the Node proxy never expired runs.
//!
//! The agent (docs/acp.md): the lane holds the run's agent process
//! ([`super::agent`]: `Lane::open_agent` lands inputs, runs the init
//! script and starts the agent). A prompt turn runs on its own task, so
//! the lane keeps serving the run's other messages; session controls and
//! permission answers bypass the lane and reach the agent directly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::Daemon;
use super::protocol::{Incoming, RunMessage, SandboxControl, proxy_error_text, str_field};
use crate::hostfs::under_root::resolve_under_root;
use crate::provider::{InstanceConfig, InstanceInfo, InstanceStatus, Mount, Provider, names};

pub const DEFAULT_TTL: u64 = 1800;
pub const MAX_TTL: u64 = 86_400;
const STATE_VERSION: u32 = 1;
/// The lane of messages that concern no single run.
pub const GLOBAL: &str = "";

/// What is persisted per run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunState {
    pub version: u32,
    pub run_id: String,
    pub instance_name: String,
    pub keepalive_ttl_seconds: u64,
    /// Unix milliseconds; `None` while the run is busy or never closed.
    pub expires_at_ms: Option<u64>,
    /// Canonical host directory at `/workspace`.
    pub workspace: PathBuf,
    /// Canonical host directory at the guest home.
    pub home: PathBuf,
    pub home_guest: String,
    /// The last `init` received (script, timeout, env, agentInputs).
    pub init: Option<Value>,
    /// The sandbox user's ids (the docker container runs as them).
    #[serde(default = "default_id")]
    pub uid: u32,
    #[serde(default = "default_id")]
    pub gid: u32,
    pub created_at: String,
    pub updated_at: String,
    /// Fingerprints of the agentInputs targets as they were landed
    /// (`landed.rs`): landing again never overwrites the agent's work.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub landed: super::landed::Landed,
}

pub enum Job {
    Open(RunMessage),
    Prompt(RunMessage),
    Close(RunMessage),
    Session {
        kind: String,
        msg: RunMessage,
    },
    Permission(RunMessage),
    Control(SandboxControl),
    /// Remove instance `name` for `gc`/`prune_orphans`, in this run's order.
    Remove {
        name: String,
        done: oneshot::Sender<Result<(), String>>,
    },
    Adopt(Box<RunState>),
    /// The agent of `generation` exited.
    AgentExited {
        generation: u64,
    },
    /// A prompt turn ended.
    PromptDone,
}

fn default_id() -> u32 {
    1000
}

#[derive(Default)]
pub struct Runs {
    lanes: Mutex<HashMap<String, mpsc::UnboundedSender<Job>>>,
    agents: super::agent::Agents,
    /// Prompt turns whose `prompt_result` is not yet queued (all runs).
    turns: std::sync::atomic::AtomicUsize,
    /// The daemon is shutting down: no new agent starts.
    stopping: std::sync::atomic::AtomicBool,
}

impl Runs {
    fn lanes(&self) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::UnboundedSender<Job>>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many lanes exist (runs with state, plus busy ones).
    pub fn len(&self) -> usize {
        self.lanes().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live agent of `run`.
    pub fn agent(&self, run: &str) -> Option<Arc<crate::acp::host::Agent>> {
        self.agents.get(run)
    }

    /// Every live agent.
    pub fn all_agents(&self) -> Vec<Arc<crate::acp::host::Agent>> {
        self.agents.all()
    }

    pub fn set_agent(&self, run: &str, agent: Option<Arc<crate::acp::host::Agent>>) {
        self.agents.set(run, agent)
    }

    /// A prompt turn started (`true`) or queued its result (`false`).
    pub fn turn(&self, started: bool) {
        use std::sync::atomic::Ordering::SeqCst;
        if started {
            self.turns.fetch_add(1, SeqCst);
        } else {
            self.turns.fetch_sub(1, SeqCst);
        }
    }

    pub fn turns_in_flight(&self) -> usize {
        self.turns.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// From now on no agent starts (the daemon is shutting down).
    pub fn stop_starting(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Queues `job` on the lane of `key`, creating the lane if needed.
pub fn send(d: &Arc<Daemon>, key: &str, job: Job) {
    let mut lanes = d.runs.lanes();
    if let Some(tx) = lanes.get(key) {
        match tx.send(job) {
            Ok(()) => return,
            // The lane ended between our lookup and the send: start a new one.
            Err(mpsc::error::SendError(j)) => return start_lane(d, &mut lanes, key, j),
        }
    }
    start_lane(d, &mut lanes, key, job);
}

fn start_lane(d: &Arc<Daemon>, lanes: &mut HashMap<String, mpsc::UnboundedSender<Job>>, key: &str, job: Job) {
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(job).ok();
    lanes.insert(key.to_string(), tx);
    let lane = Lane {
        d: d.clone(),
        run_id: key.to_string(),
        state: None,
        agent: None,
        generation: 0,
        prompts: 0,
        init_sent: false,
    };
    tokio::spawn(lane.run(rx));
}

/// Routes a message: validates what a lane needs (the run id) and answers
/// an invalid one at once.
pub fn dispatch(d: &Arc<Daemon>, msg: Incoming) {
    match msg {
        Incoming::AcpOpen(m) => match valid_run_id(&m.run_id) {
            Ok(id) => send(d, &id, Job::Open(m)),
            Err(e) => reply_open(d, &m.run_id, Err(e)),
        },
        Incoming::PromptSend(m) => match valid_run_id(&m.run_id) {
            Ok(id) => send(d, &id, Job::Prompt(m)),
            Err(e) => reply_prompt(d, &m, Err(e)),
        },
        Incoming::AcpClose(m) => match valid_run_id(&m.run_id) {
            Ok(id) => send(d, &id, Job::Close(m)),
            Err(e) => d.outbox.push(&json!({"type":"acp_closed","run_id":m.run_id,"ok":false,"error":e})),
        },
        Incoming::SessionControl { kind, msg } => match valid_run_id(&msg.run_id) {
            // Straight to a live agent (never behind a prompt); the lane
            // answers the rest (missing fields, no agent).
            Ok(id) if session_fields_ok(&kind, &msg) && super::agent::direct(d, &id, &kind, &msg) => {}
            Ok(id) => send(d, &id, Job::Session { kind, msg }),
            Err(e) => reply_session(d, &msg, Err(e)),
        },
        Incoming::SessionPermission(m) => match valid_run_id(&m.run_id) {
            Ok(id) if super::agent::direct(d, &id, "session_permission", &m) => {}
            Ok(id) => send(d, &id, Job::Permission(m)),
            Err(e) => tracing::warn!("session_permission dropped: {e}"),
        },
        Incoming::AcpMessage(m) => match valid_run_id(&m.run_id) {
            Ok(id) if super::agent::direct(d, &id, "acp_message", &m) => {}
            Ok(id) => tracing::warn!("acp_message for run {id}: the run has no agent; dropped"),
            Err(e) => tracing::warn!("acp_message dropped: {e}"),
        },
        Incoming::SandboxControl(c) => match super::control::lane_of(d, &c) {
            Ok(key) => send(d, &key, Job::Control(c)),
            Err(e) => super::control::reply_error(d, &c, &e),
        },
        Incoming::RegisterAck(_) | Incoming::IdConflict { .. } => {}
    }
}

/// A run id as the backend must send it: a non-empty string of at most
/// 200 characters without `/`, `\`, `:`, whitespace or control characters.
pub fn valid_run_id(v: &Value) -> Result<String, String> {
    let Some(s) = v.as_str() else {
        return Err(if v.is_null() {
            "run_id is missing".into()
        } else {
            format!("run_id must be a string, got {v}")
        });
    };
    let s = s.trim();
    names::validate_run_id(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

/// The fields a session control must carry, as the Node proxy checks them.
fn session_missing(kind: &str, msg: &RunMessage) -> Option<String> {
    let extra = |k: &str| msg.extra.get(k).cloned().unwrap_or(Value::Null);
    let required: Vec<(&str, Value)> = match kind {
        "session_set_mode" => vec![("mode_id", extra("mode_id"))],
        "session_set_model" => vec![("model_id", extra("model_id"))],
        "session_set_config_option" => vec![("config_id", extra("config_id"))],
        _ => vec![],
    };
    [("control_id", msg.control_id.clone()), ("session_id", msg.session_id.clone())]
        .into_iter()
        .chain(required)
        .find(|(_, v)| str_field(v).is_none())
        .map(|(k, _)| format!("{k} 为空"))
}

fn session_fields_ok(kind: &str, msg: &RunMessage) -> bool {
    session_missing(kind, msg).is_none()
}

fn reply_open(d: &Daemon, run_id: &Value, result: Result<(), String>) {
    match result {
        Ok(()) => d.outbox.push(&json!({"type":"acp_opened","run_id":run_id,"ok":true})),
        Err(e) => {
            let e = d.redact(&e);
            if let Some(id) = run_id.as_str() {
                d.outbox.push(&proxy_error_text(id, &format!("acp_open failed: {e}")));
            }
            d.outbox.push(&json!({"type":"acp_opened","run_id":run_id,"ok":false,"error":e}));
        }
    }
}

pub(super) fn reply_prompt(d: &Daemon, m: &RunMessage, result: Result<(), String>) {
    if let Err(e) = result {
        let e = d.redact(&e);
        if let Some(id) = m.run_id.as_str() {
            d.outbox.push(&proxy_error_text(id, &e));
        }
        d.outbox.push(
            &json!({"type":"prompt_result","run_id":m.run_id,"prompt_id":m.prompt_id,"ok":false,"error":e}),
        );
    }
}

pub(super) fn reply_session(d: &Daemon, m: &RunMessage, result: Result<(), String>) {
    let mut v = json!({"type":"session_control_result","run_id":m.run_id,"control_id":m.control_id,"ok":result.is_ok()});
    if let Err(e) = result {
        v["error"] = json!(d.redact(&e));
    }
    d.outbox.push(&v);
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// One run's lane. `state` is `None` for a run the daemon does not hold
/// (e.g. an `inspect` of an unknown run) and for the global lane.
pub struct Lane {
    pub d: Arc<Daemon>,
    pub run_id: String,
    pub state: Option<RunState>,
    /// The run's agent process and ACP connection.
    pub agent: Option<Arc<crate::acp::host::Agent>>,
    /// Which agent process `agent` is (exit notices of older ones are ignored).
    pub generation: u64,
    /// Prompt turns in flight (the run is not idle while any is).
    pub prompts: usize,
    /// The backend sent `init` since inputs last landed: the next landing
    /// is the one it asked for (else it protects the agent's work).
    pub init_sent: bool,
}

impl Lane {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Job>) {
        loop {
            let deadline =
                self.state.as_ref().and_then(|s| s.expires_at_ms).map(|at| {
                    tokio::time::Instant::now() + Duration::from_millis(at.saturating_sub(now_ms()))
                });
            tokio::select! {
                job = rx.recv() => match job {
                    Some(job) => self.handle(job).await,
                    None => break,
                },
                _ = sleep_until_opt(deadline) => self.expire().await,
            }
            if self.state.is_none() {
                let mut lanes = self.d.runs.lanes();
                if rx.is_empty() {
                    lanes.remove(&self.run_id);
                    break;
                }
            }
        }
    }

    async fn handle(&mut self, job: Job) {
        match job {
            Job::Open(mut m) => {
                let t0 = std::time::Instant::now();
                let result = self.d.cfg.sandbox.path_mapping.apply(&mut m);
                let result = match result {
                    Ok(()) => self.prepare(&m.instance_name, &m.keepalive_ttl_seconds, &m.init).await,
                    Err(e) => Err(e),
                };
                let prepared = t0.elapsed();
                let result = match result {
                    Ok(()) => self.open_agent(&m.cwd).await,
                    Err(e) => Err(e),
                };
                // The open path's own share against the agent's start
                // (docs/benchmarks.md, issue 18); `start_agent` logs its part.
                tracing::debug!(
                    "run {}: acp_open: instance ready in {prepared:?}, answered after {:?}",
                    self.run_id,
                    t0.elapsed()
                );
                // The backend may rely on the run once it has the answer
                // (its instance exists, ok or not): its record first.
                self.persist_durably().await;
                reply_open(&self.d, &m.run_id, result);
                self.idle();
            }
            Job::Prompt(mut m) => {
                let mapped = self.d.cfg.sandbox.path_mapping.apply(&mut m);
                let result = if let Err(e) = mapped {
                    Err(e)
                } else if str_field(&m.prompt_id).is_none() {
                    Err("prompt_id 为空".to_string())
                } else if !m.extra.get("prompt").is_some_and(Value::is_array) {
                    Err("prompt 必须是数组".to_string())
                } else {
                    match self.prepare(&m.instance_name, &m.keepalive_ttl_seconds, &m.init).await {
                        Ok(()) => self.open_agent(&m.cwd).await,
                        Err(e) => Err(e),
                    }
                };
                match result {
                    Ok(()) => self.start_prompt(m),
                    Err(e) => {
                        reply_prompt(&self.d, &m, Err(e));
                        self.idle();
                    }
                }
            }
            Job::PromptDone => {
                self.prompts = self.prompts.saturating_sub(1);
                self.idle();
            }
            Job::AgentExited { generation } => {
                if generation == self.generation && self.agent.is_some() {
                    self.agent = None;
                    self.d.runs.set_agent(&self.run_id, None);
                    if let Some(state) = &self.state
                        && let Ok(info) = self.d.provider.inspect(&state.instance_name).await
                    {
                        self.d.report_status(&self.run_id, &info);
                    }
                }
            }
            Job::Close(m) => {
                if self.state.is_some() {
                    self.close_agent("requested").await;
                }
                let reply = match &mut self.state {
                    Some(state) => {
                        state.expires_at_ms = Some(now_ms() + state.keepalive_ttl_seconds * 1000);
                        self.persist();
                        json!({"type":"acp_closed","run_id":m.run_id,"ok":true})
                    }
                    None => json!({"type":"acp_closed","run_id":m.run_id,"ok":false,"error":"run_not_found"}),
                };
                self.d.outbox.push(&reply);
            }
            Job::Session { kind, msg } => {
                // A live agent is reached directly by `dispatch`; here: a
                // missing field, or no agent (the Node proxy's run_not_open).
                let e = session_missing(&kind, &msg).unwrap_or_else(|| "run_not_open".into());
                reply_session(&self.d, &msg, Err(e));
            }
            Job::Permission(m) => {
                tracing::info!(
                    "session_permission for run {}: no pending permission request (no agent)",
                    m.run_id.as_str().unwrap_or("?")
                );
            }
            Job::Control(c) => super::control::handle(self, c).await,
            Job::Remove { name, done } => {
                let result = self.remove_instance(&name).await.map(drop);
                let _ = done.send(result);
            }
            Job::Adopt(state) => self.adopt(*state).await,
        }
    }

    /// Starts the keepalive clock of an idle run (see the module doc).
    fn idle(&mut self) {
        if !self.d.cfg.expire_idle_runs || self.prompts > 0 {
            return;
        }
        if let Some(state) = &mut self.state
            && state.expires_at_ms.is_none()
        {
            state.expires_at_ms = Some(now_ms() + state.keepalive_ttl_seconds * 1000);
            self.persist();
        }
    }

    /// The TTL from a message: clamped, default 1 800 (or the run's current one).
    fn ttl(&self, v: &Value) -> u64 {
        let min = self.d.cfg.keepalive_min_seconds;
        match v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok())) {
            Some(n) if n.is_finite() => (n.max(0.0) as u64).clamp(min, MAX_TTL),
            _ => self.state.as_ref().map_or(DEFAULT_TTL.clamp(min, MAX_TTL), |s| s.keepalive_ttl_seconds),
        }
    }

    /// `ensureRuntime`: validates the instance name, TTL and init; makes
    /// sure the run's directories and instance exist and run; persists the
    /// state. Stops the keepalive clock (work is in flight).
    pub async fn prepare(&mut self, instance_name: &Value, ttl: &Value, init: &Value) -> Result<(), String> {
        let name = self.instance_name(instance_name)?;
        let ttl = self.ttl(ttl);
        let init = match init {
            Value::Null => None,
            v => Some(check_init(v)?),
        };
        if let Some(env) = init.as_ref().and_then(|i| i.get("env")).and_then(Value::as_object) {
            self.d.add_secrets(env.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v))));
        }
        let effective_init = init.clone().or_else(|| self.state.as_ref().and_then(|s| s.init.clone()));
        let env = init_env(effective_init.as_ref());
        let root = self.d.cfg.sandbox.workspace_host_root.clone();
        let workspace = match (&self.state, &init) {
            (Some(state), None) => state.workspace.clone(),
            _ => {
                let wanted = workspace_from_init(effective_init.as_ref(), &env)
                    .unwrap_or_else(|| root.join(format!("run-{}", self.run_id)));
                resolve_under_root(&root, &wanted, true)?
            }
        };
        let home = resolve_under_root(&root, &root.join(format!("home-{}", self.run_id)), true)?;
        let home_guest = ["USER_HOME", "HOME"]
            .iter()
            .find_map(|k| env.get(*k).filter(|v| !v.is_empty()).cloned())
            .unwrap_or_else(|| "/root".into());
        let home_guest = sandbox::guest_path::normalize(&home_guest)
            .map_err(|why| format!("USER_HOME/HOME {home_guest:?} {why}"))?;
        if sandbox::guest_path::is_within(&home_guest, sandbox::WORKSPACE) {
            return Err("USER_HOME/HOME must not be /workspace or inside /workspace".into());
        }
        let user = user_view(&env, &home_guest)?;
        let (uid, gid) = (user.uid, user.gid);
        if self.d.cfg.sandbox.provider == super::config::ProviderChoice::Docker {
            chown_new(&workspace, &user);
            chown_new(&home, &user);
        }
        // The manifest's binds are the instance's: a read-only WORKSPACE
        // bind shows the workspace read-only, other bindMount items are
        // mounted where they target (binds are fixed when the instance is
        // made; the applier only records them).
        let (workspace_read_only, manifest_binds) = match effective_init.as_ref() {
            Some(init) => manifest_binds(&self.d, init, &home_guest)?,
            None => (false, Vec::new()),
        };
        let run_mounts = super::mounts::prepare(&self.d, &self.run_id, &user, &home_guest)?;
        let mut mounts: Vec<Mount> = self
            .d
            .cfg
            .sandbox
            .volumes
            .iter()
            .map(|v| Mount::Bind {
                src: v.host_path.clone(),
                dst: v.guest_path.clone(),
                access: if v.read_only { sandbox::Access::Ro } else { sandbox::Access::Rw },
            })
            .collect();
        mounts.extend(run_mounts);
        mounts.extend(manifest_binds);
        let config = InstanceConfig {
            image: match self.d.cfg.sandbox.provider {
                super::config::ProviderChoice::Docker => self.d.cfg.sandbox.image.clone(),
                _ => None,
            },
            home: Some(home.clone()),
            workspace_read_only,
            user,
            network: self.d.cfg.sandbox.network,
            mounts,
            env: self.d.cfg.sandbox.env.clone(),
            nested: self.d.cfg.sandbox.nested,
            ..InstanceConfig::new(name.clone(), self.run_id.clone(), workspace.clone())
        };
        let info = match self.d.provider.ensure(&config).await {
            Ok(info) => info,
            Err(e) => {
                let e = e.to_string();
                self.d.report_error_status(&self.run_id, &name, &e);
                return Err(e);
            }
        };
        self.d.report_status(&self.run_id, &info);
        let now = super::now_iso();
        let state = self.state.get_or_insert_with(|| RunState {
            version: STATE_VERSION,
            run_id: self.run_id.clone(),
            instance_name: name.clone(),
            keepalive_ttl_seconds: ttl,
            expires_at_ms: None,
            workspace: workspace.clone(),
            home: home.clone(),
            home_guest: home_guest.clone(),
            init: None,
            uid,
            gid,
            created_at: now.clone(),
            updated_at: now.clone(),
            landed: Default::default(),
        });
        state.keepalive_ttl_seconds = ttl;
        state.expires_at_ms = None;
        state.workspace = workspace;
        state.home = home;
        state.home_guest = home_guest;
        state.uid = uid;
        state.gid = gid;
        if init.is_some() {
            state.init = init;
            self.init_sent = true;
        }
        state.updated_at = now;
        self.persist();
        if info.status != InstanceStatus::Running {
            return Err(format!("sandbox 实例未处于 running 状态：{}", info.status.as_str()));
        }
        Ok(())
    }

    /// The run's instance name: the message's (validated), else the
    /// existing one, else `<prefix><run_id>`. A different name than the
    /// run's existing instance is an error.
    fn instance_name(&self, v: &Value) -> Result<String, String> {
        let name = match v {
            Value::Null => None,
            Value::String(s) if s.trim().is_empty() => None,
            Value::String(s) => Some(s.trim().to_string()),
            other => return Err(format!("instance_name must be a string, got {other}")),
        };
        let name = match (name, &self.state) {
            (Some(n), _) => n,
            (None, Some(state)) => state.instance_name.clone(),
            (None, None) => format!("{}{}", self.d.cfg.sandbox.instance_prefix, self.run_id),
        };
        names::validate_instance_name(&name, &self.d.cfg.sandbox.instance_prefix)
            .map_err(|e| e.to_string())?;
        if let Some(state) = &self.state
            && state.instance_name != name
        {
            return Err(format!(
                "instance_name {name:?} differs from the run's existing instance {:?} (instanceName 与既有运行时不一致)",
                state.instance_name
            ));
        }
        Ok(name)
    }

    /// Keepalive expired: the agent is closed and the instance removed
    /// (reported `missing`), but the run is **kept**: its record and its
    /// last `init` stay, so a later `prompt_send` without `init` (all the
    /// backend sends for a run it still holds open) makes a new instance
    /// over the same workspace and home, starts the agent and resumes the
    /// session. Only `remove` (and `prune_orphans`/`gc`) forget a run.
    async fn expire(&mut self) {
        let Some(state) = &self.state else { return };
        let name = state.instance_name.clone();
        tracing::info!("run {}: keepalive expired, removing instance {name} (the run is kept)", self.run_id);
        self.close_agent("keepalive_expired").await;
        match self.d.provider.remove(&name).await {
            Ok(info) => {
                // The instance's scratch and staged secrets go with it.
                super::mounts::discard(&self.d, &self.run_id);
                self.d.report_status(&self.run_id, &info);
                if let Some(state) = &mut self.state {
                    state.expires_at_ms = None;
                    state.updated_at = super::now_iso();
                }
                self.persist();
            }
            Err(e) => {
                let e = e.to_string();
                tracing::error!(
                    "run {}: removing expired instance {name}: {e}; retrying in 60 s",
                    self.run_id
                );
                self.d.report_error_status(&self.run_id, &name, &e);
                if let Some(state) = &mut self.state {
                    state.expires_at_ms = Some(now_ms() + 60_000);
                }
            }
        }
    }

    /// Removes instance `name`; if it is this run's, the run is forgotten.
    pub async fn remove_instance(&mut self, name: &str) -> Result<InstanceInfo, String> {
        match self.d.provider.remove(name).await {
            Ok(info) => {
                if self.state.as_ref().is_some_and(|s| s.instance_name == name) {
                    self.forget();
                }
                if !self.run_id.is_empty() {
                    self.d.report_status(&self.run_id, &info);
                }
                Ok(info)
            }
            Err(e) => {
                let e = e.to_string();
                if !self.run_id.is_empty() {
                    self.d.report_error_status(&self.run_id, name, &e);
                }
                Err(e)
            }
        }
    }

    async fn adopt(&mut self, state: RunState) {
        let name = state.instance_name.clone();
        self.state = Some(state);
        match self.d.provider.inspect(&name).await {
            Ok(info) => {
                tracing::info!("run {}: re-adopted instance {name} ({})", self.run_id, info.status.as_str());
                self.d.report_status(&self.run_id, &info);
            }
            Err(e) => tracing::warn!("run {}: inspecting {name}: {e}", self.run_id),
        }
        self.idle();
    }

    fn state_path(&self) -> PathBuf {
        self.d.runs_dir.join(format!("{}.json", self.run_id))
    }

    /// Writes the run state (atomically, 0600) off the daemon's thread
    /// (`persist.rs`); failures are logged and reported, never fatal to
    /// the message at hand.
    pub fn persist(&mut self) {
        let Some(state) = &self.state else { return };
        let bytes = serde_json::to_vec_pretty(state).expect("plain data");
        super::persist::Persister::write(&self.d, &self.run_id, self.state_path(), Some(bytes));
    }

    /// As [`Lane::persist`], and waits until the state is on disk.
    pub async fn persist_durably(&mut self) {
        let Some(state) = &self.state else { return };
        let bytes = serde_json::to_vec_pretty(state).expect("plain data");
        let written =
            super::persist::Persister::write_durably(&self.d, &self.run_id, self.state_path(), Some(bytes));
        // Err: the writer went away (the daemon is stopping); nothing to wait for.
        let _ = written.await;
    }

    /// Drops the run's state, in memory and on disk, with the files the
    /// daemon kept for its instance (scratch, staged secrets).
    pub fn forget(&mut self) {
        self.state = None;
        super::mounts::discard(&self.d, &self.run_id);
        super::persist::Persister::write(&self.d, &self.run_id, self.state_path(), None);
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Loads every persisted run and hands it to its lane.
pub async fn adopt_persisted(d: &Arc<Daemon>) {
    let entries = match std::fs::read_dir(&d.runs_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::error!("reading {}: {e}", d.runs_dir.display());
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let loaded = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<RunState>(&b).map_err(|e| e.to_string()))
            .and_then(|s| {
                if s.version != STATE_VERSION {
                    Err(format!("version {} is not supported", s.version))
                } else if s.run_id != stem || names::validate_run_id(&s.run_id).is_err() {
                    Err(format!("run_id {:?} does not match the file name", s.run_id))
                } else {
                    Ok(s)
                }
            });
        match loaded {
            Ok(state) => {
                if let Some(env) = state.init.as_ref().and_then(|i| i.get("env")).and_then(Value::as_object) {
                    d.add_secrets(env.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v))));
                }
                let key = state.run_id.clone();
                send(d, &key, Job::Adopt(Box::new(state)));
            }
            Err(e) => tracing::error!("{}: {e}; left as it is", path.display()),
        }
    }
}

/// Validates `init` as the Node proxy does (reference §1.3 table).
fn check_init(v: &Value) -> Result<Value, String> {
    let Some(obj) = v.as_object() else {
        return Err("init must be an object".into());
    };
    if let Some(s) = obj.get("script")
        && !s.is_string()
        && !s.is_null()
    {
        return Err("init.script must be a string".into());
    }
    if let Some(t) = obj.get("timeout_seconds")
        && !t.is_null()
        && !t.as_f64().is_some_and(f64::is_finite)
    {
        return Err("init.timeout_seconds must be a number".into());
    }
    if let Some(env) = obj.get("env")
        && !env.is_null()
    {
        let Some(env) = env.as_object() else {
            return Err("init.env must be an object".into());
        };
        for (k, v) in env {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            names::validate_env(k, &text).map_err(|e| format!("init.env: {e}"))?;
        }
    }
    Ok(v.clone())
}

/// `init.env` as strings (non-strings stringified, null → "").
pub(super) fn init_env(init: Option<&Value>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    if let Some(env) = init.and_then(|i| i.get("env")).and_then(Value::as_object) {
        for (k, v) in env {
            let v = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            out.insert(k.clone(), v);
        }
    }
    out
}

/// The host workspace the run asks for: the agentInputs `WORKSPACE`
/// bindMount (target `""`/`"."`), else an absolute `TUIXIU_WORKSPACE`.
fn workspace_from_init(init: Option<&Value>, env: &HashMap<String, String>) -> Option<PathBuf> {
    let items = init?.pointer("/agentInputs/items").and_then(Value::as_array);
    for item in items.into_iter().flatten() {
        let is_ws = item.get("apply").and_then(Value::as_str) == Some("bindMount")
            && item.pointer("/target/root").and_then(Value::as_str) == Some("WORKSPACE")
            && matches!(
                item.pointer("/target/path").and_then(Value::as_str).map(str::trim),
                None | Some("" | ".")
            );
        if is_ws && let Some(p) = item.pointer("/source/path").and_then(Value::as_str).map(str::trim) {
            return Some(PathBuf::from(p));
        }
    }
    env.get("TUIXIU_WORKSPACE").map(PathBuf::from).filter(|p| p.is_absolute())
}

/// From a run's `init.agentInputs`: whether the WORKSPACE `"."` bind is
/// read-only, and the other bindMount items as instance mounts.
fn manifest_binds(d: &Daemon, init: &Value, home_guest: &str) -> Result<(bool, Vec<Mount>), String> {
    let Some(value) = init.get("agentInputs").filter(|v| !v.is_null()) else {
        return Ok((false, Vec::new()));
    };
    let manifest = crate::manifest::parse_value(value).map_err(|e| e.to_string())?;
    let plan =
        crate::inputs::Plan::new(manifest, &super::agent::inputs_config(d)?).map_err(|e| e.to_string())?;
    let layout = crate::inputs::Layout::new(home_guest.to_string());
    let read_only = plan.workspace().is_some_and(|(_, a)| a == crate::manifest::Access::Ro);
    let binds = plan
        .binds()
        .map(|(_, planned, host, access)| Mount::Bind {
            src: host.canonical.clone(),
            dst: layout.guest(planned.item.target.root, &planned.item.target.path),
            access: match access {
                crate::manifest::Access::Ro => sandbox::Access::Ro,
                crate::manifest::Access::Rw => sandbox::Access::Rw,
            },
        })
        .collect();
    Ok((read_only, binds))
}

/// The sandbox user's name from env pairs (the bwrap provider's rules).
pub fn user_name(env: &[(String, String)]) -> String {
    let get =
        |k: &str| env.iter().rev().find(|(key, v)| key == k && !v.trim().is_empty()).map(|(_, v)| v.trim());
    get("TUIXIU_BWRAP_USERNAME")
        .or_else(|| get("USER"))
        .or_else(|| get("LOGNAME"))
        .unwrap_or("agent")
        .to_string()
}

/// The sandbox user from `init.env` (the bwrap provider's rules).
fn user_view(env: &HashMap<String, String>, home: &str) -> Result<sandbox::UserView, String> {
    let get = |k: &str| env.get(k).map(|s| s.trim()).filter(|s| !s.is_empty());
    let name =
        get("TUIXIU_BWRAP_USERNAME").or_else(|| get("USER")).or_else(|| get("LOGNAME")).unwrap_or("agent");
    let uid = match get("TUIXIU_BWRAP_UID") {
        Some(s) => s.parse::<u32>().map_err(|_| format!("TUIXIU_BWRAP_UID {s:?} is not a uid"))?,
        None => 1000,
    };
    let gid = match get("TUIXIU_BWRAP_GID") {
        Some(s) => s.parse::<u32>().map_err(|_| format!("TUIXIU_BWRAP_GID {s:?} is not a gid"))?,
        None => uid,
    };
    let mut user = sandbox::UserView::new(name, uid, gid);
    user.home = home.to_string();
    user.validate().map_err(|e| format!("sandbox user: {e}"))?;
    Ok(user)
}

/// Gives a directory the daemon just created to the container user (docker
/// runs processes as that uid, unlike the native sandbox's id map).
pub(super) fn chown_new(dir: &Path, user: &sandbox::UserView) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids() {
        assert_eq!(valid_run_id(&json!(" r1 ")).unwrap(), "r1");
        for bad in [json!("../x"), json!(""), json!(3), json!(null), json!("a:b"), json!("a\\b")] {
            assert!(valid_run_id(&bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn init_checks() {
        assert!(check_init(&json!({"script":"x","timeout_seconds":3,"env":{"A":"b"}})).is_ok());
        assert!(check_init(&json!("x")).is_err());
        assert!(check_init(&json!({"script":3})).is_err());
        assert!(check_init(&json!({"env":[]})).is_err());
        assert!(check_init(&json!({"env":{"A":"x\ny"}})).is_err());
    }
}
