//! The daemon's side of the ACP host's interface (`acp::port`): the
//! settings from the config, and the [`Reporter`] as the sink, putting an
//! agent's reports into the outbox as wire messages.

use std::sync::Arc;
use std::time::Duration;

use super::config::Config;
use super::now_iso;
use super::protocol::{AcpExit, AcpMessage, AcpUpdate, Content, ProxyUpdate, acp_update_text};
use super::report::Reporter;
use crate::acp::port::{Context, Event, Relay, Settings, Sink};
use crate::acp::transport::BoxFuture;

/// What every agent of a run gets, made once: the settings from `cfg`,
/// the reporter as the sink, the blocking pool.
pub fn context(cfg: &Config, report: Arc<Reporter>, pool: Arc<crate::blocking::Pool>) -> Context {
    let settings = Settings {
        permission_policy: cfg.permission_policy,
        permission_timeout: Duration::from_secs(cfg.permission_timeout_seconds),
        request_timeout: Duration::from_secs(cfg.acp_request_timeout_seconds),
        shutdown_grace: Duration::from_secs(cfg.agent_shutdown_grace_seconds),
        fs_read_max_bytes: cfg.fs_read_max_bytes,
        run_max_terminals: cfg.run_max_terminals,
        run_max_processes: cfg.run_max_processes,
        run_terminal_memory_bytes: cfg.run_terminal_memory_bytes,
        terminal_spill_dir: cfg.state_dir.join("terminals"),
        terminal_enabled: cfg.sandbox.terminal_enabled,
    };
    Context { settings: Arc::new(settings), sink: report, pool }
}

impl Sink for Reporter {
    fn event(&self, run_id: &str, event: Event<'_>) {
        let content = match event {
            Event::Stderr(text) => Content::text(format!("[agent:stderr] {text}")),
            Event::Connected { instance } => {
                if let Some(m) = self.metrics() {
                    m.agent_started();
                }
                Content::transport_connected(instance, now_iso())
            }
            Event::Exited { instance, code, signal, report_exit } => {
                if let Some(m) = self.metrics() {
                    m.agent_exited(code, signal, !report_exit);
                }
                self.push(&ProxyUpdate::new(
                    run_id,
                    Content::agent_exited(instance, code, signal, now_iso()),
                ));
                if report_exit {
                    self.push(&AcpExit::new(run_id, instance, code, signal));
                }
                return;
            }
            Event::Permission(ask) => {
                self.push(&ProxyUpdate::new(run_id, Content::permission_request(&ask)));
                return;
            }
            Event::SessionUpdate { prompt_id, session_id, update } => {
                self.push(&AcpUpdate::new(run_id, &prompt_id, session_id, &update));
                return;
            }
        };
        self.push(&ProxyUpdate::new(run_id, content));
    }

    fn relay(&self, run_id: &Arc<str>, relay: Relay<'_>) {
        let (text, kind) = match relay {
            Relay::Update { prompt_id, session_id, update } => {
                (acp_update_text(run_id, prompt_id, session_id, update), "acp_update")
            }
            Relay::Notification { method, params } => {
                match serde_json::to_string(&AcpMessage::notification(run_id, method, params)) {
                    Ok(text) => (text, "acp_message"),
                    Err(e) => return tracing::error!("run {run_id}: {method} could not be relayed: {e}"),
                }
            }
        };
        if let Some(m) = self.metrics() {
            m.relayed(kind);
        }
        self.outbox().push_text(text, kind, run_id);
    }

    fn is_backed_up(&self) -> bool {
        self.outbox().is_backed_up()
    }

    fn wait_for_room(self: Arc<Self>) -> BoxFuture<()> {
        Box::pin(async move { self.outbox().wait_for_room().await })
    }

    fn redact(&self, text: &str) -> String {
        Reporter::redact(self, text)
    }
}
