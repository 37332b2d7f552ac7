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
//! (docs/protocol.md, "Reconnects and restarts").
//!
//! Keepalive: `keepalive_ttl_seconds` (clamped to [`keepalive_min_seconds`
//! (60), 86 400], default 1 800). The clock starts at `acp_close` and — unless
//! `expire_idle_runs = false` — whenever the run becomes idle (the backend
//! never sends `acp_close`, so with the Node behaviour instances were never
//! reclaimed: docs/protocol.md, "Keepalive"). New work stops the clock. On
//! expiry the instance is removed and `sandbox_instance_status missing`
//! reported; the run (its record and `init`) and the workspace stay, so a later
//! prompt re-creates the instance and resumes (the backend removes runs with
//! `remove`, workspaces with `remove_workspace` or `gc`). `expire_idle_runs`
//! defaults to false, as the Node proxy never expired runs.
//!
//! The agent (docs/acp.md): the lane holds the run's agent process
//! ([`super::agent`]: `Lane::open_agent` lands inputs, runs the init
//! script and starts the agent). A prompt turn runs on its own task, so
//! the lane keeps serving the run's other messages; session controls and
//! permission answers bypass the lane and reach the agent directly.
//!
//! [`RunContext`] is what the daemon gives its runs: the parts, each made
//! once with what it uses, and what this file's routing and loop use
//! themselves.

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use super::agent::{AgentError, AgentPart};
use super::config::Config;
use super::control::ControlPart;
use super::instance::{InstanceError, InstancePart, InstanceSettings};
use super::landing::Landing;
use super::lane::{Lane, LaneParts};
use super::mounts::Mounts;
use super::pathmap::{PathMapError, PathMapping};
use super::persist::Persister;
use super::protocol::{Incoming, ProxyUpdate, RunMessage, RunReply, str_field};
use super::report::Reporter;
use super::shared::{
    Job, NewLane, Records, RunIdError, RunState, Runs, STATE_VERSION, now_ms, reply_prompt, reply_session,
    send, valid_run_id,
};
use super::signing::Signer;
use crate::provider::{AnyProvider, Provider, names};

