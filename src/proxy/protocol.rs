//! The WebSocket messages between the tuixiu backend and the daemon
//! (docs/protocol.md), as serde types.
//!
//! Incoming messages are decoded leniently: every field is a
//! [`serde_json::Value`] so that a field of the wrong type never turns a
//! message into silence. The handler validates, and answers a message that
//! expects a reply with an error reply naming the field. Fields the backend
//! may add later are kept in `extra` (part 2 reads some of them, e.g.
//! `context`, `timeout_ms`).
//!
//! Outgoing messages are plain structs with the backend's exact field
//! names; `null` is written where the Node proxy writes `null`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A decoded incoming frame.
#[derive(Debug)]
pub enum Incoming {
    AcpOpen(RunMessage),
    PromptSend(RunMessage),
    AcpClose(RunMessage),
    /// `session_cancel`, `session_set_mode`, `session_set_model`,
    /// `session_set_config_option` (the type is kept in `kind`).
    SessionControl {
        kind: String,
        msg: RunMessage,
    },
    SessionPermission(RunMessage),
    /// The raw tunnel (docs/acp.md, "Controls that never wait for a prompt"):
    /// `{run_id, message}` with a JSON-RPC message for the agent (in
    /// `extra["message"]`).
    AcpMessage(RunMessage),
    SandboxControl(SandboxControl),
    RegisterAck(RegisterAck),
    /// The backend refuses this proxy id (docs/protocol.md, "Identity and
    /// proxy_id_conflict"): `proxy_id_conflict` or `proxy_id_taken_over`, as a
    /// message type or an `error` field.
    IdConflict {
        reason: String,
    },
}

/// Why a frame was dropped (logged, never answered: there is no request to
/// answer).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not an object with a string \"type\"")]
    NoType,
    #[error("unknown message type {0:?}")]
    UnknownType(String),
}

/// The fields of the run-scoped messages (`acp_open`, `prompt_send`,
/// `acp_close`, session controls, `session_permission`). Only what part 1
/// validates is named; everything else stays in `extra`.
#[derive(Debug, Default, Deserialize)]
pub struct RunMessage {
    #[serde(default)]
    pub run_id: Value,
    #[serde(default)]
    pub instance_name: Value,
    #[serde(default)]
    pub keepalive_ttl_seconds: Value,
    #[serde(default)]
    pub init: Value,
    #[serde(default)]
    pub prompt_id: Value,
    #[serde(default)]
    pub control_id: Value,
    #[serde(default)]
    pub session_id: Value,
    #[serde(default)]
    pub cwd: Value,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Every `sandbox_control` action the daemon serves.
pub const CONTROL_ACTIONS: &[&str] = &[
    "inspect",
    "ensure_running",
    "stop",
    "remove",
    "report_inventory",
    "prune_orphans",
    "gc",
    "remove_workspace",
    "remove_image",
    "git_push",
];

/// `sandbox_control` (docs/protocol.md, "sandbox_control").
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct SandboxControl {
    #[serde(default)]
    pub action: Value,
    #[serde(default)]
    pub run_id: Value,
    #[serde(default)]
    pub instance_name: Value,
    #[serde(default)]
    pub request_id: Value,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RegisterAck {
    #[serde(default)]
    pub success: Value,
    #[serde(default)]
    pub error: Value,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn is_conflict(text: &str) -> bool {
    text.contains("proxy_id_conflict") || text.contains("proxy_id_taken_over")
}

impl Incoming {
    pub fn decode(text: &str) -> Result<Incoming, DecodeError> {
        let value: Value = serde_json::from_str(text).map_err(|e| DecodeError::NotJson(e.to_string()))?;
        let Value::Object(map) = value else {
            return Err(DecodeError::NoType);
        };
        let Some(kind) = map.get("type").and_then(Value::as_str).map(str::to_string) else {
            return Err(DecodeError::NoType);
        };
        let obj = Value::Object(map);
        // All fields are `Value` with defaults: decoding an object cannot fail.
        let run = |obj: Value| serde_json::from_value::<RunMessage>(obj).unwrap_or_default();
        Ok(match kind.as_str() {
            "acp_open" => Incoming::AcpOpen(run(obj)),
            "prompt_send" => Incoming::PromptSend(run(obj)),
            "acp_close" => Incoming::AcpClose(run(obj)),
            "session_cancel" | "session_set_mode" | "session_set_model" | "session_set_config_option" => {
                Incoming::SessionControl { kind, msg: run(obj) }
            }
            "session_permission" => Incoming::SessionPermission(run(obj)),
            "acp_message" => Incoming::AcpMessage(run(obj)),
            "sandbox_control" => Incoming::SandboxControl(serde_json::from_value(obj).unwrap_or_default()),
            "register_ack" => {
                let ack: RegisterAck = serde_json::from_value(obj).unwrap_or_default();
                let error = error_text(&ack.error);
                if ack.success == Value::Bool(false) && is_conflict(&error) {
                    Incoming::IdConflict { reason: error }
                } else {
                    Incoming::RegisterAck(ack)
                }
            }
            "proxy_id_conflict" | "proxy_id_taken_over" => {
                let detail = ["message", "error", "reason"]
                    .iter()
                    .find_map(|k| obj.get(*k).map(error_text))
                    .unwrap_or_default();
                Incoming::IdConflict {
                    reason: if detail.is_empty() { kind.clone() } else { format!("{kind}: {detail}") },
                }
            }
            "error" => {
                let detail = ["code", "error", "message"]
                    .iter()
                    .filter_map(|k| obj.get(*k).map(error_text))
                    .collect::<Vec<_>>()
                    .join(": ");
                if is_conflict(&detail) {
                    Incoming::IdConflict { reason: detail }
                } else {
                    return Err(DecodeError::UnknownType(format!("error ({detail})")));
                }
            }
            _ => return Err(DecodeError::UnknownType(kind)),
        })
    }
}

/// A JSON value as error text: strings as they are, objects by their
/// `code`/`message`, anything else as JSON.
pub fn error_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Object(m) => {
            let parts: Vec<String> = ["code", "message"]
                .iter()
                .filter_map(|k| m.get(*k).and_then(Value::as_str).map(str::to_string))
                .collect();
            if parts.is_empty() { v.to_string() } else { parts.join(": ") }
        }
        other => other.to_string(),
    }
}

/// A string field, trimmed; empty and non-strings are `None`.
pub fn str_field(v: &Value) -> Option<&str> {
    v.as_str().map(str::trim).filter(|s| !s.is_empty())
}

// ---------------------------------------------------------------- outgoing
//
// Every message the daemon sends is one of the types below, and its `type`
// is spelled here only ([`Kind`]). Field order is wire order: serde writes
// a struct's fields as declared. Most messages were first written as JSON
// trees, which keep their keys sorted, so their fields are declared in
// byte order of the key (`type` among them); the rest keep the order the
// Node proxy wrote. docs/protocol.md, "Key order", has the rule and
// `tests::wire_order` holds every type to it.

/// A message's `type`. Only this module makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Kind(&'static str);

impl Kind {
    pub const REGISTER_AGENT: Kind = Kind("register_agent");
    pub const HEARTBEAT: Kind = Kind("heartbeat");
    pub const SANDBOX_INVENTORY: Kind = Kind("sandbox_inventory");
    pub const WORKSPACE_INVENTORY: Kind = Kind("workspace_inventory");
    pub const HMAC_SHA256: Kind = Kind("hmac-sha256");
    const SANDBOX_CONTROL_RESULT: Kind = Kind("sandbox_control_result");
    const SANDBOX_INSTANCE_STATUS: Kind = Kind("sandbox_instance_status");
    const ACP_OPENED: Kind = Kind("acp_opened");
    const ACP_CLOSED: Kind = Kind("acp_closed");
    const ACP_EXIT: Kind = Kind("acp_exit");
    const ACP_MESSAGE: Kind = Kind("acp_message");
    const ACP_UPDATE: Kind = Kind("acp_update");
    const PROMPT_RESULT: Kind = Kind("prompt_result");
    const SESSION_CONTROL_RESULT: Kind = Kind("session_control_result");
    const PROXY_UPDATE: Kind = Kind("proxy_update");
    const TEXT: Kind = Kind("text");
    const INIT_STEP: Kind = Kind("init_step");
    const INIT_RESULT: Kind = Kind("init_result");
    const TRANSPORT_CONNECTED: Kind = Kind("transport_connected");
    const TRANSPORT_DISCONNECTED: Kind = Kind("transport_disconnected");
    const PERMISSION_REQUEST: Kind = Kind("permission_request");

