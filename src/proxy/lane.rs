//! One run's lane: the run as it holds it ([`RunSlot`], [`AgentSlot`]) and
//! the two parts that act on it ([`LaneParts`]): the instance part
//! (`instance.rs`) and the agent part (`agent.rs`). Each part is given
//! only what it uses when the daemon starts, and the run it acts on with
//! each call; neither sees the other, nor the controls' signer, nor the
//! link's secrets. The lane's loop, which orders a run's jobs, is
//! `runs.rs`; `control/` acts on a lane through the operations here.

use std::sync::Arc;

use serde_json::Value;

use super::agent::{AgentError, AgentPart};
use super::instance::{InstanceError, InstancePart};
use super::protocol::RunMessage;
use super::shared::{AgentSlot, Records, RunSlot, RunState};
use crate::acp::port::Context;
use crate::provider::{InstanceInfo, ProviderError};

/// The parts every lane shares: made once, from the daemon's services and
/// its config.
pub struct LaneParts {
    instances: InstancePart,
    agents: AgentPart,
    /// Where each lane's run state is written.
    records: Records,
}

impl LaneParts {
    pub fn new(instances: InstancePart, agents: AgentPart, records: Records) -> LaneParts {
        LaneParts { instances, agents, records }
    }

    /// Session controls, `session_permission` and `acp_message` for a live
    /// agent, which reach it without its lane: `true` when handled.
    pub fn direct(&self, run_id: &str, kind: &str, msg: &RunMessage) -> bool {
        self.agents.direct(run_id, kind, msg)
    }

    /// What an agent's ACP host gets (`acp_sink.rs`).
    pub fn acp_context(&self) -> Context {
        self.agents.acp_context()
    }
}

/// One run's lane. Its run's state is `None` for a run the daemon does not
/// hold (e.g. an `inspect` of an unknown run) and for the global lane.
pub struct Lane {
    parts: Arc<LaneParts>,
    run: RunSlot,
    agent: AgentSlot,
}

impl Lane {
    /// A lane of `run_id` that holds nothing yet.
    pub fn new(parts: Arc<LaneParts>, run_id: String) -> Lane {
        let run = RunSlot::new(run_id, parts.records.clone());
        Lane { parts, run, agent: AgentSlot::default() }
    }

    pub fn run_id(&self) -> &str {
        self.run.run_id()
    }

    /// The run's state: `None` for a run the daemon does not hold.
    pub fn state(&self) -> Option<&RunState> {
        self.run.state()
    }

    pub fn state_mut(&mut self) -> Option<&mut RunState> {
        self.run.state_mut()
    }

    /// The lane holds `state` from now on (a re-adopted run).
    pub fn set_state(&mut self, state: RunState) {
        self.run.set_state(state);
    }

    /// Writes the run state ([`RunSlot::persist`]).
    pub fn persist(&mut self) {
        self.run.persist();
    }

    /// Told once the state last given to [`Lane::persist`] is on disk.
    pub fn persisted(&self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        self.run.persisted()
    }

    /// `ensureRuntime` ([`InstancePart::prepare`]).
    pub async fn prepare(
        &mut self,
        instance_name: &Value,
        ttl: &Value,
        init: &Value,
    ) -> Result<(), InstanceError> {
        self.parts.instances.prepare(&mut self.run, instance_name, ttl, init).await
    }

    /// Removes instance `name`; if it is this run's, the run is forgotten.
    pub async fn remove_instance(&mut self, name: &str) -> Result<InstanceInfo, ProviderError> {
        self.parts.instances.remove(&mut self.run, name).await
    }

    /// Starts (or reuses) the run's agent ([`AgentPart::open`]).
    pub async fn open_agent(&mut self, cwd: &Value) -> Result<(), AgentError> {
        self.parts.agents.open(&mut self.run, &mut self.agent, cwd).await
    }

    /// Closes the agent (acp_close, stop, remove, keepalive expiry).
    pub async fn close_agent(&mut self, reason: &str) {
        self.parts.agents.close(self.run.run_id(), &mut self.agent, reason).await
    }

    /// `prompt_send` after the open: the turn runs on its own task.
    pub fn start_prompt(&mut self, m: RunMessage) {
        self.parts.agents.start_prompt(self.run.run_id(), &mut self.agent, m)
    }

    pub fn agent_slot(&self) -> &AgentSlot {
        &self.agent
    }

    pub fn agent_slot_mut(&mut self) -> &mut AgentSlot {
        &mut self.agent
    }
}
