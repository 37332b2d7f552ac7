//! What the ACP host needs from whoever runs it, and owns: its settings and
//! the sink for what it reports. The daemon (`proxy::`) implements the
//! sink and owns the runs; nothing here knows of the daemon.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

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

/// Where the host's reports go (the backend, through the daemon's outbox).
/// Never blocks, except [`Sink::wait_for_room`].
pub trait Sink: Send + Sync {
    /// A `proxy_update` of a run with this content (agent stderr,
    /// transport events, permission requests).
    fn update(&self, run_id: &str, content: Value);
    /// The agent of a run ended (`transport_disconnected`; `acp_exit` too
    /// unless the host closed it itself).
    fn agent_exited(
        &self,
        run_id: &str,
        instance: &str,
        code: Option<i32>,
        signal: Option<&str>,
        report_exit: bool,
    );
    /// The agent of a run is connected (`transport_connected`).
    fn agent_connected(&self, run_id: &str, instance: &str);
    /// A message of the host (`acp_update` of a session it made).
    fn message(&self, msg: &Value);
    /// A message the host serialized itself (the relay, which copies the
    /// agent's JSON text as it is): one JSON object of type `kind`.
    fn message_text(&self, text: String, kind: &'static str, run_id: &Arc<str>);
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
