//! The daemon's Prometheus metrics (`proxy --metrics-listen`): the
//! families, and the few points that feed them.
//!
//! Almost everything is read off the message streams, at the two places
//! every message passes: what the backend sends, as it is dispatched
//! ([`Metrics::received`], from `Daemon::dispatch`), and what the daemon
//! queues for it ([`Metrics::sent`] and [`Metrics::relayed`], from the
//! [`Reporter`](super::report::Reporter)). A request and its reply are
//! paired by their ids (`acp_open` → `acp_opened` by run, `prompt_send` →
//! `prompt_result` by prompt) in a bounded table, for the latencies; the
//! ids never become labels. Besides those: the link's state (`set_connected`),
//! the agents' start and exit (the ACP host's sink), the sandbox start
//! (`agent.rs`), and, at scrape time, gauges read from the lanes, the
//! outbox and the daemon's cgroup.
//!
//! Every label value is one of a fixed set (message types and control
//! actions the daemon knows, manifest apply kinds and error codes, `ok` or
//! `error`); anything else is counted as `other`. docs/proxy.md
//! ("Metrics") lists the families.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use serde::Deserialize;
use serde_json::Value;

use super::protocol::{CONTROL_ACTIONS, Incoming};
use crate::metrics::{gauge_value as gauge, raise_to};

type Label = [(&'static str, &'static str); 1];
type Labels2 = [(&'static str, &'static str); 2];
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Requests waiting for their reply, for the latencies: at most this many
/// of each kind (a reply that never comes must not grow the table).
const MAX_PENDING: usize = 4096;

/// Message types the backend sends.
const RECEIVED: &[&str] = &[
    "acp_open",
    "prompt_send",
    "acp_close",
    "session_cancel",
    "session_set_mode",
    "session_set_model",
    "session_set_config_option",
    "session_permission",
    "acp_message",
    "sandbox_control",
    "register_ack",
    "proxy_id_conflict",
];

/// Message types the daemon queues for the backend.
const SENT: &[&str] = &[
    "acp_opened",
    "acp_closed",
    "acp_exit",
    "acp_update",
    "acp_message",
    "prompt_result",
    "session_control_result",
    "permission_request",
    "proxy_update",
    "sandbox_control_result",
    "sandbox_inventory",
    "workspace_inventory",
];

/// agentInputs apply kinds.
const APPLY: &[&str] = &["bindMount", "copy", "downloadExtract", "writeFile", "checkout"];

/// `s` if it is one of `known`, as the static string; else `other`.
fn bounded(known: &[&'static str], s: &str) -> &'static str {
    known.iter().find(|k| **k == s).copied().unwrap_or("other")
}

fn result(ok: bool) -> &'static str {
    if ok { "ok" } else { "error" }
}

/// The code an `acp_open` failure starts with, when it is an agentInputs
/// one (`AGENT_INPUTS_DOWNLOAD_FAILED:item: ...`,
/// `INVALID_AGENT_INPUTS_ITEM_TARGET:...`): upper-case words; one that is
/// not among the manifest's and the inputs' codes counts as `other`.
fn input_code(error: &str) -> Option<&'static str> {
    let code = error.split(':').next()?;
    let looks = !code.is_empty()
        && code.len() <= 64
        && code.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if !looks {
        return None;
    }
    let known = crate::inputs::Code::ALL
        .iter()
        .map(|c| c.as_str())
        .chain(crate::manifest::Code::ALL.iter().map(|c| c.as_str()))
        .find(|k| *k == code);
    Some(known.unwrap_or("other"))
}

#[derive(Default)]
struct Pending {
    /// Run id → when `acp_open` came, and its items' apply kinds.
    opens: HashMap<String, (Instant, Vec<&'static str>)>,
    /// Prompt id → when `prompt_send` came.
    prompts: HashMap<String, Instant>,
}

/// The fields of a queued message the metrics read.
#[derive(Deserialize)]
struct Sent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    run_id: Value,
    #[serde(default)]
    prompt_id: Value,
    #[serde(default)]
    action: Value,
    ok: Option<bool>,
    #[serde(borrow)]
    error: Option<Cow<'a, str>>,
}