    pub fn as_str(self) -> &'static str {
        self.0
    }
}

#[derive(Debug, Serialize)]
pub struct RegisterAgent {
    #[serde(rename = "type")]
    pub kind: Kind,
    pub agent: AgentInfo,
    /// Supplementary authentication (docs/protocol.md, "register_agent"),
    /// present only when `register_hmac_secret` is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<RegisterAuth>,
}

#[derive(Debug, Serialize)]
pub struct AgentInfo {
    pub id: String,
    pub name: String,
    pub max_concurrent: u64,
    pub capabilities: Map<String, Value>,
}

/// `auth` of `register_agent`: `signature` = hex HMAC-SHA256 of
/// `"<proxy_id>.<timestamp>"` with the shared secret.
#[derive(Debug, Serialize)]
pub struct RegisterAuth {
    #[serde(rename = "type")]
    pub kind: Kind,
    pub proxy_id: String,
    pub timestamp: String,
    pub signature: String,
}

#[derive(Debug, Serialize)]
pub struct Heartbeat<'a> {
    #[serde(rename = "type")]
    kind: Kind,
    agent_id: &'a str,
    timestamp: String,
}

impl Heartbeat<'_> {
    pub fn new(agent_id: &str, timestamp: String) -> Heartbeat<'_> {
        Heartbeat { kind: Kind::HEARTBEAT, agent_id, timestamp }
    }
}

