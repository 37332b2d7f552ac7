//! What the daemon tells the backend, as every part of it needs it: the
//! outbox, with every known secret scrubbed out of free text, and the
//! `sandbox_instance_status` reports.
//!
//! The link drains the outbox; lanes, agents (through `acp_sink.rs`) and
//! the run-state writer (`persist.rs`) only fill it. None of them needs
//! the rest of the daemon for that, so this is all they are given.

use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;

use super::metrics::Metrics;
use super::outbox::Outbox;
use super::protocol;
use crate::env::Redactor;
use crate::provider::{InstanceInfo, InstanceStatus, ProviderKind};

pub struct Reporter {
    outbox: Outbox,
    /// Every secret seen (config tokens, secret init.env values), for
    /// scrubbing text that leaves the daemon.
    redactor: Mutex<Redactor>,
    /// The provider named in status reports.
    provider: ProviderKind,
    runtime: Option<String>,
    /// Set when the daemon serves metrics (`--metrics-listen`).
    metrics: OnceLock<Arc<Metrics>>,
}

impl Reporter {
    pub fn new(
        outbox: Outbox,
        redactor: Redactor,
        provider: ProviderKind,
        runtime: Option<String>,
    ) -> Reporter {
        Reporter { outbox, redactor: Mutex::new(redactor), provider, runtime, metrics: OnceLock::new() }
    }

    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Queues `msg` for the backend.
    pub fn push<T: Serialize + ?Sized>(&self, msg: &T) {
        match self.metrics() {
            None => self.outbox.push(msg),
            Some(metrics) => self.push_counted(metrics, serde_json::to_string(msg)),
        }
    }

    /// Serialized once: the metrics read the text, the outbox takes it as
    /// is. Out of line and cold, so the usual path (no metrics) stays as
    /// small as it was.
    #[cold]
    #[inline(never)]
    fn push_counted(&self, metrics: &Metrics, text: serde_json::Result<String>) {
        match text.map(serde_json::value::RawValue::from_string) {
            Ok(Ok(raw)) => {
                metrics.sent(raw.get());
                self.outbox.push(&raw);
            }
            Ok(Err(e)) | Err(e) => tracing::error!("outbox: a message could not be serialized: {e}"),
        }
    }

    /// The metrics, when the daemon serves them.
    pub fn metrics(&self) -> Option<&Metrics> {
        self.metrics.get().map(Arc::as_ref)
    }

    /// From now on, what is queued feeds `metrics` too.
    pub fn set_metrics(&self, metrics: Arc<Metrics>) {
        let _ = self.metrics.set(metrics);
    }

    /// `text` with every known secret replaced by `[REDACTED]`.
    pub fn redact(&self, text: &str) -> String {
        self.lock().redact(text).into_owned()
    }

    /// The redactor as it is now, for a process that scrubs its own output
    /// (an agent's stderr).
    pub fn redactor(&self) -> Redactor {
        self.lock().clone()
    }

    /// Adds the values of `env` whose keys name secrets.
    pub fn add_secrets<'a>(&self, env: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut r = self.lock();
        for (k, v) in env {
            if crate::env::SECRET_KEYS.contains(&k) {
                r.add(v);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Redactor> {
        self.redactor.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The provider's name on the wire (`native`, `docker`, `host`).
    pub fn wire_provider(&self) -> &'static str {
        self.provider.wire_name()
    }

    /// Queues `proxy_update sandbox_instance_status` for `run_id`.
    pub fn status(&self, run_id: &str, info: &InstanceInfo) {
        let content = protocol::InstanceStatus::new(
            info.name.clone(),
            self.wire_provider(),
            self.runtime.clone(),
            info.status.as_str(),
            info.last_error.as_deref().map(|e| self.redact(e)),
            super::now_iso(),
        );
        self.push(&protocol::ProxyUpdate::new(run_id, protocol::Content::InstanceStatus(content)));
    }

    /// Queues `sandbox_instance_status {status:"error", last_error}`.
    pub fn error_status(&self, run_id: &str, instance_name: &str, error: &str) {
        let mut info = InstanceInfo::missing(self.provider, instance_name);
        info.status = InstanceStatus::Error;
        info.last_error = Some(error.to_string());
        self.status(run_id, &info);
    }
}

/// The native provider's egress refusals as `[proxy:network] denied …`
/// events of their runs. Made before the reporter exists (the provider
/// comes first), attached to it once it does; nothing is lost in between,
/// since no sandbox runs before the daemon does.
#[derive(Default)]
pub struct NetworkEvents {
    report: std::sync::OnceLock<std::sync::Arc<Reporter>>,
}

impl NetworkEvents {
    pub fn attach(&self, report: std::sync::Arc<Reporter>) {
        let _ = self.report.set(report);
    }
}

impl crate::provider::native::EgressReports for NetworkEvents {
    fn denied(&self, run_id: &str, instance: &str, denial: &crate::egress::Denial) {
        tracing::info!("run {run_id} ({instance}): egress proxy: {denial}");
        if let Some(report) = self.report.get() {
            let text = report.redact(&denial.to_string());
            report.push(&protocol::ProxyUpdate::network(run_id, &text));
            if let Some(metrics) = report.metrics() {
                metrics.egress_denied(denial.via);
            }
        }
    }
}
