//! Interactive jobs: what counts as the engine asking, and whether a
//! reply is taken (upstream's rules and 409 texts). Pure functions over
//! the job's record; [`super::conversation`] wires them to the endpoints,
//! the job's task and the wait timers (docs/skills.md, "Interactive jobs").

use serde_json::{Value, json};

use super::protocol::{ApiError, ReplyRequest};
use super::store::{InteractionState, JobRecord, Status, TakenReply};

/// The kinds of question a client knows how to show.
const KINDS: [&str; 5] = ["choose_one", "confirm", "fill_fields", "open_text", "risk_ack"];

/// What an interactive engine's answer is.
#[derive(Clone, Debug, PartialEq)]
pub enum Turn {
    /// The output of the skill (checked against the output schema).
    Final(Value),
    /// A question, normalized to upstream's `PendingInteraction`.
    Ask(Value),
    /// Looks like a question but is not a valid one.
    InvalidAsk,
}

/// Reads an interactive engine's answer: `{"ask_user": {...}}`,
/// `{"action"|"type"|"outcome": "ask_user", "interaction": {...}}` ask;
/// `{"outcome": "final", "final_data": {...}}` is the final output, and
/// so is any other object.
pub fn interpret(answer: Value) -> Turn {
    if let Some(pending) = pending_of(&answer) {
        return Turn::Ask(pending);
    }
    if looks_like_ask(&answer) {
        return Turn::InvalidAsk;
    }
    if answer.get("outcome").and_then(Value::as_str) == Some("final")
        && let Some(data @ Value::Object(_)) = answer.get("final_data")
    {
        return Turn::Final(data.clone());
    }
    Turn::Final(answer)
}

/// The question in `payload`, normalized as upstream does: a positive
/// integer `interaction_id`, a non-empty `prompt` (or `question`), a kind
/// among [`KINDS`] (aliases mapped, anything else `open_text`), options
/// with a label, `default_decision_policy` `engine_judgement` unless given.
pub fn pending_of(payload: &Value) -> Option<Value> {
    let obj = payload.as_object()?;
    let asks = |key: &str| obj.get(key).and_then(Value::as_str) == Some("ask_user");
    let inner = match obj.get("ask_user") {
        Some(v @ Value::Object(_)) => v,
        _ if asks("action") || asks("type") || asks("outcome") => {
            obj.get("interaction").filter(|v| v.is_object())?
        }
        _ => return None,
    };
    let prompt = inner.get("prompt").or_else(|| inner.get("question"))?.as_str()?.trim();
    if prompt.is_empty() {
        return None;
    }
    let id = match inner.get("interaction_id")? {
        Value::Number(n) => n.as_i64()?,
        Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    if id <= 0 {
        return None;
    }
    let kind = inner.get("kind").and_then(Value::as_str).unwrap_or_default().trim().to_lowercase();
    let kind = match kind.as_str() {
        "decision" => "choose_one",
        "confirmation" => "confirm",
        "clarification" => "open_text",
        k if KINDS.contains(&k) => k,
        _ => "open_text",
    };
    let options: Vec<Value> = inner
        .get("options")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|o| {
            let label = o.get("label")?.as_str().filter(|l| !l.trim().is_empty())?;
            Some(json!({"label": label, "value": o.get("value").cloned().unwrap_or(Value::Null)}))
        })
        .collect();
    let policy = inner
        .get("default_decision_policy")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .unwrap_or("engine_judgement");
    Some(json!({
        "interaction_id": id,
        "kind": kind,
        "prompt": prompt,
        "options": options,
        "ui_hints": inner.get("ui_hints").filter(|v| v.is_object()).cloned().unwrap_or_else(|| json!({})),
        "default_decision_policy": policy,
        "required_fields": inner.get("required_fields").filter(|v| v.is_array()).cloned().unwrap_or_else(|| json!([])),
        "context": inner.get("context").cloned().unwrap_or(Value::Null),
    }))
}

/// Whether `payload` means to ask, valid or not (upstream's
/// `Invalid ask_user payload` when it is not).
pub fn looks_like_ask(payload: &Value) -> bool {
    let Some(obj) = payload.as_object() else { return false };
    obj.get("ask_user").is_some_and(Value::is_object)
        || ["action", "type", "outcome"]
            .iter()
            .any(|k| obj.get(*k).and_then(Value::as_str) == Some("ask_user"))
}

