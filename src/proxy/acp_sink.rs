//! The daemon's side of the ACP host's interface (`acp::port`): the
//! settings from the config, and the [`Reporter`] as the sink, putting an
//! agent's reports into the outbox as wire messages.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::lane::RunContext;
use super::now_iso;
use super::protocol::proxy_update;
use super::report::Reporter;
use crate::acp::port::{Context, Settings, Sink};
use crate::acp::transport::BoxFuture;

impl RunContext {
    /// What an agent of a run gets: the settings and the reporter as the
    /// sink.
    pub fn acp_context(&self) -> Context {
        let cfg = self.cfg();
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
        Context { settings: Arc::new(settings), sink: self.report().clone(), pool: self.pool().clone() }
    }
}

impl Sink for Reporter {
    fn update(&self, run_id: &str, content: Value) {
        self.push(&proxy_update(run_id, content));
    }

    fn agent_exited(
        &self,
        run: &str,
        instance: &str,
        code: Option<i32>,
        signal: Option<&str>,
        report_exit: bool,
    ) {
        if let Some(m) = self.metrics() {
            m.agent_exited(code, signal, !report_exit);
        }
        self.push(&proxy_update(
            run,
            json!({"type": "transport_disconnected", "instance_name": instance,
            "code": code, "signal": signal, "at": now_iso(), "reason": "agent_exit"}),
        ));
        if report_exit {
            self.push(&json!({"type": "acp_exit", "run_id": run, "instance_name": instance,
                "code": code, "signal": signal}));
        }
    }

    fn agent_connected(&self, run_id: &str, instance: &str) {
        if let Some(m) = self.metrics() {
            m.agent_started();
        }
        self.push(&proxy_update(
            run_id,
            json!({"type": "transport_connected", "instance_name": instance, "at": now_iso()}),
        ));
    }

    fn message(&self, msg: &Value) {
        self.push(msg);
    }

    fn message_text(&self, text: String, kind: &'static str, run_id: &Arc<str>) {
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