/// Why a run's message failed, as its reply says it.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    RunId(#[from] RunIdError),
    #[error(transparent)]
    PathMap(#[from] PathMapError),
    #[error(transparent)]
    Instance(#[from] InstanceError),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("prompt_id 为空")]
    NoPromptId,
    #[error("prompt 必须是数组")]
    PromptNotArray,
    /// A session control without one of its fields.
    #[error("{0} 为空")]
    Missing(&'static str),
    /// A session control for a run without an agent.
    #[error("run_not_open")]
    NotOpen,
}

/// What the daemon gives its runs: the parts of a lane, the controls, and
/// what the routing and the lane's loop here use themselves (the lanes,
/// the reporter, the provider and mounts an expiry acts on, two config
/// values). The link's state and secrets are not here: a run never needs
/// them.
pub struct RunContext {
    runs: Arc<Runs>,
    report: Arc<Reporter>,
    provider: Arc<AnyProvider>,
    mounts: Arc<Mounts>,
    records: Records,
    parts: Arc<LaneParts>,
    controls: ControlPart,
    /// `sandbox.pathMapping`, applied to `acp_open` and `prompt_send`.
    path_mapping: PathMapping,
    /// `expire_idle_runs`: the keepalive clock starts when a run is idle.
    expire_idle_runs: bool,
}

impl RunContext {
    /// Each part made from `cfg` and the services it uses; with the lanes
    /// to start, for [`serve_lanes`]. Only the controls get the `signer`,
    /// only the agent part the `landing` (and its download token); `cfg`
    /// is not kept.
    pub fn new(
        cfg: &Config,
        provider: AnyProvider,
        report: Arc<Reporter>,
        mounts: Mounts,
        signer: Signer,
        landing: Landing,
    ) -> (RunContext, mpsc::UnboundedReceiver<NewLane>) {
        let (runs, new_lanes) = Runs::new();
        let (runs, provider, mounts) = (Arc::new(runs), Arc::new(provider), Arc::new(mounts));
        let pool = crate::blocking::Pool::daemon();
        let records = Records::new(Persister::new(report.clone()), cfg.state_dir.join("runs"));
        let instances = InstancePart::new(
            provider.clone(),
            mounts.clone(),
            report.clone(),
            landing.planning(),
            InstanceSettings::new(cfg),
        );
        let agents = AgentPart::new(
            cfg,
            runs.clone(),
            provider.clone(),
            report.clone(),
            mounts.clone(),
            pool.clone(),
            landing,
        );
        let controls = ControlPart::new(cfg, provider.clone(), report.clone(), signer, runs.clone(), pool);
        let run = RunContext {
            parts: Arc::new(LaneParts::new(instances, agents, records.clone())),
            records,
            controls,
            runs,
            report,
            provider,
            mounts,
            path_mapping: cfg.sandbox.path_mapping.clone(),
            expire_idle_runs: cfg.expire_idle_runs,
        };
        (run, new_lanes)
    }

    /// Starts `task` on the runs' event loop, from whichever thread.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.runs.spawn(task)
    }

    pub fn runs(&self) -> &Runs {
        &self.runs
    }

    /// The outbox, the redactor and the instance status reports.
    pub fn report(&self) -> &Arc<Reporter> {
        &self.report
    }

    pub fn provider(&self) -> &AnyProvider {
        &self.provider
    }

    /// `/scratch`, the agent's state and secrets of every instance.
    pub fn mounts(&self) -> &Mounts {
        &self.mounts
    }

    /// Where run states are written (`<state>/runs`).
    pub fn records(&self) -> &Records {
        &self.records
    }

    /// What an agent started outside a lane gets (`acp_sink.rs`).
    pub fn acp_context(&self) -> crate::acp::port::Context {
        self.parts.acp_context()
    }
}

/// Starts every new lane (`shared::send` queues a run's first job and hands
/// the queue over) on its own task, until the runs' context is gone.
pub async fn serve_lanes(d: Weak<RunContext>, mut new_lanes: mpsc::UnboundedReceiver<NewLane>) {
    while let Some(NewLane { key, jobs }) = new_lanes.recv().await {
        let Some(d) = d.upgrade() else { break };
        let lane = Lane::new(d.parts.clone(), key);
        d.spawn(LaneLoop { lane, d: d.clone() }.run(jobs));
    }
}

/// Routes a message: validates what a lane needs (the run id) and answers
/// an invalid one at once.
pub fn dispatch(d: &Arc<RunContext>, msg: Incoming) {
    match msg {
        Incoming::AcpOpen(m) => match valid_run_id(&m.run_id) {
            Ok(id) => send(&d.runs, &id, Job::Open(m)),
            Err(e) => reply_open(d.report(), &m.run_id, Err(e.into())),
        },
        Incoming::PromptSend(m) => match valid_run_id(&m.run_id) {
            Ok(id) => send(&d.runs, &id, Job::Prompt(m)),
            Err(e) => reply_prompt(d.report(), &m, Err(e)),
        },
        Incoming::AcpClose(m) => match valid_run_id(&m.run_id) {
            Ok(id) => send(&d.runs, &id, Job::Close(m)),
            Err(e) => d.report().push(&RunReply::closed(&m.run_id, Err(e.to_string()))),
        },
        Incoming::SessionControl { kind, msg } => match valid_run_id(&msg.run_id) {
            // Straight to a live agent (never behind a prompt); the lane
            // answers the rest (missing fields, no agent).
            Ok(id) if session_fields_ok(&kind, &msg) && d.parts.direct(&id, &kind, &msg) => {}
            Ok(id) => send(&d.runs, &id, Job::Session { kind, msg }),
            Err(e) => reply_session(d.report(), &msg, Err(e)),
        },
        Incoming::SessionPermission(m) => match valid_run_id(&m.run_id) {
            Ok(id) if d.parts.direct(&id, "session_permission", &m) => {}
            Ok(id) => send(&d.runs, &id, Job::Permission(m)),
            Err(e) => tracing::warn!("session_permission dropped: {e}"),
        },
        Incoming::AcpMessage(m) => match valid_run_id(&m.run_id) {
            Ok(id) if d.parts.direct(&id, "acp_message", &m) => {}
            Ok(id) => tracing::warn!("acp_message for run {id}: the run has no agent; dropped"),
            Err(e) => tracing::warn!("acp_message dropped: {e}"),
        },
        Incoming::SandboxControl(c) => match super::control::lane_of(&d.controls, &c) {
            // A read that needs no lane state is answered here when its
            // run has nothing pending (never behind the runs' thread).
            Ok(key) if super::control::answer_now(&d.controls, &key, &c) => {}
            Ok(key) => send(&d.runs, &key, Job::Control(c)),
            Err(e) => super::control::reply_error(&d.controls, &c, &e),
        },
        Incoming::RegisterAck(_) | Incoming::IdConflict { .. } => {}
    }
}

/// The fields a session control must carry, as the Node proxy checks them.
fn session_missing(kind: &str, msg: &RunMessage) -> Option<RunError> {
    let extra = |k: &str| msg.extra.get(k).cloned().unwrap_or(Value::Null);
    let required: Vec<(&'static str, Value)> = match kind {
        "session_set_mode" => vec![("mode_id", extra("mode_id"))],
        "session_set_model" => vec![("model_id", extra("model_id"))],
        "session_set_config_option" => vec![("config_id", extra("config_id"))],
        _ => vec![],
    };
    [("control_id", msg.control_id.clone()), ("session_id", msg.session_id.clone())]
        .into_iter()
        .chain(required)
        .find(|(_, v)| str_field(v).is_none())
        .map(|(k, _)| RunError::Missing(k))
}

fn session_fields_ok(kind: &str, msg: &RunMessage) -> bool {
    session_missing(kind, msg).is_none()
}

fn reply_open(report: &Reporter, run_id: &Value, result: Result<(), RunError>) {
    match result {
        Ok(()) => report.push(&RunReply::opened(run_id, Ok(()))),
        Err(e) => {
            let e = report.redact(&e.to_string());
            if let Some(id) = run_id.as_str() {
                report.push(&ProxyUpdate::error(id, &format!("acp_open failed: {e}")));
            }
            report.push(&RunReply::opened(run_id, Err(e)));
        }
    }
}

/// A lane as its loop runs it: the lane, and what the loop itself uses.
struct LaneLoop {
    lane: Lane,
    d: Arc<RunContext>,
}

impl LaneLoop {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Job>) {
        loop {
            let deadline =
                self.lane.state().and_then(|s| s.expires_at_ms).map(|at| {
                    tokio::time::Instant::now() + Duration::from_millis(at.saturating_sub(now_ms()))
                });
            tokio::select! {
                job = rx.recv() => match job {
                    Some(job) => {
                        self.handle(job).await;
                        self.d.runs().finished(self.lane.run_id());
                    }
                    None => break,
                },
                _ = sleep_until_opt(deadline) => {
                    self.d.runs().begin(self.lane.run_id());
                    self.expire().await;
                    self.d.runs().finished(self.lane.run_id());
                }
            }
            if self.lane.state().is_none() {
                let mut lanes = self.d.runs().lanes();
                if rx.is_empty() {
                    lanes.remove(self.lane.run_id());
                    break;
                }
            }
        }
    }

    async fn handle(&mut self, job: Job) {
        match job {
            Job::Open(m) => self.open(m).await,
            Job::Prompt(m) => self.prompt(m).await,
            Job::PromptDone => {
                self.lane.agent_slot_mut().prompt_done();
                self.idle();
            }
            Job::AgentExited { generation } => {
                if self.lane.agent_slot_mut().exited(generation) {
                    self.d.runs().set_agent(self.lane.run_id(), None);
                    if let Some(state) = self.lane.state()
                        && let Ok(info) = self.d.provider().inspect(&state.instance_name).await
                    {
                        self.d.report().status(self.lane.run_id(), &info);
                    }
                }
            }
            Job::Close(m) => {
                if self.lane.state().is_some() {
                    self.lane.close_agent("requested").await;
                }
                let reply = match self.lane.state_mut() {
                    Some(state) => {
                        state.expires_at_ms = Some(now_ms() + state.keepalive_ttl_seconds * 1000);
                        self.lane.persist();
                        RunReply::closed(&m.run_id, Ok(()))
                    }
                    None => RunReply::closed(&m.run_id, Err("run_not_found".into())),
                };
                self.d.report().push(&reply);
            }
            Job::Session { kind, msg } => {
                // A live agent is reached directly by `dispatch`; here: a
                // missing field, or no agent (the Node proxy's run_not_open).
                let e = session_missing(&kind, &msg).unwrap_or(RunError::NotOpen);
                reply_session(self.d.report(), &msg, Err(e));
            }
            Job::Permission(m) => {
                tracing::info!(
                    "session_permission for run {}: no pending permission request (no agent)",
                    m.run_id.as_str().unwrap_or("?")
                );
            }
            Job::Control(c) => super::control::handle(&self.d.controls, &mut self.lane, c).await,
            Job::Remove { name, done } => {
                let result = self.lane.remove_instance(&name).await.map(drop);
                let _ = done.send(result);
            }
            Job::Adopt(state) => self.adopt(*state).await,
        }
    }

    /// `acp_open`: the instance prepared, the agent started, answered.
    async fn open(&mut self, mut m: RunMessage) {
        let t0 = std::time::Instant::now();
        let result: Result<(), RunError> = self.d.path_mapping.apply(&mut m).map_err(Into::into);
        let result = match result {
            Ok(()) => self
                .lane
                .prepare(&m.instance_name, &m.keepalive_ttl_seconds, &m.init)
                .await
                .map_err(Into::into),
            Err(e) => Err(e),
        };
        let prepared = t0.elapsed();
        // The backend may rely on the run once it has the answer (its
        // instance exists, ok or not): `prepare` queued the record,
        // whose `fsync` overlaps the agent's start; the answer waits
        // for it below.
        let record = self.lane.persisted();
        let result = match result {
            Ok(()) => self.lane.open_agent(&m.cwd).await.map_err(Into::into),
            Err(e) => Err(e),
        };
        // The open path's own share against the agent's start
        // (docs/benchmarks.md, "Execution-plane daemon"); `start_agent`
        // logs its part.
        tracing::debug!(
            "run {}: acp_open: instance ready in {prepared:?}, answered after {:?}",
            self.lane.run_id(),
            t0.elapsed()
        );
        if let Some(record) = record {
            // Err: the writer went away (the daemon is stopping).
            let _ = record.await;
        }
        reply_open(self.d.report(), &m.run_id, result);
        self.idle();
    }

    /// `prompt_send`: the instance and agent made ready if needed, then
    /// the turn started (answered when it ends) or the failure answered.
    async fn prompt(&mut self, mut m: RunMessage) {
        let mapped = self.d.path_mapping.apply(&mut m);
        let result: Result<(), RunError> = if let Err(e) = mapped {
            Err(e.into())
        } else if str_field(&m.prompt_id).is_none() {
            Err(RunError::NoPromptId)
        } else if !m.extra.get("prompt").is_some_and(Value::is_array) {
            Err(RunError::PromptNotArray)
        } else {
            match self.lane.prepare(&m.instance_name, &m.keepalive_ttl_seconds, &m.init).await {
                Ok(()) => self.lane.open_agent(&m.cwd).await.map_err(Into::into),
                Err(e) => Err(e.into()),
            }
        };
        match result {
            Ok(()) => self.lane.start_prompt(m),
            Err(e) => {
                reply_prompt(self.d.report(), &m, Err(e));
                self.idle();
            }
        }
    }

    /// Starts the keepalive clock of an idle run (see the module doc).
    fn idle(&mut self) {
        if !self.d.expire_idle_runs || self.lane.agent_slot().busy() {
            return;
        }
        if let Some(state) = self.lane.state_mut()
            && state.expires_at_ms.is_none()
        {
            state.expires_at_ms = Some(now_ms() + state.keepalive_ttl_seconds * 1000);
            self.lane.persist();
        }
    }

    /// Keepalive expired: the agent is closed and the instance removed
    /// (reported `missing`), but the run is **kept**: its record and its
    /// last `init` stay, so a later `prompt_send` without `init` (all the
    /// backend sends for a run it still holds open) makes a new instance
    /// over the same workspace and home, starts the agent and resumes the
    /// session. Only `remove` (and `prune_orphans`/`gc`) forget a run.
    async fn expire(&mut self) {
        let Some(state) = self.lane.state() else { return };
        let name = state.instance_name.clone();
        tracing::info!(
            "run {}: keepalive expired, removing instance {name} (the run is kept)",
            self.lane.run_id()
        );
        self.lane.close_agent("keepalive_expired").await;
        match self.d.provider().remove(&name).await {
            Ok(info) => {
                // The instance's scratch and staged secrets go with it.
                self.d.mounts().discard(self.lane.run_id());
                self.d.report().status(self.lane.run_id(), &info);
                if let Some(state) = self.lane.state_mut() {
                    state.expires_at_ms = None;
                    state.instance_removed = true;
                    state.updated_at = super::now_iso();
                }
                self.lane.persist();
            }
            Err(e) => {
                let e = e.to_string();
                tracing::error!(
                    "run {}: removing expired instance {name}: {e}; retrying in 60 s",
                    self.lane.run_id()
                );
                self.d.report().error_status(self.lane.run_id(), &name, &e);
                if let Some(state) = self.lane.state_mut() {
                    state.expires_at_ms = Some(now_ms() + 60_000);
                }
            }
        }
    }

    async fn adopt(&mut self, state: RunState) {
        let name = state.instance_name.clone();
        let removed = state.instance_removed;
        self.lane.set_state(state);
        match self.d.provider().inspect(&name).await {
            // Removed at its expiry, and reported then: not again.
            Ok(info) if removed && info.status == crate::provider::InstanceStatus::Missing => {
                tracing::info!(
                    "run {}: re-adopted; its instance {name} was removed at keepalive expiry",
                    self.lane.run_id()
                );
            }
            Ok(info) => {
                tracing::info!(
                    "run {}: re-adopted instance {name} ({})",
                    self.lane.run_id(),
                    info.status.as_str()
                );
                self.d.report().status(self.lane.run_id(), &info);
            }
            Err(e) => tracing::warn!("run {}: inspecting {name}: {e}", self.lane.run_id()),
        }
        self.idle();
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Why a run state file is left as it is (logged).
#[derive(Debug, thiserror::Error)]
enum StateFileError {
    #[error("{0}")]
    Read(#[source] std::io::Error),
    #[error("{0}")]
    Parse(#[source] serde_json::Error),
    #[error("version {0} is not supported")]
    Version(u32),
    #[error("run_id {0:?} does not match the file name")]
    RunId(String),
}

/// Loads every persisted run and hands it to its lane.
pub async fn adopt_persisted(d: &Arc<RunContext>) {
    let entries = match std::fs::read_dir(d.records.dir()) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::error!("reading {}: {e}", d.records.dir().display());
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
            .map_err(StateFileError::Read)
            .and_then(|b| serde_json::from_slice::<RunState>(&b).map_err(StateFileError::Parse))
            .and_then(|s| {
                if s.version != STATE_VERSION {
                    Err(StateFileError::Version(s.version))
                } else if s.run_id != stem || names::validate_run_id(&s.run_id).is_err() {
                    Err(StateFileError::RunId(s.run_id))
                } else {
                    Ok(s)
                }
            });
        match loaded {
            Ok(state) => {
                if let Some(env) = state.init.as_ref().and_then(|i| i.get("env")).and_then(Value::as_object) {
                    d.report()
                        .add_secrets(env.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v))));
                }
                let key = state.run_id.clone();
                send(&d.runs, &key, Job::Adopt(Box::new(state)));
            }
            Err(e) => tracing::error!("{}: {e}; left as it is", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn run_ids() {
        assert_eq!(valid_run_id(&json!(" r1 ")).unwrap(), "r1");
        for bad in [json!("../x"), json!(""), json!(3), json!(null), json!("a:b"), json!("a\\b")] {
            assert!(valid_run_id(&bad).is_err(), "{bad} accepted");
        }
    }

    /// A daemon core (real native provider, whose launcher does not exist:
    /// instances are recorded, no process starts) on a current-thread
    /// runtime that only runs when the test polls it.
    fn parked_daemon(dir: &std::path::Path) -> (tokio::runtime::Runtime, super::super::Daemon) {
        parked_daemon_with(dir, "")
    }

    /// As [`parked_daemon`], with `top` added to the config's top-level keys.
    fn parked_daemon_with(
        dir: &std::path::Path,
        top: &str,
    ) -> (tokio::runtime::Runtime, super::super::Daemon) {
        let text = format!(
            "orchestrator_url = \"ws://127.0.0.1:1/ws/agent\"\nstate_dir = \"{0}/state\"\n{top}\
             [sandbox]\nworkspaceHostRoot = \"{0}/root\"\ngitPush = false\n",
            dir.display()
        );
        std::fs::create_dir_all(dir.join("root")).unwrap();
        let table: toml::Table = toml::from_str(&text).unwrap();
        let cfg = super::super::config::Config::from_table("t.toml", table, &Default::default()).unwrap().0;
        let provider = crate::provider::native::NativeProvider::new(
            &cfg.state_dir,
            dir.join("no-launcher"),
            "tuixiu-run-",
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let d = {
            let _in = rt.enter();
            super::super::Daemon::with_provider(
                cfg,
                "t".into(),
                crate::provider::AnyProvider::Native(provider),
            )
        };
        (rt, d)
    }

    fn control(d: &super::super::Daemon, action: &str, run: &str, id: &str) {
        let msg = json!({"type": "sandbox_control", "action": action, "run_id": run,
            "instance_name": format!("tuixiu-run-{run}"), "request_id": id});
        d.dispatch(Incoming::decode(&msg.to_string()).unwrap());
    }

    /// The control results queued so far (taken out of the outbox), without
    /// running the runs' loop.
    fn results_now(d: &super::super::Daemon) -> Vec<Value> {
        use futures_util::FutureExt;
        let mut out = Vec::new();
        while let Some(batch) = d.outbox().peek_batch(1000, 1 << 20, Some(1 << 20)).now_or_never() {
            d.outbox().pop_sent(&batch);
            out.extend(
                batch
                    .texts()
                    .iter()
                    .map(|t| serde_json::from_str::<Value>(t.as_str()).unwrap())
                    .filter(|m| m["type"] == "sandbox_control_result"),
            );
        }
        out
    }

    /// Runs the runs' loop until `n` more control results are queued.
    fn results_after_loop(rt: &tokio::runtime::Runtime, d: &super::super::Daemon, n: usize) -> Vec<Value> {
        let mut got = Vec::new();
        rt.block_on(async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
            while got.len() < n && tokio::time::Instant::now() < deadline {
                got.extend(results_now(d));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        assert_eq!(got.len(), n, "results: {got:?}");
        got
    }

    #[test]
    fn inspect_is_answered_without_the_runs_loop_and_never_overtakes_its_run() {
        let dir = tempfile::tempdir().unwrap();
        let (rt, d) = parked_daemon(dir.path());
        for run in ["r1", "r2"] {
            control(&d, "ensure_running", run, &format!("ensure-{run}"));
        }
        let ensured = results_after_loop(&rt, &d, 2);
        assert!(ensured.iter().all(|r| r["ok"] == true), "{ensured:?}");

        // From here the runs' loop is not run: as if it were busy. A stop
        // of r1 waits in r1's lane; an inspect of r2 (nothing pending) is
        // answered at once, one of r1 is not (it would overtake the stop).
        control(&d, "stop", "r1", "stop-r1");
        control(&d, "inspect", "r1", "inspect-r1");
        control(&d, "inspect", "r2", "inspect-r2");
        let now = results_now(&d);
        assert_eq!(now.len(), 1, "{now:?}");
        assert_eq!(now[0]["request_id"], "inspect-r2");
        assert_eq!(now[0]["ok"], true, "{now:?}");
        assert_eq!(now[0]["status"], ensured[1]["status"], "{now:?}");

        // The loop runs: r1's controls come out in their order, the
        // inspect seeing what the stop did.
        let r1 = results_after_loop(&rt, &d, 2);
        let ids: Vec<_> = r1.iter().map(|r| r["request_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["stop-r1", "inspect-r1"], "{r1:?}");
        assert_eq!(r1[1]["status"], r1[0]["status"], "{r1:?}");
        assert_ne!(r1[1]["status"], ensured[0]["status"], "{r1:?}");

        // Idle again: r1's inspect is answered without the loop, and two
        // in a row keep their order.
        control(&d, "inspect", "r1", "again-1");
        control(&d, "inspect", "r1", "again-2");
        let now = results_now(&d);
        let ids: Vec<_> = now.iter().map(|r| r["request_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["again-1", "again-2"], "{now:?}");
        assert!(now.iter().all(|r| r["status"] == r1[0]["status"]), "{now:?}");
    }

    /// The config the daemon keeps (and the link reads) holds no secret:
    /// each went to the one part that signs or authenticates with it.
    #[test]
    fn the_kept_config_holds_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let secrets = "auth_token = \"tok-1\"\ncontrol_signing_secret = \"sig-2\"\n\
                       register_hmac_secret = \"reg-3\"\n";
        let (_rt, d) = parked_daemon_with(dir.path(), secrets);
        let cfg = d.cfg();
        assert!(cfg.auth_token.is_none() && cfg.bootstrap_token.is_none());
        assert!(cfg.control_signing_secret.is_none() && cfg.register_hmac_secret.is_none());
        assert_eq!(cfg.secrets().count(), 0);
    }

    #[test]
    fn replies_say_what_the_node_proxy_says() {
        assert_eq!(RunError::Missing("session_id").to_string(), "session_id 为空");
        assert_eq!(RunError::NotOpen.to_string(), "run_not_open");
        assert_eq!(RunError::from(valid_run_id(&json!(null)).unwrap_err()).to_string(), "run_id is missing");
        assert_eq!(valid_run_id(&json!(3)).unwrap_err().to_string(), "run_id must be a string, got 3");
    }
}
