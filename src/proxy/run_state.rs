//! What is persisted of a run (`<state>/runs/<run>.json`, 0600): below
//! the lane and every part of it, which read and update it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const STATE_VERSION: u32 = 1;

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
    /// The daemon removed the run's instance at keepalive expiry and
    /// reported it `missing`; a restart finds it missing and does not
    /// report it again. Cleared when the instance is made again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub instance_removed: bool,
    /// What landed of the agentInputs, per item (`inputs/landed.rs`):
    /// landing again never overwrites the agent's work.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub landed: crate::inputs::landed::Landed,
}

fn default_id() -> u32 {
    1000
}
