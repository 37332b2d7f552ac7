//! What the ACP host needs from whoever runs it, and owns: its settings and
//! the sink for what it reports. The daemon (`proxy::`) implements the
//! sink and owns the runs; nothing here knows of the daemon.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use serde_json::value::RawValue;

use super::transport::BoxFuture;

/// `permission_policy`: how `session/request_permission` is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PermissionPolicy {
    /// The `allow_once` option, else the first allow option.
    AllowOnce,
    /// Forward to the backend (`permission_request`) and wait.
    Ask,
    /// The first reject option, else cancelled.
    Deny,
}

impl PermissionPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionPolicy::AllowOnce => "allow_once",
            PermissionPolicy::Ask => "ask",
            PermissionPolicy::Deny => "deny",
        }
    }
}

/// The host's settings (the daemon's configuration, the part it needs).
#[derive(Clone, Debug)]
pub struct Settings {
    pub permission_policy: PermissionPolicy,
    /// How long `ask` waits for the backend's answer (then: cancelled).
    pub permission_timeout: Duration,
    /// Timeout of the host's own requests to the agent (not prompts).
    pub request_timeout: Duration,
    /// Between closing the agent's stdin and SIGTERM, and SIGTERM and SIGKILL.
    pub shutdown_grace: Duration,
    /// Largest file `fs/read_text_file` returns whole.
    pub fs_read_max_bytes: u64,
    /// Terminals one run may hold at once.
    pub run_max_terminals: usize,
    /// Processes one run's sandbox may hold (counted by the host).
    pub run_max_processes: usize,
    /// Memory one run's terminals keep output in (`acp::output::Budget`).
    pub run_terminal_memory_bytes: usize,
    /// Where output beyond that goes, as anonymous files.
    pub terminal_spill_dir: std::path::PathBuf,
    /// `terminal/*` offered at all.
    pub terminal_enabled: bool,
}

/// What the host reports about a run's agent. The sink turns each into
/// the backend's wire messages; nothing in `acp/` writes those.
#[derive(Debug)]
pub enum Event<'a> {
    /// A line the agent wrote on stderr, secrets already scrubbed.
    Stderr(&'a str),
    /// The agent is connected.
    Connected { instance: &'a str },
    /// The agent ended; `report_exit` unless the host closed it itself.
    Exited { instance: &'a str, code: Option<i32>, signal: Option<&'a str>, report_exit: bool },
    /// `session/request_permission` forwarded under the `ask` policy.
    Permission(PermissionAsk<'a>),
    /// An update of a session the host made itself (`session_created`,
    /// `config_option_update`).
    SessionUpdate { prompt_id: Value, session_id: &'a str, update: Value },
}

/// A permission request as the backend is asked it: the agent's
/// `toolCall` and `options` as it sent them (`null` and `[]` when absent).
#[derive(Debug)]
pub struct PermissionAsk<'a> {
    pub request_id: &'a str,
    pub session_id: &'a str,
    pub prompt_id: Value,
    pub tool_call: &'a Value,
    pub options: &'a Value,
}

/// What the agent sent that goes to the backend as the agent wrote it
/// (the relay copies JSON text; no tree is built).
#[derive(Debug)]
pub enum Relay<'a> {
    /// A `session/update`: its `sessionId` and `update` as JSON text
    /// (`null` when absent), and the prompt it belongs to.
    Update { prompt_id: Option<&'a str>, session_id: &'a str, update: &'a str },
    /// Any other notification, its params untouched.
    Notification { method: &'a str, params: Option<&'a RawValue> },
}

/// Where the host's reports go (the backend, through the daemon's outbox).
/// Never blocks, except [`Sink::wait_for_room`].
pub trait Sink: Send + Sync {
    /// Something happened to a run's agent.
    fn event(&self, run_id: &str, event: Event<'_>);
    /// Something the agent of a run sent, relayed as it is.
    fn relay(&self, run_id: &Arc<str>, relay: Relay<'_>);
    /// Whether [`Sink::wait_for_room`] would wait now.
    fn is_backed_up(&self) -> bool;
    /// Backpressure for the agent's stdout.
    fn wait_for_room(self: Arc<Self>) -> BoxFuture<()>;
    /// Secrets scrubbed from text the agent wrote.
    fn redact(&self, text: &str) -> String;
}

/// What each agent of a run gets: the settings, the sink, and the
/// blocking pool its filesystem work runs on.
#[derive(Clone)]
pub struct Context {
    pub settings: Arc<Settings>,
    pub sink: Arc<dyn Sink>,
    pub pool: Arc<crate::blocking::Pool>,
}