/// The prompt of a resumed turn: the reply itself when it is text, else
/// its JSON (upstream's).
pub fn reply_prompt(response: &Value) -> String {
    match response {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The line a sticky engine reads on its stdin for a reply.
pub fn sticky_line(reply: &TakenReply) -> String {
    let mut line = json!({"interaction_id": reply.interaction_id, "response": reply.response}).to_string();
    line.push('\n');
    line
}

/// The server's own reply when the wait ran out and the request said
/// `interactive_require_user_reply: false` (upstream's payload).
pub fn auto_reply(pending: &Value, now: String) -> TakenReply {
    let id = pending.get("interaction_id").and_then(Value::as_i64).unwrap_or(0);
    let policy = pending.get("default_decision_policy").and_then(Value::as_str).unwrap_or("engine_judgement");
    TakenReply {
        interaction_id: id,
        idempotency_key: Some(format!("auto-timeout:{id}")),
        response: json!({
            "source": "auto_decide_timeout",
            "interaction_id": id,
            "reason": "user_no_reply",
            "policy": policy,
            "instruction": "User did not respond in time. Continue with your best judgement based on the current context.",
        }),
        resolution_mode: "auto_decide_timeout".into(),
        resolved_at: now,
    }
}

/// How long a question may wait: `session_timeout_sec` (normalized at
/// create, default 1200 s).
pub fn session_timeout(record: &JobRecord) -> std::time::Duration {
    let secs = record.runtime_options.get("session_timeout_sec").and_then(Value::as_u64).unwrap_or(1200);
    std::time::Duration::from_secs(secs.max(1))
}

/// What to do with a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The same reply again (same `idempotency_key`, same response):
    /// answered as accepted, nothing changes.
    Replay,
    /// A new reply to the pending question: the job continues with it.
    Take,
}

/// Upstream's checks of a reply, in its order: a replay is accepted
/// whatever the state; otherwise the job must be waiting, on this
/// question, and a key may not come back with another response.
pub fn judge(
    status: Option<Status>,
    error_code: Option<&str>,
    state: &InteractionState,
    reply: &ReplyRequest,
) -> Result<Verdict, ApiError> {
    if let Some(key) = &reply.idempotency_key
        && let Some(taken) = state
            .replies
            .iter()
            .find(|r| r.interaction_id == reply.interaction_id && r.idempotency_key.as_ref() == Some(key))
    {
        return if taken.response == reply.response {
            Ok(Verdict::Replay)
        } else {
            Err(ApiError::new(409, "idempotency_key already used with different response"))
        };
    }
    match error_code {
        Some("INTERACTION_PROCESS_LOST") => return Err(ApiError::new(409, "sticky process lost")),
        Some("INTERACTION_WAIT_TIMEOUT") => return Err(ApiError::new(409, "interaction wait timeout")),
        _ if status != Some(Status::WaitingUser) => {
            return Err(ApiError::new(409, "Run is not waiting for user interaction"));
        }
        _ => {}
    }
    match state.pending_id() {
        None => Err(ApiError::new(409, "No pending interaction")),
        Some(id) if id != reply.interaction_id => Err(ApiError::new(409, "stale interaction")),
        Some(_) => Ok(Verdict::Take),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skills::store::Profile;

    #[test]
    fn questions_as_upstream_normalizes_them() {
        let p =
            pending_of(&json!({"ask_user": {"interaction_id": "2", "kind": "Decision", "prompt": " Which? ",
            "options": [{"label": "A", "value": 1}, {"value": 2}, "x"]}}))
            .unwrap();
        assert_eq!(p["interaction_id"], 2);
        assert_eq!(p["kind"], "choose_one");
        assert_eq!(p["prompt"], "Which?");
        assert_eq!(p["options"], json!([{"label": "A", "value": 1}]));
        assert_eq!(p["default_decision_policy"], "engine_judgement");
        assert_eq!(p["ui_hints"], json!({}));
        let p = pending_of(&json!({"action": "ask_user", "interaction": {"interaction_id": 1, "question": "q", "kind": "odd"}}))
            .unwrap();
        assert_eq!((p["kind"].clone(), p["prompt"].clone()), (json!("open_text"), json!("q")));
        for bad in [
            json!({"ask_user": {"interaction_id": 0, "prompt": "q"}}),
            json!({"ask_user": {"interaction_id": 1, "prompt": "  "}}),
            json!({"ask_user": {"prompt": "q"}}),
            json!({"outcome": "ask_user"}),
        ] {
            assert_eq!(pending_of(&bad), None, "{bad}");
            assert_eq!(interpret(bad), Turn::InvalidAsk);
        }
        assert_eq!(
            interpret(json!({"outcome": "final", "final_data": {"a": 1}})),
            Turn::Final(json!({"a": 1}))
        );
        assert_eq!(interpret(json!({"a": 1})), Turn::Final(json!({"a": 1})));
    }

    #[test]
    fn replies_are_judged_in_upstreams_order() {
        let mut state = InteractionState::new(Profile::Resumable);
        state.pending = Some(json!({"interaction_id": 2}));
        let reply = |id: i64, response: Value, key: Option<&str>| ReplyRequest {
            interaction_id: id,
            response,
            idempotency_key: key.map(str::to_string),
        };
        let waiting = Some(Status::WaitingUser);
        let msg = |r: Result<Verdict, ApiError>| r.unwrap_err().to_string();
        assert_eq!(judge(waiting, None, &state, &reply(2, json!("y"), None)), Ok(Verdict::Take));
        assert_eq!(msg(judge(waiting, None, &state, &reply(1, json!("y"), None))), "stale interaction");
        assert_eq!(
            msg(judge(Some(Status::Running), None, &state, &reply(2, json!("y"), None))),
            "Run is not waiting for user interaction"
        );
        assert_eq!(
            msg(judge(
                Some(Status::Failed),
                Some("INTERACTION_PROCESS_LOST"),
                &state,
                &reply(2, json!(1), None)
            )),
            "sticky process lost"
        );
        state.replies.push(TakenReply {
            interaction_id: 1,
            idempotency_key: Some("k".into()),
            response: json!("first"),
            resolution_mode: "user_reply".into(),
            resolved_at: String::new(),
        });
        let running = Some(Status::Running);
        assert_eq!(judge(running, None, &state, &reply(1, json!("first"), Some("k"))), Ok(Verdict::Replay));
        assert_eq!(
            msg(judge(running, None, &state, &reply(1, json!("other"), Some("k")))),
            "idempotency_key already used with different response"
        );
        state.pending = None;
        assert_eq!(msg(judge(waiting, None, &state, &reply(2, json!(1), None))), "No pending interaction");
    }
}