/// What the daemon's parts hold at scrape time (`Daemon::enable_metrics`
/// reads them).
pub struct Now {
    /// Lanes: runs with state, or busy.
    pub lanes: usize,
    /// Live agents.
    pub agents: usize,
    pub prompts_in_flight: usize,
    /// The outbox's messages and bytes queued, and messages dropped since the start.
    pub outbox: (usize, usize, u64),
    /// How the sandboxes' nested requests ended so far (native provider).
    pub nested: Option<sandbox::nested::NestedCounts>,
}

/// The cgroup files read at scrape time.
struct CgroupFiles {
    dir: PathBuf,
    memory: Gauge,
    pids: Gauge,
    cpu: Counter<f64, AtomicU64>,
}

/// The daemon's metrics: a registry and the handles the feeding points
/// use. Cheap to feed (atomic adds, a lock for the pending table); the
/// text is made only when scraped.
pub struct Metrics {
    registry: Registry,
    pending: Mutex<Pending>,
    link_up: Gauge,
    registrations: Counter,
    disconnects: Counter,
    received: Family<Label, Counter>,
    sent: Family<Label, Counter>,
    open_seconds: Histograms<Label>,
    sandbox_start_seconds: Histograms<Label>,
    prompt_seconds: Histograms<Label>,
    agents_started: Counter,
    agents_exited: Family<Label, Counter>,
    controls: Family<Labels2, Counter>,
    inputs_applied: Family<Label, Counter>,
    input_failures: Family<Label, Counter>,
    lanes: Gauge,
    agents: Gauge,
    prompts_in_flight: Gauge,
    outbox_messages: Gauge,
    outbox_bytes: Gauge,
    outbox_dropped: Counter,
    nested: Family<Label, Counter>,
    egress_denied: Family<Label, Counter>,
    cgroup: Option<CgroupFiles>,
}