/// `sandbox_control_result`: the echoed fields, `ok`, `error`, and the
/// action's own fields.
#[derive(Debug, Serialize)]
pub struct ControlResult {
    #[serde(rename = "type")]
    kind: Kind,
    pub run_id: Value,
    pub instance_name: Value,
    pub action: Value,
    pub request_id: Value,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

impl ControlResult {
    /// A result echoing `msg`'s identifying fields (as strings or `null`).
    pub fn for_msg(msg: &SandboxControl) -> ControlResult {
        let echo = |v: &Value| match v {
            Value::String(_) | Value::Number(_) => v.clone(),
            _ => Value::Null,
        };
        ControlResult {
            kind: Kind::SANDBOX_CONTROL_RESULT,
            run_id: echo(&msg.run_id),
            instance_name: echo(&msg.instance_name),
            action: echo(&msg.action),
            request_id: echo(&msg.request_id),
            ok: true,
            error: None,
            fields: Map::new(),
        }
    }
}

/// One entry of `sandbox_inventory.instances`.
#[derive(Clone, Debug, Serialize)]
pub struct InventoryInstance {
    pub instance_name: String,
    pub run_id: Option<String>,
    pub status: &'static str,
    pub created_at: Option<String>,
    pub last_seen_at: String,
}

/// An entry of `missing_instances` / `deleted_instances`.
#[derive(Clone, Debug, Serialize)]
pub struct InventoryRef {
    pub instance_name: String,
    pub run_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeletedWorkspace {
    pub instance_name: Option<String>,
    pub run_id: String,
    pub workspace_provider: &'static str,
    pub deleted_at: String,
    pub reason: &'static str,
}

#[derive(Debug, Serialize)]
pub struct SandboxInventory {
    #[serde(rename = "type")]
    pub kind: Kind,
    pub inventory_id: String,
    pub provider: &'static str,
    pub runtime: Option<String>,
    pub captured_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<InventoryInstance>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_instances: Option<Vec<InventoryRef>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_instances: Option<Vec<InventoryRef>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_workspaces: Option<Vec<DeletedWorkspace>>,
}

#[derive(Debug, Serialize)]
pub struct WorkspaceEntry {
    pub workspace_provider: &'static str,
    pub run_id: String,
    pub instance_name: Option<String>,
    pub host_path: String,
    pub guest_path: Option<String>,
    pub exists: bool,
    pub mtime: Option<String>,
    pub size_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct WorkspaceInventory {
    #[serde(rename = "type")]
    pub kind: Kind,
    pub inventory_id: String,
    pub captured_at: String,
    pub workspace_provider: &'static str,
    pub workspaces: Vec<WorkspaceEntry>,
}

/// `acp_opened`, `acp_closed` and `session_control_result`: a run's open,
/// close or session control answered. `run_id` and `control_id` are echoed
/// as the backend sent them.
#[derive(Debug, Serialize)]
pub struct RunReply<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    control_id: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    ok: bool,
    run_id: &'a Value,
    #[serde(rename = "type")]
    kind: Kind,
}

impl RunReply<'_> {
    pub fn opened(run_id: &Value, result: Result<(), String>) -> RunReply<'_> {
        RunReply::new(Kind::ACP_OPENED, run_id, None, result)
    }

    pub fn closed(run_id: &Value, result: Result<(), String>) -> RunReply<'_> {
        RunReply::new(Kind::ACP_CLOSED, run_id, None, result)
    }

    pub fn session_control<'a>(
        run_id: &'a Value,
        control_id: &'a Value,
        result: Result<(), String>,
    ) -> RunReply<'a> {
        RunReply::new(Kind::SESSION_CONTROL_RESULT, run_id, Some(control_id), result)
    }

    fn new<'a>(
        kind: Kind,
        run_id: &'a Value,
        control_id: Option<&'a Value>,
        result: Result<(), String>,
    ) -> RunReply<'a> {
        let ok = result.is_ok();
        RunReply { control_id, error: result.err(), ok, run_id, kind }
    }
}

/// `prompt_result`: a turn's end, or why the prompt failed.
#[derive(Debug, Serialize)]
pub struct PromptResult<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    ok: bool,
    prompt_id: &'a Value,
    run_id: &'a Value,
    #[serde(flatten)]
    turn: Option<Turn<'a>>,
    #[serde(rename = "type")]
    kind: Kind,
}

/// What a finished turn adds to `prompt_result`.
#[derive(Debug, Serialize)]
struct Turn<'a> {
    session_created: bool,
    session_id: &'a str,
    session_recreated_from: Option<&'a str>,
    stop_reason: &'a str,
}

impl<'a> PromptResult<'a> {
    pub fn done(run_id: &'a Value, prompt_id: &'a Value, turn: &'a crate::acp::host::PromptOutcome) -> Self {
        let turn = Turn {
            session_created: turn.session_created,
            session_id: &turn.session_id,
            session_recreated_from: turn.session_recreated_from.as_deref(),
            stop_reason: &turn.stop_reason,
        };
        PromptResult { error: None, ok: true, prompt_id, run_id, turn: Some(turn), kind: Kind::PROMPT_RESULT }
    }

    pub fn failed(run_id: &'a Value, prompt_id: &'a Value, error: String) -> Self {
        PromptResult {
            error: Some(error),
            ok: false,
            prompt_id,
            run_id,
            turn: None,
            kind: Kind::PROMPT_RESULT,
        }
    }
}

/// `acp_exit`: the agent of a run ended on its own.
#[derive(Debug, Serialize)]
pub struct AcpExit<'a> {
    code: Option<i32>,
    instance_name: &'a str,
    run_id: &'a str,
    signal: Option<&'a str>,
    #[serde(rename = "type")]
    kind: Kind,
}

