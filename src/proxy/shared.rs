//! What every part of a run's handling shares, below them all: the run's
//! persisted state ([`RunState`], from `run_state.rs`) and where it is
//! written ([`RunSlot`]), the run's agent as its lane holds it
//! ([`AgentSlot`]), the jobs of a lane ([`Job`]), the registry of lanes and
//! agents ([`Runs`]), queuing a job ([`send`]) and the replies the parts
//! send.
//!
//! The parts sit above this file: `instance.rs` (the run's instance),
//! `agent.rs` (the run's agent), then `lane.rs` (one run's lane, which
//! hands each of those two its slots), `control/` (`sandbox_control`) and
//! `runs.rs` on top (routing, the lane's loop, keepalive, re-adoption).
//! [`send`] makes a new lane's queue and hands it to `runs.rs` as a
//! [`NewLane`] over a channel, so this file needs nothing above it.

use std::collections::HashMap;
use std::fmt::Display;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::persist::Persister;
use super::protocol::{PromptResult, ProxyUpdate, RunMessage, RunReply, SandboxControl};
use super::report::Reporter;
pub use super::run_state::{RunState, STATE_VERSION};
use crate::acp::host::Agent;
use crate::provider::{ProviderError, names};

/// The lane of messages that concern no single run.
pub const GLOBAL: &str = "";

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
        done: oneshot::Sender<Result<(), ProviderError>>,
    },
    Adopt(Box<RunState>),
    /// The agent of `generation` exited.
    AgentExited {
        generation: u64,
    },
    /// A prompt turn ended.
    PromptDone,
}

/// A lane to start (by `runs.rs`): its key and its queue, which may
/// already hold jobs.
pub struct NewLane {
    pub key: String,
    pub jobs: mpsc::UnboundedReceiver<Job>,
}

/// Where runs live: the registry of lanes (and their pending work), of
/// live agents, the prompt turns in flight, and the event loop the lanes
/// and their tasks run on.
pub struct Runs {
    lanes: Mutex<HashMap<String, LaneTx>>,
    /// Where a new lane's queue goes to be served.
    new_lanes: mpsc::UnboundedSender<NewLane>,
    agents: Agents,
    /// Prompt turns whose `prompt_result` is not yet queued (all runs).
    turns: std::sync::atomic::AtomicUsize,
    /// The daemon is shutting down: no new agent starts.
    stopping: std::sync::atomic::AtomicBool,
    /// The event loop the runs live on (the link has a thread of its own,
    /// and routes messages from there).
    runtime: Option<tokio::runtime::Handle>,
}

