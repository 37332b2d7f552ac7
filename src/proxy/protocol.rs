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

#[derive(Debug, Serialize)]
pub struct RegisterAgent {
    #[serde(rename = "type")]
    pub kind: &'static str,
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
    pub kind: &'static str,
    pub proxy_id: String,
    pub timestamp: String,
    pub signature: String,
}

#[derive(Debug, Serialize)]
pub struct Heartbeat<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub agent_id: &'a str,
    pub timestamp: String,
}

/// `sandbox_instance_status` (the `content` of a `proxy_update`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceStatusContent {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub instance_name: String,
    pub provider: &'static str,
    pub runtime: Option<String>,
    pub status: &'static str,
    pub last_seen_at: String,
    pub last_error: Option<String>,
}

/// `sandbox_control_result`: the echoed fields, `ok`, `error`, and the
/// action's own fields.
#[derive(Debug, Serialize)]
pub struct ControlResult {
    #[serde(rename = "type")]
    pub kind: &'static str,
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
            kind: "sandbox_control_result",
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
    pub kind: &'static str,
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
    pub kind: &'static str,
    pub inventory_id: String,
    pub captured_at: String,
    pub workspace_provider: &'static str,
    pub workspaces: Vec<WorkspaceEntry>,
}

/// `{"type":"proxy_update","run_id":…,"content":…}`.
pub fn proxy_update(run_id: &str, content: Value) -> Value {
    serde_json::json!({"type": "proxy_update", "run_id": run_id, "content": content})
}

/// `proxy_update` text `[proxy:error] <message>`.
pub fn proxy_error_text(run_id: &str, message: &str) -> Value {
    proxy_update(run_id, serde_json::json!({"type": "text", "text": format!("[proxy:error] {message}")}))
}

/// `proxy_update` text `[proxy:network] <what>`: a refusal of the run's
/// egress proxy.
pub fn proxy_network_text(run_id: &str, what: &str) -> Value {
    proxy_update(run_id, serde_json::json!({"type": "text", "text": format!("[proxy:network] {what}")}))
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
}
