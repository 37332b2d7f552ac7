//! One agent process of a run: start, `initialize`, sessions, prompts,
//! session controls, cancel and shutdown.
//!
//! Prompts of one agent are sent one after another (a FIFO lock), while
//! session controls, `session/cancel` and permission answers go straight
//! to the agent: a long prompt never holds them up.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

use super::client::Client;
use super::port::{Context, Event};
use super::transport::{CallError, Transport, code};
use crate::provider::{ExitStatus, Killer, Process};

/// The protocol version this client speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// What a successful prompt turn reports.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptOutcome {
    pub session_id: String,
    pub stop_reason: String,
    pub session_created: bool,
    pub session_recreated_from: Option<String>,
}

/// A running agent.
pub struct Agent {
    pub transport: Arc<Transport>,
    pub client: Arc<Client>,
    /// The `initialize` result.
    pub init: Mutex<Value>,
    killer: Killer,
    /// Sessions this process has created or loaded.
    sessions: Mutex<HashSet<String>>,
    /// Auto mode configured on these sessions (none yet).
    prompt_lock: tokio::sync::Mutex<()>,
    exited: watch::Receiver<Option<ExitStatus>>,
    /// Set when the daemon itself shuts the agent down (no `acp_exit`).
    pub closing: Arc<AtomicBool>,
    cx: Context,
    run_id: String,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn call_text(e: &CallError) -> String {
    match e {
        CallError::Rpc(r) => r.message.clone(),
        other => other.to_string(),
    }
}

/// Why an agent could not be started, initialized, prompted or controlled.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AgentError {
    #[error("the agent process has no stdio pipes")]
    NoPipes,
    #[error("initialize: {0}")]
    Initialize(CallError),
    #[error(
        "initialize: the agent speaks ACP protocol version {got}, this daemon speaks {}",
        PROTOCOL_VERSION
    )]
    Version { got: String },
    /// A request the agent failed: its own message when it answered one.
    #[error("{method}: {}", call_text(.error))]
    Call { method: &'static str, error: CallError },
    #[error("session/new returned no sessionId (session/new 未返回 sessionId)")]
    NoSessionId,
    #[error("unknown ACP content block type: {0:?} (未知的 ACP content block type)")]
    UnknownBlock(String),
    #[error("the agent does not accept {kind} content (promptCapabilities.{cap} is not set)")]
    Unsupported { kind: String, cap: &'static str },
    #[error("unknown session control {0}")]
    UnknownControl(String),
}

impl Agent {
    /// Takes over a started agent process: stderr lines become
    /// `[agent:stderr]` texts (redacted), stdout the ACP connection, and
    /// its exit calls `on_exit` (after `transport_disconnected` and, unless
    /// the daemon closed it, `acp_exit`).
    pub fn attach(
        cx: Context,
        run_id: &str,
        instance: &str,
        mut process: Process,
        client: Client,
        on_exit: Box<dyn FnOnce(ExitStatus) + Send>,
    ) -> Result<Arc<Agent>, AgentError> {
        let (Some(stdin), Some(stdout)) = (process.stdin.take(), process.stdout.take()) else {
            return Err(AgentError::NoPipes);
        };
        if let Some(stderr) = process.stderr.take() {
            let (sink, run) = (cx.sink.clone(), run_id.to_string());
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stderr).split(b'\n');
                while let Ok(Some(line)) = lines.next_segment().await {
                    let text = String::from_utf8_lossy(&line);
                    let text = text.trim_end();
                    if !text.is_empty() {
                        let text = sink.redact(text);
                        sink.event(&run, Event::Stderr(&text));
                    }
                }
            });
        }
        let client = Arc::new(client);
        let transport = Transport::start(stdout, stdin, client.clone());
        let killer = process.killer();
        let (tx, rx) = watch::channel(None);
        let closing = Arc::new(AtomicBool::new(false));
        {
            let (sink, run, instance, closing, client) =
                (cx.sink.clone(), run_id.to_string(), instance.to_string(), closing.clone(), client.clone());
            tokio::spawn(async move {
                let status = match process.wait().await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!("run {run}: waiting for the agent: {e}");
                        ExitStatus { code: None, signal: None }
                    }
                };
                client.terminals.kill_all().await;
                let signal = status.signal.map(super::terminal::signal_name);
                tracing::info!("run {run}: agent exited (code {:?}, signal {:?})", status.code, signal);
                let report_exit = !closing.load(Ordering::SeqCst);
                sink.event(
                    &run,
                    Event::Exited {
                        instance: &instance,
                        code: status.code,
                        signal: signal.as_deref(),
                        report_exit,
                    },
                );
                let _ = tx.send(Some(status));
                on_exit(status);
            });
        }
        cx.sink.event(run_id, Event::Connected { instance });
        Ok(Arc::new(Agent {
            transport,
            client,
            init: Mutex::new(Value::Null),
            killer,
            sessions: Mutex::new(HashSet::new()),
            prompt_lock: tokio::sync::Mutex::new(()),
            exited: rx,
            closing,
            run_id: run_id.to_string(),
            cx,
        }))
    }

    pub fn has_exited(&self) -> bool {
        self.exited.borrow().is_some()
    }

    fn timeout(&self) -> Duration {
        self.cx.settings.request_timeout
    }

    /// `initialize` with protocol version 1 and our capabilities.
    pub async fn initialize(&self) -> Result<(), AgentError> {
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {
                "fs": {"readTextFile": true, "writeTextFile": true},
                "terminal": self.cx.settings.terminal_enabled,
            },
            "clientInfo": {"name": "tuixiu-sandbox", "title": "tuixiu-sandbox proxy", "version": env!("CARGO_PKG_VERSION")},
        });
        let result = self
            .transport
            .call("initialize", params, Some(self.timeout()))
            .await
            .map_err(AgentError::Initialize)?;
        match result.get("protocolVersion").and_then(Value::as_u64) {
            Some(PROTOCOL_VERSION) => {}
            other => {
                let got = other.map_or_else(|| "(none)".to_string(), |v| v.to_string());
                return Err(AgentError::Version { got });
            }
        }
        *lock(&self.init) = result;
        Ok(())
    }

    fn capability(&self, pointer: &str) -> bool {
        lock(&self.init).pointer(pointer).and_then(Value::as_bool).unwrap_or(false)
    }

    /// A request, retried once after `authenticate` when the agent says
    /// authentication is required (`-32000`) and offers a method.
    async fn call(&self, method: &str, params: Value, timeout: Option<Duration>) -> Result<Value, CallError> {
        match self.transport.call(method, params.clone(), timeout).await {
            Err(CallError::Rpc(e)) if e.code == code::AUTH_REQUIRED => {
                let method_id = lock(&self.init).pointer("/authMethods/0/id").cloned();
                let Some(method_id) = method_id else { return Err(CallError::Rpc(e)) };
                self.transport
                    .call("authenticate", json!({"methodId": method_id}), Some(self.timeout()))
                    .await?;
                self.transport.call(method, params, timeout).await
            }
            other => other,
        }
    }

    async fn new_session(&self, cwd: &str) -> Result<String, AgentError> {
        let result = self
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}), Some(self.timeout()))
            .await
            .map_err(|error| AgentError::Call { method: "session/new", error })?;
        let Some(id) = result.get("sessionId").and_then(Value::as_str).filter(|s| !s.is_empty()) else {
            return Err(AgentError::NoSessionId);
        };
        lock(&self.sessions).insert(id.to_string());
        let push = |update: Value| {
            let prompt_id = self.client.prompt_id();
            self.cx.sink.event(&self.run_id, Event::SessionUpdate { prompt_id, session_id: id, update });
        };
        push(json!({"sessionUpdate": "session_created", "content": {"type": "session_created"}}));
        if let Some(opts) = result.get("configOptions").filter(|v| v.is_array()) {
            push(json!({"sessionUpdate": "config_option_update", "configOptions": opts}));
        }
        Ok(id.to_string())
    }

    /// One prompt turn (docs/protocol.md, "prompt_send"; docs/acp.md, "Prompts
    /// and sessions"). Long because the session choice, the turn and its one
    /// retry on a new session share the outcome they build.
    pub async fn prompt(
        &self,
        prompt_id: &str,
        session_id: Option<&str>,
        cwd: &str,
        context: Option<&str>,
        prompt: Vec<Value>,
        timeout: Duration,
    ) -> Result<PromptOutcome, AgentError> {
        let _turn = self.prompt_lock.lock().await;
        *lock(&self.client.active_prompt) = Some(prompt_id.to_string());
        struct Clear<'a>(&'a Agent, String);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                let mut p = lock(&self.0.client.active_prompt);
                if p.as_deref() == Some(self.1.as_str()) {
                    *p = None;
                }
            }
        }
        let _clear = Clear(self, prompt_id.to_string());
        self.check_blocks(&prompt)?;
        let (session, created) = match session_id {
            None => (self.new_session(cwd).await?, true),
            Some(id) => {
                let fresh = lock(&self.sessions).insert(id.to_string());
                if fresh && self.capability("/agentCapabilities/loadSession") {
                    // Replayed history arrives as updates of this prompt.
                    if let Err(e) = self
                        .call(
                            "session/load",
                            json!({"sessionId": id, "cwd": cwd, "mcpServers": []}),
                            Some(self.timeout()),
                        )
                        .await
                    {
                        tracing::warn!("run {}: session/load {id}: {e}; prompting it anyway", self.run_id);
                    }
                }
                (id.to_string(), false)
            }
        };
        let blocks = |created: bool| -> Vec<Value> {
            match context.filter(|c| created && !c.trim().is_empty()) {
                Some(ctx) => self.with_context(ctx, &prompt),
                None => prompt.clone(),
            }
        };
        let send = |session: String, blocks: Vec<Value>| async move {
            self.call("session/prompt", json!({"sessionId": session, "prompt": blocks}), Some(timeout)).await
        };
        let (session, created, recreated_from, result) = match send(session.clone(), blocks(created)).await {
            Err(CallError::Rpc(e))
                if e.code == code::RESOURCE_NOT_FOUND || e.message.to_lowercase().contains("session") =>
            {
                tracing::warn!(
                    "run {}: session {session} unusable ({e}); retrying once on a new session",
                    self.run_id
                );
                let fresh = self.new_session(cwd).await?;
                let r = send(fresh.clone(), blocks(true)).await;
                (fresh, true, Some(session), r)
            }
            other => (session, created, None, other),
        };
        let result = result.map_err(|error| AgentError::Call { method: "session/prompt", error })?;
        let stop_reason = match result.get("stopReason").and_then(Value::as_str).filter(|s| !s.is_empty()) {
            Some(s) => s.to_string(),
            None => {
                tracing::warn!(
                    "run {}: the agent's prompt result has no stopReason; reporting end_turn",
                    self.run_id
                );
                "end_turn".into()
            }
        };
        Ok(PromptOutcome {
            session_id: session,
            stop_reason,
            session_created: created,
            session_recreated_from: recreated_from,
        })
    }

    /// Prompt blocks the agent cannot take are refused before sending.
    fn check_blocks(&self, prompt: &[Value]) -> Result<(), AgentError> {
        for b in prompt {
            let t = b.get("type").and_then(Value::as_str).unwrap_or("");
            let needs = match t {
                "text" | "resource_link" => None,
                "image" => Some("image"),
                "audio" => Some("audio"),
                "resource" => Some("embeddedContext"),
                other => return Err(AgentError::UnknownBlock(other.to_string())),
            };
            if let Some(cap) = needs
                && !self.capability(&format!("/agentCapabilities/promptCapabilities/{cap}"))
            {
                return Err(AgentError::Unsupported { kind: t.to_string(), cap });
            }
        }
        Ok(())
    }

    fn with_context(&self, ctx: &str, prompt: &[Value]) -> Vec<Value> {
        let prelude = "你正在接手一个任务，之前的 ACP 会话可能已丢失。以下是任务上下文，请据此继续。\n=== 上下文开始 ===\n";
        let suffix = "=== 上下文结束 ===\n\n用户消息：";
        let mut out = if self.capability("/agentCapabilities/promptCapabilities/embeddedContext") {
            vec![
                json!({"type": "text", "text": prelude}),
                json!({"type": "resource", "resource": {"uri": "tuixiu://context", "mimeType": "text/markdown", "text": ctx}}),
                json!({"type": "text", "text": suffix}),
            ]
        } else {
            vec![json!({"type": "text", "text": format!("{prelude}{ctx}\n{suffix}")})]
        };
        out.extend(prompt.iter().cloned());
        out
    }

    /// `session_cancel`: the notification, and pending permissions of the
    /// session answered `cancelled` (ACP's cancellation rule: docs/acp.md,
    /// "Controls that never wait for a prompt").
    pub fn cancel(&self, session_id: &str) {
        self.transport.notify("session/cancel", json!({"sessionId": session_id}));
        self.client.cancel_permissions(session_id);
    }

    /// `session_set_mode`, `session_set_model`, `session_set_config_option`.
    pub async fn control(
        &self,
        kind: &str,
        session_id: &str,
        msg: &serde_json::Map<String, Value>,
    ) -> Result<(), AgentError> {
        let (method, params) = match kind {
            "session_set_mode" => {
                ("session/set_mode", json!({"sessionId": session_id, "modeId": msg.get("mode_id")}))
            }
            "session_set_model" => {
                ("session/set_model", json!({"sessionId": session_id, "modelId": msg.get("model_id")}))
            }
            "session_set_config_option" => (
                "session/set_config_option",
                json!({"sessionId": session_id, "configId": msg.get("config_id"), "value": msg.get("value").cloned().unwrap_or(Value::Null)}),
            ),
            other => return Err(AgentError::UnknownControl(other.to_string())),
        };
        let result = self
            .call(method, params, Some(self.timeout()))
            .await
            .map_err(|error| AgentError::Call { method, error })?;
        if let Some(opts) = result.get("configOptions").filter(|v| v.is_array()) {
            let update = json!({"sessionUpdate": "config_option_update", "configOptions": opts});
            let prompt_id = self.client.prompt_id();
            self.cx.sink.event(&self.run_id, Event::SessionUpdate { prompt_id, session_id, update });
        }
        Ok(())
    }

    /// Stops the agent: stdin closed, SIGTERM after the grace period,
    /// SIGKILL after another (real agents ignore end-of-file).
    pub async fn shutdown(&self, reason: &str) {
        self.closing.store(true, Ordering::SeqCst);
        tracing::info!("run {}: closing the agent ({reason})", self.run_id);
        self.transport.close_stdin();
        let grace = self.cx.settings.shutdown_grace;
        let mut rx = self.exited.clone();
        let wait = |rx: &mut watch::Receiver<Option<ExitStatus>>, t: Duration| {
            let mut rx = rx.clone();
            async move {
                let _ = tokio::time::timeout(t, rx.wait_for(|s| s.is_some())).await;
            }
        };
        wait(&mut rx, grace).await;
        if self.has_exited() {
            return;
        }
        let _ = self.killer.kill(libc::SIGTERM).await;
        wait(&mut rx, grace).await;
        if self.has_exited() {
            return;
        }
        let _ = self.killer.kill(libc::SIGKILL).await;
        wait(&mut rx, Duration::from_secs(5)).await;
    }
}