impl<'a> AcpExit<'a> {
    pub fn new(run_id: &'a str, instance_name: &'a str, code: Option<i32>, signal: Option<&'a str>) -> Self {
        AcpExit { code, instance_name, run_id, signal, kind: Kind::ACP_EXIT }
    }
}

/// `acp_update` of a session the ACP host made itself (`session_created`,
/// `config_option_update`); the agent's own updates are relayed as text
/// ([`acp_update_text`]).
#[derive(Debug, Serialize)]
pub struct AcpUpdate<'a> {
    prompt_id: &'a Value,
    run_id: &'a str,
    session_id: &'a str,
    #[serde(rename = "type")]
    kind: Kind,
    update: &'a Value,
}

impl<'a> AcpUpdate<'a> {
    pub fn new(run_id: &'a str, prompt_id: &'a Value, session_id: &'a str, update: &'a Value) -> Self {
        AcpUpdate { prompt_id, run_id, session_id, kind: Kind::ACP_UPDATE, update }
    }
}

/// `acp_update {run_id, prompt_id, session_id, update}` with the agent's
/// `sessionId` and `update` JSON text (`null` when absent) copied in as
/// they are: no tree is built, and nothing the agent sent is re-typed or
/// dropped. Exactly as long as the message, so the outbox shares this
/// buffer with the frame without another allocation.
pub fn acp_update_text(run_id: &str, prompt_id: Option<&str>, session_id: &str, update: &str) -> String {
    let run_len = json_str_len(run_id);
    let prompt_len = prompt_id.map_or(Some(4), json_str_len);
    let mut text = String::with_capacity(
        68 + run_len.unwrap_or(run_id.len() + 8) + prompt_len.unwrap_or(8) + session_id.len() + update.len(),
    );
    text.push_str(r#"{"type":"acp_update","run_id":"#);
    push_json_str(&mut text, run_id);
    text.push_str(r#","prompt_id":"#);
    match prompt_id {
        None => text.push_str("null"),
        Some(p) => push_json_str(&mut text, p),
    }
    text.push_str(r#","session_id":"#);
    text.push_str(session_id);
    text.push_str(r#","update":"#);
    text.push_str(update);
    text.push('}');
    text
}

/// The length of `s` as a JSON string when it needs no escapes.
fn json_str_len(s: &str) -> Option<usize> {
    s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\').then_some(s.len() + 2)
}

/// `s` as a JSON string; ids are plain text in practice, anything else is
/// escaped.
fn push_json_str(text: &mut String, s: &str) {
    if json_str_len(s).is_some() {
        text.push('"');
        text.push_str(s);
        text.push('"');
    } else {
        text.push_str(&serde_json::to_string(s).expect("a string"));
    }
}

/// `acp_message {run_id, message}`: a notification of the agent other
/// than `session/update`, relayed with its params as the agent wrote them
/// (a tree cannot hold every number JSON allows, `1e999`, and the relay
/// drops nothing).
#[derive(Debug, Serialize)]
pub struct AcpMessage<'a> {
    #[serde(rename = "type")]
    kind: Kind,
    run_id: &'a str,
    message: RawNotification<'a>,
}

#[derive(Debug, Serialize)]
struct RawNotification<'a> {
    jsonrpc: &'static str,
    method: &'a str,
    params: Option<&'a serde_json::value::RawValue>,
}

impl<'a> AcpMessage<'a> {
    pub fn notification(
        run_id: &'a str,
        method: &'a str,
        params: Option<&'a serde_json::value::RawValue>,
    ) -> Self {
        AcpMessage {
            kind: Kind::ACP_MESSAGE,
            run_id,
            message: RawNotification { jsonrpc: "2.0", method, params },
        }
    }
}

/// `acp_message {run_id, message}` the other way round: the agent's
/// JSON-RPC answer to a request the backend tunnelled to it.
#[derive(Debug, Serialize)]
pub struct AcpReply<'a> {
    message: Value,
    run_id: &'a str,
    #[serde(rename = "type")]
    kind: Kind,
}

impl<'a> AcpReply<'a> {
    /// The agent's answer to the backend's request `id`: its result, its
    /// error (`data` written, `null` when it had none), or, `None`, an
    /// internal error: the agent's connection closed first.
    pub fn new(
        run_id: &'a str,
        id: &Value,
        reply: Option<Result<Value, crate::acp::transport::RpcError>>,
    ) -> Self {
        let message = match reply {
            Some(Ok(result)) => serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Some(Err(e)) => serde_json::json!(
                {"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message, "data": e.data}}
            ),
            None => serde_json::json!(
                {"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "the agent's connection closed"}}
            ),
        };
        AcpReply { message, run_id, kind: Kind::ACP_MESSAGE }
    }
}

/// `{"type":"proxy_update","run_id":…,"content":…}`: an event of a run.
#[derive(Debug, Serialize)]
pub struct ProxyUpdate<'a> {
    content: Content<'a>,
    run_id: &'a str,
    #[serde(rename = "type")]
    kind: Kind,
}

impl<'a> ProxyUpdate<'a> {
    pub fn new(run_id: &'a str, content: Content<'a>) -> Self {
        ProxyUpdate { content, run_id, kind: Kind::PROXY_UPDATE }
    }

    /// Text `[proxy:error] <message>`.
    pub fn error(run_id: &'a str, message: &str) -> Self {
        ProxyUpdate::new(run_id, Content::text(format!("[proxy:error] {message}")))
    }

    /// Text `[proxy:network] <what>`: a refusal of the run's egress proxy.
    pub fn network(run_id: &'a str, what: &str) -> Self {
        ProxyUpdate::new(run_id, Content::text(format!("[proxy:network] {what}")))
    }
}

/// The `content` of a `proxy_update`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Content<'a> {
    Text {
        text: String,
        #[serde(rename = "type")]
        kind: Kind,
    },
    /// An `init_step` of the init script, git preparation or bootstrap.
    InitStep {
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        stage: &'a str,
        status: &'a str,
        #[serde(rename = "type")]
        kind: Kind,
    },
    InitResult {
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(rename = "exitCode", skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        ok: bool,
        #[serde(rename = "type")]
        kind: Kind,
    },
    TransportConnected {
        at: String,
        instance_name: &'a str,
        #[serde(rename = "type")]
        kind: Kind,
    },
    TransportDisconnected {
        at: String,
        code: Option<i32>,
        instance_name: &'a str,
        reason: &'static str,
        signal: Option<&'a str>,
        #[serde(rename = "type")]
        kind: Kind,
    },
    /// The agent asks; the backend answers with `session_permission`.
    PermissionRequest {
        options: &'a Value,
        prompt_id: &'a Value,
        request_id: &'a str,
        session_id: &'a str,
        tool_call: &'a Value,
        #[serde(rename = "type")]
        kind: Kind,
    },
    InstanceStatus(InstanceStatus),
}

impl<'a> Content<'a> {
    pub fn text(text: String) -> Self {
        Content::Text { text, kind: Kind::TEXT }
    }

    pub fn init_step(stage: &'a str, status: &'a str, message: Option<String>) -> Self {
        Content::InitStep { message, stage, status, kind: Kind::INIT_STEP }
    }

    /// `init_result`: ok, or the error with the script's exit code when it
    /// had one.
    pub fn init_result(result: Result<(), (String, Option<i32>)>) -> Self {
        let (ok, error, exit_code) = match result {
            Ok(()) => (true, None, None),
            Err((e, code)) => (false, Some(e), code),
        };
        Content::InitResult { error, exit_code, ok, kind: Kind::INIT_RESULT }
    }

    pub fn transport_connected(instance_name: &'a str, at: String) -> Self {
        Content::TransportConnected { at, instance_name, kind: Kind::TRANSPORT_CONNECTED }
    }

    /// `transport_disconnected` with `reason: "agent_exit"`.
    pub fn agent_exited(
        instance_name: &'a str,
        code: Option<i32>,
        signal: Option<&'a str>,
        at: String,
    ) -> Self {
        Content::TransportDisconnected {
            at,
            code,
            instance_name,
            reason: "agent_exit",
            signal,
            kind: Kind::TRANSPORT_DISCONNECTED,
        }
    }

    pub fn permission_request(request: &'a crate::acp::port::PermissionAsk<'a>) -> Self {
        Content::PermissionRequest {
            options: request.options,
            prompt_id: &request.prompt_id,
            request_id: request.request_id,
            session_id: request.session_id,
            tool_call: request.tool_call,
            kind: Kind::PERMISSION_REQUEST,
        }
    }
}

/// `sandbox_instance_status`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceStatus {
    pub instance_name: String,
    pub last_error: Option<String>,
    pub last_seen_at: String,
    pub provider: &'static str,
    pub runtime: Option<String>,
    pub status: &'static str,
    #[serde(rename = "type")]
    kind: Kind,
}

impl InstanceStatus {
    pub fn new(
        instance_name: String,
        provider: &'static str,
        runtime: Option<String>,
        status: &'static str,
        last_error: Option<String>,
        last_seen_at: String,
    ) -> InstanceStatus {
        InstanceStatus {
            instance_name,
            last_error,
            last_seen_at,
            provider,
            runtime,
            status,
            kind: Kind::SANDBOX_INSTANCE_STATUS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_kinds() {
        assert!(matches!(Incoming::decode("{"), Err(DecodeError::NotJson(_))));
        assert_eq!(Incoming::decode("[1]").unwrap_err(), DecodeError::NoType);
        assert_eq!(Incoming::decode(r#"{"type":3}"#).unwrap_err(), DecodeError::NoType);
        assert_eq!(
            Incoming::decode(r#"{"type":"nope"}"#).unwrap_err(),
            DecodeError::UnknownType("nope".into())
        );
        match Incoming::decode(r#"{"type":"acp_open","run_id":"r1","context":"x","init":{"env":{}}}"#)
            .unwrap()
        {
            Incoming::AcpOpen(m) => {
                assert_eq!(m.run_id, "r1");
                assert_eq!(m.extra["context"], "x");
                assert!(m.init.is_object());
            }
            other => panic!("{other:?}"),
        }
        // A wrong type does not lose the message: it is validated later.
        match Incoming::decode(r#"{"type":"sandbox_control","action":5,"request_id":7}"#).unwrap() {
            Incoming::SandboxControl(c) => {
                assert_eq!(c.action, 5);
                let r = ControlResult::for_msg(&c);
                assert_eq!(r.request_id, 7);
                assert_eq!(r.run_id, Value::Null);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Incoming::decode(r#"{"type":"register_ack","success":false,"error":"proxy_id_conflict"}"#)
                .unwrap(),
            Incoming::IdConflict { .. }
        ));
        assert!(matches!(
            Incoming::decode(r#"{"type":"proxy_id_conflict","message":"in use"}"#).unwrap(),
            Incoming::IdConflict { reason } if reason == "proxy_id_conflict: in use"
        ));
    }

    #[test]
    fn control_result_shape() {
        let c: SandboxControl =
            serde_json::from_str(r#"{"action":"inspect","instance_name":"tuixiu-run-a"}"#).unwrap();
        let mut r = ControlResult::for_msg(&c);
        r.fields.insert("status".into(), "running".into());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type":"sandbox_control_result","run_id":null,"instance_name":"tuixiu-run-a",
                "action":"inspect","request_id":null,"ok":true,"status":"running"})
        );
    }

    /// `ours` is written exactly as `wire` (bytes: key order, `null` vs
    /// absent, numbers), and means what the backend's recorded `example`
    /// means (docs/protocol.md; `example` is `wire` when they are the same).
    fn same(ours: &impl Serialize, wire: &str, example: &str) {
        let text = serde_json::to_string(ours).unwrap();
        assert_eq!(text, wire);
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed, serde_json::from_str::<Value>(example).unwrap(), "{text}");
    }

    #[test]
    fn run_replies() {
        let run = Value::from("r1");
        same(
            &RunReply::opened(&run, Ok(())),
            r#"{"ok":true,"run_id":"r1","type":"acp_opened"}"#,
            r#"{"type":"acp_opened","run_id":"r1","ok":true}"#,
        );
        same(
            &RunReply::opened(&run, Err("Error: init.agentInputs missing".into())),
            r#"{"error":"Error: init.agentInputs missing","ok":false,"run_id":"r1","type":"acp_opened"}"#,
            r#"{"type":"acp_opened","run_id":"r1","ok":false,"error":"Error: init.agentInputs missing"}"#,
        );
        same(
            &RunReply::closed(&run, Ok(())),
            r#"{"ok":true,"run_id":"r1","type":"acp_closed"}"#,
            r#"{"type":"acp_closed","run_id":"r1","ok":true}"#,
        );
        // A run id of the wrong type is echoed as it came.
        same(
            &RunReply::closed(&Value::from(7), Err("run_not_found".into())),
            r#"{"error":"run_not_found","ok":false,"run_id":7,"type":"acp_closed"}"#,
            r#"{"type":"acp_closed","run_id":7,"ok":false,"error":"run_not_found"}"#,
        );
    }

    #[test]
    fn prompt_results() {
        let (run, prompt) = (Value::from("r1"), Value::from("p1"));
        let turn = crate::acp::host::PromptOutcome {
            session_id: "s1".into(),
            stop_reason: "end_turn".into(),
            session_created: true,
            session_recreated_from: None,
        };
        same(
            &PromptResult::done(&run, &prompt, &turn),
            r#"{"ok":true,"prompt_id":"p1","run_id":"r1","session_created":true,"session_id":"s1","session_recreated_from":null,"stop_reason":"end_turn","type":"prompt_result"}"#,
            r#"{"type":"prompt_result","run_id":"r1","prompt_id":"p1","ok":true,
                "session_id":"s1","stop_reason":"end_turn","session_created":true,"session_recreated_from":null}"#,
        );
        same(
            &PromptResult::failed(&run, &Value::Null, "prompt_id missing".into()),
            r#"{"error":"prompt_id missing","ok":false,"prompt_id":null,"run_id":"r1","type":"prompt_result"}"#,
            r#"{"type":"prompt_result","run_id":"r1","prompt_id":null,"ok":false,"error":"prompt_id missing"}"#,
        );
    }

    #[test]
    fn session_control_results() {
        let (run, control) = (Value::from("r1"), Value::from("c1"));
        same(
            &RunReply::session_control(&run, &control, Ok(())),
            r#"{"control_id":"c1","ok":true,"run_id":"r1","type":"session_control_result"}"#,
            r#"{"type":"session_control_result","run_id":"r1","control_id":"c1","ok":true}"#,
        );
        same(
            &RunReply::session_control(&run, &control, Err("no agent".into())),
            r#"{"control_id":"c1","error":"no agent","ok":false,"run_id":"r1","type":"session_control_result"}"#,
            r#"{"type":"session_control_result","run_id":"r1","control_id":"c1","ok":false,"error":"no agent"}"#,
        );
    }

    #[test]
    fn agent_messages() {
        same(
            &AcpExit::new("r1", "tuixiu-run-r1", None, Some("SIGKILL")),
            r#"{"code":null,"instance_name":"tuixiu-run-r1","run_id":"r1","signal":"SIGKILL","type":"acp_exit"}"#,
            r#"{"type":"acp_exit","run_id":"r1","instance_name":"tuixiu-run-r1","code":null,"signal":"SIGKILL"}"#,
        );
        let update =
            serde_json::json!({"sessionUpdate":"session_created","content":{"type":"session_created"}});
        same(
            &AcpUpdate::new("r1", &Value::Null, "s1", &update),
            r#"{"prompt_id":null,"run_id":"r1","session_id":"s1","type":"acp_update","update":{"content":{"type":"session_created"},"sessionUpdate":"session_created"}}"#,
            r#"{"type":"acp_update","run_id":"r1","prompt_id":null,"session_id":"s1",
                "update":{"sessionUpdate":"session_created","content":{"type":"session_created"}}}"#,
        );
        // The relay copies the agent's text, numbers JSON allows but a
        // tree cannot hold included.
        let relayed = acp_update_text("r1", Some("p\"1"), r#""s1""#, r#"{"sessionUpdate":"x","n":1e999}"#);
        assert_eq!(
            relayed,
            r#"{"type":"acp_update","run_id":"r1","prompt_id":"p\"1","session_id":"s1","update":{"sessionUpdate":"x","n":1e999}}"#
        );
        let plain = acp_update_text("r1", None, "null", "null");
        assert_eq!(
            plain,
            r#"{"type":"acp_update","run_id":"r1","prompt_id":null,"session_id":null,"update":null}"#
        );
        assert_eq!(plain.capacity(), plain.len());
        let params = serde_json::value::RawValue::from_string(r#"{"x": 1e9990}"#.into()).unwrap();
        same(
            &AcpMessage::notification("r1", "_vendor/bare", None),
            r#"{"type":"acp_message","run_id":"r1","message":{"jsonrpc":"2.0","method":"_vendor/bare","params":null}}"#,
            r#"{"type":"acp_message","run_id":"r1","message":{"jsonrpc":"2.0","method":"_vendor/bare","params":null}}"#,
        );
        assert_eq!(
            serde_json::to_string(&AcpMessage::notification("r1", "_v/n", Some(&params))).unwrap(),
            r#"{"type":"acp_message","run_id":"r1","message":{"jsonrpc":"2.0","method":"_v/n","params":{"x": 1e9990}}}"#
        );
        let id = Value::from(9);
        same(
            &AcpReply::new("r1", &id, Some(Ok(serde_json::json!({"a": 1})))),
            r#"{"message":{"id":9,"jsonrpc":"2.0","result":{"a":1}},"run_id":"r1","type":"acp_message"}"#,
            r#"{"type":"acp_message","run_id":"r1","message":{"jsonrpc":"2.0","id":9,"result":{"a":1}}}"#,
        );
        let e = crate::acp::transport::RpcError::new(-32601, "nope");
        same(
            &AcpReply::new("r1", &id, Some(Err(e))),
            r#"{"message":{"error":{"code":-32601,"data":null,"message":"nope"},"id":9,"jsonrpc":"2.0"},"run_id":"r1","type":"acp_message"}"#,
            r#"{"type":"acp_message","run_id":"r1","message":{"jsonrpc":"2.0","id":9,"error":{"code":-32601,"message":"nope","data":null}}}"#,
        );
        same(
            &AcpReply::new("r1", &id, None),
            r#"{"message":{"error":{"code":-32603,"message":"the agent's connection closed"},"id":9,"jsonrpc":"2.0"},"run_id":"r1","type":"acp_message"}"#,
            r#"{"type":"acp_message","run_id":"r1","message":{"jsonrpc":"2.0","id":9,"error":{"code":-32603,"message":"the agent's connection closed"}}}"#,
        );
    }

    #[test]
    fn proxy_updates() {
        let update = |c| ProxyUpdate::new("r1", c);
        same(
            &ProxyUpdate::error("r1", "boom"),
            r#"{"content":{"text":"[proxy:error] boom","type":"text"},"run_id":"r1","type":"proxy_update"}"#,
            r#"{"type":"proxy_update","run_id":"r1","content":{"type":"text","text":"[proxy:error] boom"}}"#,
        );
        same(
            &ProxyUpdate::network("r1", "denied x"),
            r#"{"content":{"text":"[proxy:network] denied x","type":"text"},"run_id":"r1","type":"proxy_update"}"#,
            r#"{"type":"proxy_update","run_id":"r1","content":{"type":"text","text":"[proxy:network] denied x"}}"#,
        );
        same(
            &update(Content::init_step("clone", "progress", None)),
            r#"{"content":{"stage":"clone","status":"progress","type":"init_step"},"run_id":"r1","type":"proxy_update"}"#,
            r#"{"type":"proxy_update","run_id":"r1","content":{"type":"init_step","stage":"clone","status":"progress"}}"#,
        );
        same(
            &update(Content::init_step("init", "failed", Some("no bash".into()))),
            r#"{"content":{"message":"no bash","stage":"init","status":"failed","type":"init_step"},"run_id":"r1","type":"proxy_update"}"#,
            r#"{"type":"proxy_update","run_id":"r1","content":{"type":"init_step","stage":"init","status":"failed","message":"no bash"}}"#,
        );
        same(
            &update(Content::init_result(Ok(()))),
            r#"{"content":{"ok":true,"type":"init_result"},"run_id":"r1","type":"proxy_update"}"#,
            r#"{"type":"proxy_update","run_id":"r1","content":{"type":"init_result","ok":true}}"#,
        );
        same(
            &update(Content::init_result(Err(("exitCode=3".into(), Some(3))))),
            r#"{"content":{"error":"exitCode=3","exitCode":3,"ok":false,"type":"init_result"},"run_id":"r1","type":"proxy_update"}"#,
            r#"{"type":"proxy_update","run_id":"r1","content":{"type":"init_result","ok":false,"exitCode":3,"error":"exitCode=3"}}"#,
        );
        let at = "2026-11-28T10:00:00.000Z".to_string();
        same(
            &update(Content::transport_connected("tuixiu-run-r1", at.clone())),
            r#"{"content":{"at":"2026-11-28T10:00:00.000Z","instance_name":"tuixiu-run-r1","type":"transport_connected"},"run_id":"r1","type":"proxy_update"}"#,
            r#"{"type":"proxy_update","run_id":"r1","content":{"type":"transport_connected","instance_name":"tuixiu-run-r1","at":"2026-11-28T10:00:00.000Z"}}"#,
        );
        same(
            &update(Content::agent_exited("tuixiu-run-r1", Some(1), None, at.clone())),
            r#"{"content":{"at":"2026-11-28T10:00:00.000Z","code":1,"instance_name":"tuixiu-run-r1","reason":"agent_exit","signal":null,"type":"transport_disconnected"},"run_id":"r1","type":"proxy_update"}"#,
            r#"{"type":"proxy_update","run_id":"r1","content":{"type":"transport_disconnected","instance_name":"tuixiu-run-r1",
                "code":1,"signal":null,"at":"2026-11-28T10:00:00.000Z","reason":"agent_exit"}}"#,
        );
        let (tool, options) = (serde_json::json!({"title": "rm"}), serde_json::json!([{"optionId": "a"}]));
        let ask = crate::acp::port::PermissionAsk {
            request_id: "7",
            session_id: "s1",
            prompt_id: Value::from("p1"),
            tool_call: &tool,
            options: &options,
        };
        same(
            &update(Content::permission_request(&ask)),
            r#"{"content":{"options":[{"optionId":"a"}],"prompt_id":"p1","request_id":"7","session_id":"s1","tool_call":{"title":"rm"},"type":"permission_request"},"run_id":"r1","type":"proxy_update"}"#,
            r#"{"type":"proxy_update","run_id":"r1","content":{"type":"permission_request","request_id":"7","session_id":"s1",
                "prompt_id":"p1","tool_call":{"title":"rm"},"options":[{"optionId":"a"}]}}"#,
        );
        let status = InstanceStatus::new("tuixiu-run-r1".into(), "bwrap", None, "running", None, at);
        same(
            &update(Content::InstanceStatus(status)),
            r#"{"content":{"instance_name":"tuixiu-run-r1","last_error":null,"last_seen_at":"2026-11-28T10:00:00.000Z","provider":"bwrap","runtime":null,"status":"running","type":"sandbox_instance_status"},"run_id":"r1","type":"proxy_update"}"#,
            r#"{"type":"proxy_update","run_id":"r1","content":{"type":"sandbox_instance_status","instance_name":"tuixiu-run-r1",
                "provider":"bwrap","runtime":null,"status":"running","last_seen_at":"2026-11-28T10:00:00.000Z","last_error":null}}"#,
        );
    }

    #[test]
    fn link_messages() {
        same(
            &Heartbeat::new("p1", "2026-11-28T10:00:00.000Z".into()),
            r#"{"type":"heartbeat","agent_id":"p1","timestamp":"2026-11-28T10:00:00.000Z"}"#,
            r#"{"type":"heartbeat","agent_id":"p1","timestamp":"2026-11-28T10:00:00.000Z"}"#,
        );
        let register = RegisterAgent {
            kind: Kind::REGISTER_AGENT,
            agent: AgentInfo {
                id: "p1".into(),
                name: "p1".into(),
                max_concurrent: 1,
                capabilities: Map::new(),
            },
            auth: None,
        };
        same(
            &register,
            r#"{"type":"register_agent","agent":{"id":"p1","name":"p1","max_concurrent":1,"capabilities":{}}}"#,
            r#"{"type":"register_agent","agent":{"id":"p1","name":"p1","max_concurrent":1,"capabilities":{}}}"#,
        );
        let inventory = WorkspaceInventory {
            kind: Kind::WORKSPACE_INVENTORY,
            inventory_id: "i1".into(),
            captured_at: "t".into(),
            workspace_provider: "host",
            workspaces: vec![WorkspaceEntry {
                workspace_provider: "host",
                run_id: "r1".into(),
                instance_name: None,
                host_path: "/w/run-r1".into(),
                guest_path: None,
                exists: true,
                mtime: Some("t".into()),
                size_bytes: None,
            }],
        };
        same(
            &inventory,
            r#"{"type":"workspace_inventory","inventory_id":"i1","captured_at":"t","workspace_provider":"host","workspaces":[{"workspace_provider":"host","run_id":"r1","instance_name":null,"host_path":"/w/run-r1","guest_path":null,"exists":true,"mtime":"t","size_bytes":null}]}"#,
            r#"{"type":"workspace_inventory","inventory_id":"i1","captured_at":"t","workspace_provider":"host",
                "workspaces":[{"workspace_provider":"host","run_id":"r1","instance_name":null,"host_path":"/w/run-r1",
                "guest_path":null,"exists":true,"mtime":"t","size_bytes":null}]}"#,
        );
    }
}