impl Runs {
    /// No lane yet; a lane's queue goes out on the channel returned when
    /// its first job comes. Lanes run on the current runtime (if any: else
    /// wherever [`Runs::spawn`] is called from).
    pub fn new() -> (Runs, mpsc::UnboundedReceiver<NewLane>) {
        let (new_lanes, rx) = mpsc::unbounded_channel();
        let runs = Runs {
            lanes: Mutex::default(),
            new_lanes,
            agents: Agents::default(),
            turns: Default::default(),
            stopping: Default::default(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        };
        (runs, rx)
    }

    /// Starts `task` on the runs' event loop, from whichever thread.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match &self.runtime {
            Some(rt) => drop(rt.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
    }

    pub fn lanes(&self) -> std::sync::MutexGuard<'_, HashMap<String, LaneTx>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `read` at once if lane `key` has nothing pending (no job queued
    /// or being handled, no keepalive expiry under way), holding the lanes'
    /// lock meanwhile, so no job of that lane starts before `read` ends;
    /// `None` (and `read` not run) otherwise. A read answered here overtakes
    /// nothing of its run, and nothing of its run overtakes it
    /// (docs/architecture.md, "Threading"). `read` must be short: it holds
    /// back every `send`.
    pub fn when_idle<R>(&self, key: &str, read: impl FnOnce() -> R) -> Option<R> {
        let lanes = self.lanes();
        let idle = lanes.get(key).is_none_or(|l| l.pending == 0);
        idle.then(read)
    }

    /// Lane `key` starts work of its own (its keepalive expiry): pending
    /// until [`Runs::finished`].
    pub fn begin(&self, key: &str) {
        if let Some(l) = self.lanes().get_mut(key) {
            l.pending += 1;
        }
    }

    /// Lane `key` finished a job (or its own work).
    pub fn finished(&self, key: &str) {
        if let Some(l) = self.lanes().get_mut(key) {
            l.pending = l.pending.saturating_sub(1);
        }
    }

    /// How many lanes exist (runs with state, plus busy ones).
    pub fn len(&self) -> usize {
        self.lanes().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live agent of `run`.
    pub fn agent(&self, run: &str) -> Option<Arc<Agent>> {
        self.agents.get(run)
    }

    /// Every live agent.
    pub fn all_agents(&self) -> Vec<Arc<Agent>> {
        self.agents.all()
    }

    pub fn set_agent(&self, run: &str, agent: Option<Arc<Agent>>) {
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

/// The agents by run, for direct routing.
#[derive(Default)]
struct Agents {
    map: std::sync::Mutex<HashMap<String, Arc<Agent>>>,
}

impl Agents {
    fn get(&self, run: &str) -> Option<Arc<Agent>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).get(run).cloned().filter(|a| !a.has_exited())
    }

    fn all(&self) -> Vec<Arc<Agent>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    fn set(&self, run: &str, agent: Option<Arc<Agent>>) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match agent {
            Some(a) => m.insert(run.to_string(), a),
            None => m.remove(run),
        };
    }
}

/// Queues `job` on the lane of `key`, creating the lane if needed.
pub fn send(runs: &Runs, key: &str, job: Job) {
    let mut lanes = runs.lanes();
    if let Some(lane) = lanes.get_mut(key) {
        match lane.tx.send(job) {
            Ok(()) => {
                lane.pending += 1;
                return;
            }
            // The lane ended between our lookup and the send: start a new one.
            Err(mpsc::error::SendError(j)) => return start_lane(runs, &mut lanes, key, j),
        }
    }
    start_lane(runs, &mut lanes, key, job);
}

/// A lane's queue, and how many of its jobs are queued or being handled
/// (plus its own work under way: [`Runs::begin`]).
pub struct LaneTx {
    tx: mpsc::UnboundedSender<Job>,
    pending: usize,
}

fn start_lane(runs: &Runs, lanes: &mut HashMap<String, LaneTx>, key: &str, job: Job) {
    let (tx, jobs) = mpsc::unbounded_channel();
    tx.send(job).ok();
    lanes.insert(key.to_string(), LaneTx { tx, pending: 1 });
    // Err: nothing serves lanes any more (the daemon is going away).
    let _ = runs.new_lanes.send(NewLane { key: key.to_string(), jobs });
}

/// Why a run id is refused.
#[derive(Debug, thiserror::Error)]
pub enum RunIdError {
    #[error("run_id is missing")]
    Missing,
    #[error("run_id must be a string, got {0}")]
    NotString(Value),
    #[error(transparent)]
    Invalid(#[from] names::NameError),
}

/// A run id as the backend must send it: a non-empty string of at most
/// 200 characters without `/`, `\`, `:`, whitespace or control characters.
pub fn valid_run_id(v: &Value) -> Result<String, RunIdError> {
    let Some(s) = v.as_str() else {
        return Err(if v.is_null() { RunIdError::Missing } else { RunIdError::NotString(v.clone()) });
    };
    let s = s.trim();
    names::validate_run_id(s)?;
    Ok(s.to_string())
}

/// Answers a `prompt_send` that failed (a successful one is answered by
/// its turn).
pub fn reply_prompt(report: &Reporter, m: &RunMessage, result: Result<(), impl Display>) {
    if let Err(e) = result {
        let e = report.redact(&e.to_string());
        if let Some(id) = m.run_id.as_str() {
            report.push(&ProxyUpdate::error(id, &e));
        }
        report.push(&PromptResult::failed(&m.run_id, &m.prompt_id, e));
    }
}

/// Answers a session control.
pub fn reply_session(report: &Reporter, m: &RunMessage, result: Result<(), impl Display>) {
    let result = result.map_err(|e| report.redact(&e.to_string()));
    report.push(&RunReply::session_control(&m.run_id, &m.control_id, result));
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Where run states are written: `<state>/runs/<run_id>.json`, by the
/// daemon's one writer.
#[derive(Clone)]
pub struct Records {
    persister: Persister,
    dir: PathBuf,
}

impl Records {
    pub fn new(persister: Persister, dir: PathBuf) -> Records {
        Records { persister, dir }
    }

    /// `<state>/runs`.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Everything handed to the writer is on disk (at shutdown).
    pub fn flush(&self) {
        self.persister.flush()
    }
}

/// One run as its lane holds it: its id and its state, and where that
/// state is written. `state` is `None` for a run the daemon does not hold
/// (e.g. an `inspect` of an unknown run) and for the global lane.
pub struct RunSlot {
    run_id: String,
    state: Option<RunState>,
    records: Records,
}

impl RunSlot {
    /// Run `run_id`, holding nothing yet.
    pub fn new(run_id: String, records: Records) -> RunSlot {
        RunSlot { run_id, state: None, records }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The run's state: `None` for a run the daemon does not hold.
    pub fn state(&self) -> Option<&RunState> {
        self.state.as_ref()
    }

    pub fn state_mut(&mut self) -> Option<&mut RunState> {
        self.state.as_mut()
    }

    /// The slot holds `state` from now on (a re-adopted run).
    pub fn set_state(&mut self, state: RunState) {
        self.state = Some(state);
    }

    /// The run's state, made by `new` when the slot holds none.
    pub fn state_or_insert_with(&mut self, new: impl FnOnce() -> RunState) -> &mut RunState {
        self.state.get_or_insert_with(new)
    }

    fn state_path(&self) -> PathBuf {
        self.records.dir.join(format!("{}.json", self.run_id))
    }

    /// Writes the run state (atomically, 0600) off the daemon's thread
    /// (`persist.rs`); failures are logged and reported, never fatal to
    /// the message at hand.
    pub fn persist(&mut self) {
        let Some(state) = &self.state else { return };
        let bytes = serde_json::to_vec_pretty(state).expect("plain data");
        self.records.persister.write(&self.run_id, self.state_path(), Some(bytes));
    }

    /// Told once the state last given to [`RunSlot::persist`] is on disk.
    /// `None`: the run has no state.
    pub fn persisted(&self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        self.state.as_ref()?;
        Some(self.records.persister.on_disk(&self.state_path()))
    }

    /// Drops the run's state, in memory and on disk.
    pub fn forget(&mut self) {
        self.state = None;
        self.records.persister.write(&self.run_id, self.state_path(), None);
    }
}

/// The run's agent as its lane holds it: the process and ACP connection,
/// which process it is (exit notices of older ones are ignored), and the
/// prompt turns in flight (the run is not idle while any is).
#[derive(Default)]
pub struct AgentSlot {
    agent: Option<Arc<Agent>>,
    generation: u64,
    prompts: usize,
}

impl AgentSlot {
    /// The agent, unless it has exited.
    pub fn live(&self) -> Option<Arc<Agent>> {
        self.agent.clone().filter(|a| !a.has_exited())
    }

    /// The number of the agent process about to start.
    pub fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    pub fn set(&mut self, agent: Arc<Agent>) {
        self.agent = Some(agent);
    }

    pub fn take(&mut self) -> Option<Arc<Agent>> {
        self.agent.take()
    }

    pub fn clear(&mut self) {
        self.agent = None;
    }

    /// The agent process `generation` exited: true (and the agent
    /// forgotten) when it is the current one.
    pub fn exited(&mut self, generation: u64) -> bool {
        if generation == self.generation && self.agent.is_some() {
            self.agent = None;
            true
        } else {
            false
        }
    }

    pub fn prompt_started(&mut self) {
        self.prompts += 1;
    }

    pub fn prompt_done(&mut self) {
        self.prompts = self.prompts.saturating_sub(1);
    }

    /// Prompt turns are in flight.
    pub fn busy(&self) -> bool {
        self.prompts > 0
    }
}

/// `init.env` as strings (non-strings stringified, null → "").
pub fn init_env(init: Option<&Value>) -> HashMap<String, String> {
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