fn open_histogram() -> Histogram {
    // 10 ms to 80 s: a sandbox, the inputs, init and the agent's initialize.
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

fn start_histogram() -> Histogram {
    // 1 ms to 8 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

fn prompt_histogram() -> Histogram {
    // 100 ms to about an hour.
    Histogram::new(exponential_buckets(0.1, 2.5, 12))
}

impl Metrics {
    /// Every family registered, in the order `/metrics` lists them: long,
    /// and meant to be read as the list of what the daemon exports.
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("tuixiu");
        crate::metrics::register_build_info(&mut r, "tuixiu-sandbox-proxy");
        let m = Metrics {
            registry: Registry::default(),
            pending: Mutex::default(),
            link_up: Gauge::default(),
            registrations: Counter::default(),
            disconnects: Counter::default(),
            received: Family::default(),
            sent: Family::default(),
            open_seconds: Family::new_with_constructor(open_histogram),
            sandbox_start_seconds: Family::new_with_constructor(start_histogram),
            prompt_seconds: Family::new_with_constructor(prompt_histogram),
            agents_started: Counter::default(),
            agents_exited: Family::default(),
            controls: Family::default(),
            inputs_applied: Family::default(),
            input_failures: Family::default(),
            lanes: Gauge::default(),
            agents: Gauge::default(),
            prompts_in_flight: Gauge::default(),
            outbox_messages: Gauge::default(),
            outbox_bytes: Gauge::default(),
            outbox_dropped: Counter::default(),
            nested: Family::default(),
            egress_denied: Family::default(),
            cgroup: cgroup_files(),
        };
        r.register("backend_connected", "1 while registered with the backend", m.link_up.clone());
        r.register(
            "backend_registrations",
            "Registrations with the backend (the first, then one per reconnect)",
            m.registrations.clone(),
        );
        r.register("backend_disconnects", "Registered links that went down", m.disconnects.clone());
        r.register("messages_received", "Messages from the backend, by type", m.received.clone());
        r.register(
            "messages_sent",
            "Messages queued for the backend, by type (acp_update: agent updates relayed)",
            m.sent.clone(),
        );
        r.register_with_unit(
            "acp_open",
            "From acp_open to acp_opened (instance, inputs, init, agent, initialize), by result",
            Unit::Seconds,
            m.open_seconds.clone(),
        );
        r.register_with_unit(
            "sandbox_start",
            "From the agent's start to its process running in its sandbox, by provider",
            Unit::Seconds,
            m.sandbox_start_seconds.clone(),
        );
        r.register_with_unit(
            "prompt",
            "From prompt_send to prompt_result, by result",
            Unit::Seconds,
            m.prompt_seconds.clone(),
        );
        r.register("agents_started", "Agents started and connected", m.agents_started.clone());
        r.register(
            "agents_exited",
            "Agents that exited, by reason (closed: by the daemon; exit_0, exit_error, signal: on their own)",
            m.agents_exited.clone(),
        );
        r.register("controls", "sandbox_control requests answered, by action and result", m.controls.clone());
        r.register(
            "inputs_applied",
            "agentInputs items of runs opened successfully, by apply kind",
            m.inputs_applied.clone(),
        );
        r.register(
            "inputs_failures",
            "acp_open failures with an agentInputs error code, by code",
            m.input_failures.clone(),
        );
        r.register("run_lanes", "Runs the daemon holds (with state, or busy)", m.lanes.clone());
        r.register("agents_running", "Live agents", m.agents.clone());
        r.register("prompts_in_flight", "Prompt turns without their result yet", m.prompts_in_flight.clone());
        r.register("outbox_messages", "Messages waiting in the outbox", m.outbox_messages.clone());
        r.register_with_unit("outbox", "Bytes waiting in the outbox", Unit::Bytes, m.outbox_bytes.clone());
        r.register(
            "outbox_dropped",
            "Messages dropped from a full outbox (oldest first)",
            m.outbox_dropped.clone(),
        );
        r.register(
            "nested_sandboxes",
            "Nested sandboxes (bwrap inside a sandbox) by how their request ended: started, refused \
             (before anything started), failed (while building it)",
            m.nested.clone(),
        );
        r.register(
            "egress_denied",
            "Connections the egress proxies of --network allow refused, by protocol (connect, http, socks5)",
            m.egress_denied.clone(),
        );
        if let Some(c) = &m.cgroup {
            r.register_with_unit(
                "cgroup_memory",
                "memory.current of the daemon's cgroup v2 (the daemon and its sandboxes)",
                Unit::Bytes,
                c.memory.clone(),
            );
            r.register("cgroup_pids", "pids.current of the daemon's cgroup v2", c.pids.clone());
            r.register_with_unit(
                "cgroup_cpu",
                "CPU time of the daemon's cgroup v2 (cpu.stat usage_usec)",
                Unit::Seconds,
                c.cpu.clone(),
            );
        }
        Metrics { registry: r, ..m }
    }

    /// The link registered (`true`) or went down.
    pub fn link(&self, up: bool) {
        let was = self.link_up.set(i64::from(up)) == 1;
        if up && !was {
            self.registrations.inc();
        } else if !up && was {
            self.disconnects.inc();
        }
    }

    /// A message from the backend, as it is dispatched.
    pub fn received(&self, msg: &Incoming) {
        let kind = match msg {
            Incoming::AcpOpen(m) => {
                if let Some(run) = m.run_id.as_str() {
                    let kinds = apply_kinds(&m.init);
                    let mut p = self.lock();
                    if p.opens.len() < MAX_PENDING || p.opens.contains_key(run) {
                        p.opens.insert(run.to_string(), (Instant::now(), kinds));
                    }
                }
                "acp_open"
            }
            Incoming::PromptSend(m) => {
                if let Some(id) = m.prompt_id.as_str() {
                    let mut p = self.lock();
                    if p.prompts.len() < MAX_PENDING {
                        p.prompts.insert(id.to_string(), Instant::now());
                    }
                }
                "prompt_send"
            }
            Incoming::AcpClose(_) => "acp_close",
            Incoming::SessionControl { kind, .. } => bounded(RECEIVED, kind),
            Incoming::SessionPermission(_) => "session_permission",
            Incoming::AcpMessage(_) => "acp_message",
            Incoming::SandboxControl(_) => "sandbox_control",
            Incoming::RegisterAck(_) => "register_ack",
            Incoming::IdConflict { .. } => "proxy_id_conflict",
        };
        self.received.get_or_create(&[("type", kind)]).inc();
    }

    /// A message the daemon queued for the backend (its JSON text).
    pub fn sent(&self, text: &str) {
        let Ok(msg) = serde_json::from_str::<Sent<'_>>(text) else { return };
        let kind = bounded(SENT, msg.kind.as_deref().unwrap_or(""));
        self.sent.get_or_create(&[("type", kind)]).inc();
        let ok = msg.ok.unwrap_or(false);
        match kind {
            "acp_opened" => {
                let open = msg.run_id.as_str().and_then(|run| self.lock().opens.remove(run));
                if let Some((at, kinds)) = open {
                    self.open_seconds.get_or_create(&[("result", result(ok))]).observe(secs(at.elapsed()));
                    if ok {
                        for apply in kinds {
                            self.inputs_applied.get_or_create(&[("apply", apply)]).inc();
                        }
                    }
                }
                if let Some(code) = msg.error.as_deref().filter(|_| !ok).and_then(input_code) {
                    self.input_failures.get_or_create(&[("code", code)]).inc();
                }
            }
            "prompt_result" => {
                if let Some(at) = msg.prompt_id.as_str().and_then(|id| self.lock().prompts.remove(id)) {
                    self.prompt_seconds.get_or_create(&[("result", result(ok))]).observe(secs(at.elapsed()));
                }
            }
            "sandbox_control_result" => {
                let action = bounded(CONTROL_ACTIONS, msg.action.as_str().unwrap_or(""));
                self.controls.get_or_create(&[("action", action), ("result", result(ok))]).inc();
            }
            _ => {}
        }
    }

    /// An agent's output relayed as it is (`acp_update`, `acp_message`).
    pub fn relayed(&self, kind: &str) {
        self.sent.get_or_create(&[("type", bounded(SENT, kind))]).inc();
    }

    /// An agent's process runs in its sandbox, `took` after its start.
    pub fn sandbox_started(&self, provider: &'static str, took: Duration) {
        self.sandbox_start_seconds.get_or_create(&[("provider", provider)]).observe(secs(took));
    }

    /// An agent connected (its stdio attached).
    pub fn agent_started(&self) {
        self.agents_started.inc();
    }

    /// An agent exited; `closed`: the daemon closed it.
    pub fn agent_exited(&self, code: Option<i32>, signal: Option<&str>, closed: bool) {
        let reason = match (closed, code, signal) {
            (true, _, _) => "closed",
            (false, _, Some(_)) => "signal",
            (false, Some(0), None) => "exit_0",
            (false, _, None) => "exit_error",
        };
        self.agents_exited.get_or_create(&[("reason", reason)]).inc();
    }

    /// An egress proxy refused a connection asked `via` (`CONNECT`,
    /// `HTTP`, `SOCKS5`).
    pub fn egress_denied(&self, via: &str) {
        let via = bounded(&["connect", "http", "socks5"], &via.to_ascii_lowercase());
        self.egress_denied.get_or_create(&[("via", via)]).inc();
    }

    /// The whole exposition, with the gauges as they are `now`.
    pub fn render(&self, now: Now) -> String {
        self.lanes.set(gauge(now.lanes));
        self.agents.set(gauge(now.agents));
        self.prompts_in_flight.set(gauge(now.prompts_in_flight));
        let (messages, bytes, dropped) = now.outbox;
        self.outbox_messages.set(gauge(messages));
        self.outbox_bytes.set(gauge(bytes));
        raise_to(&self.outbox_dropped, dropped);
        if let Some(n) = now.nested {
            for (result, total) in [("started", n.started), ("refused", n.refused), ("failed", n.failed)] {
                raise_to(&self.nested.get_or_create(&[("result", result)]), total);
            }
        }
        if let Some(c) = &self.cgroup {
            let read = |name: &str| std::fs::read_to_string(c.dir.join(name)).ok();
            if let Some(v) = read("memory.current").and_then(|t| t.trim().parse::<i64>().ok()) {
                c.memory.set(v);
            }
            if let Some(v) = read("pids.current").and_then(|t| t.trim().parse::<i64>().ok()) {
                c.pids.set(v);
            }
            let usage = read("cpu.stat").and_then(|t| {
                t.lines().find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok())
            });
            if let Some(usec) = usage {
                let now = usec as f64 / 1e6;
                let delta = now - c.cpu.get();
                if delta > 0.0 {
                    c.cpu.inc_by(delta);
                }
            }
        }
        crate::metrics::encode(&self.registry)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The apply kinds of `init.agentInputs.items`, in order.
fn apply_kinds(init: &Value) -> Vec<&'static str> {
    init.pointer("/agentInputs/items")
        .and_then(Value::as_array)
        .map(|items| items.iter().map(|i| bounded(APPLY, i["apply"].as_str().unwrap_or(""))).collect())
        .unwrap_or_default()
}

/// The daemon's own cgroup v2 directory, where it has the memory
/// controller's files (a cgroup v1 host has none).
fn cgroup_files() -> Option<CgroupFiles> {
    let dir = sandbox::limits::own_cgroup_dir()?;
    dir.join("memory.current").is_file().then(|| CgroupFiles {
        dir,
        memory: Gauge::default(),
        pids: Gauge::default(),
        cpu: Counter::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn value(text: &str, line_start: &str) -> Option<f64> {
        text.lines().find(|l| l.starts_with(line_start))?.rsplit(' ').next()?.parse().ok()
    }

    #[test]
    fn input_codes_are_bounded() {
        assert_eq!(
            input_code("AGENT_INPUTS_DOWNLOAD_FAILED:zip1: HTTP 404"),
            Some("AGENT_INPUTS_DOWNLOAD_FAILED")
        );
        assert_eq!(input_code("NOT_A_CODE_WE_HAVE: x"), Some("other"));
        assert_eq!(input_code("init_failed: init.script exited with exitCode=1"), None);
        assert_eq!(input_code("start agent_command: x"), None);
    }

    #[test]
    fn requests_and_replies_pair_by_id() {
        let m = Metrics::new();
        let open = json!({"type": "acp_open", "run_id": "r1", "init": {"agentInputs": {"version": 1, "items": [
            {"apply": "writeFile"}, {"apply": "downloadExtract"}, {"apply": "sneaky"}]}}});
        m.received(&Incoming::decode(&open.to_string()).unwrap());
        m.sent(r#"{"type":"acp_opened","run_id":"r1","ok":true}"#);
        // A reply without its request is counted, not timed.
        m.sent(r#"{"type":"acp_opened","run_id":"r2","ok":false,"error":"AGENT_INPUTS_HOST_PATH_NOT_ALLOWED:w: outside"}"#);
        m.sent(r#"{"type":"sandbox_control_result","action":"inspect","ok":true}"#);
        m.sent(r#"{"type":"sandbox_control_result","action":{"x":1},"ok":false}"#);
        m.sent(r#"{"type":"made_up"}"#);
        m.relayed("acp_update");
        let text = crate::metrics::encode(&m.registry);
        assert_eq!(value(&text, r#"tuixiu_acp_open_seconds_count{result="ok"}"#), Some(1.0), "{text}");
        assert_eq!(value(&text, r#"tuixiu_acp_open_seconds_count{result="error"}"#), None, "{text}");
        assert_eq!(value(&text, r#"tuixiu_inputs_applied_total{apply="writeFile"}"#), Some(1.0));
        assert_eq!(value(&text, r#"tuixiu_inputs_applied_total{apply="other"}"#), Some(1.0));
        assert_eq!(
            value(&text, r#"tuixiu_inputs_failures_total{code="AGENT_INPUTS_HOST_PATH_NOT_ALLOWED"}"#),
            Some(1.0)
        );
        assert_eq!(value(&text, r#"tuixiu_controls_total{action="inspect",result="ok"}"#), Some(1.0));
        assert_eq!(value(&text, r#"tuixiu_controls_total{action="other",result="error"}"#), Some(1.0));
        assert_eq!(value(&text, r#"tuixiu_messages_sent_total{type="other"}"#), Some(1.0));
        assert_eq!(value(&text, r#"tuixiu_messages_sent_total{type="acp_update"}"#), Some(1.0));
        assert_eq!(value(&text, r#"tuixiu_messages_received_total{type="acp_open"}"#), Some(1.0));
        assert!(!text.contains("r1") && !text.contains("r2"), "{text}");
    }

    #[test]
    fn link_transitions() {
        let m = Metrics::new();
        for up in [true, true, false, false, true] {
            m.link(up);
        }
        let text = crate::metrics::encode(&m.registry);
        assert_eq!(value(&text, "tuixiu_backend_registrations_total"), Some(2.0));
        assert_eq!(value(&text, "tuixiu_backend_disconnects_total"), Some(1.0));
        assert_eq!(value(&text, "tuixiu_backend_connected"), Some(1.0));
    }

    #[test]
    fn pending_tables_are_bounded() {
        let m = Metrics::new();
        for i in 0..MAX_PENDING + 10 {
            let msg = json!({"type": "prompt_send", "run_id": "r", "prompt_id": format!("p{i}")});
            m.received(&Incoming::decode(&msg.to_string()).unwrap());
        }
        assert_eq!(m.lock().prompts.len(), MAX_PENDING);
    }
}
