//! The protocol of the skills API as types: the refusal every endpoint
//! answers with, and each request body and query checked as upstream's
//! FastAPI checks it (422 in FastAPI's list shape for a malformed body,
//! 400 with upstream's messages for a policy refusal). Handlers get typed
//! requests from here and nothing else parses a body.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::package::Skill;
use super::store::{self, JobRecord};

/// A refusal: HTTP status and the `detail` of `{"detail": ...}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub detail: Value,
}

impl ApiError {
    pub fn new(status: u16, detail: impl Into<String>) -> ApiError {
        ApiError { status, detail: Value::String(detail.into()) }
    }

    /// FastAPI's request-validation shape (422).
    pub fn field(kind: &str, loc: &[&str], msg: &str) -> ApiError {
        ApiError { status: 422, detail: json!([{"type": kind, "loc": loc, "msg": msg}]) }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.detail {
            Value::String(s) => write!(f, "{s}"),
            other => write!(f, "{other}"),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// The body of `POST /v1/jobs`, checked as FastAPI checks it (422).
pub struct CreateRequest {
    pub skill_id: String,
    pub engine: String,
    pub input: Map<String, Value>,
    pub parameter: Map<String, Value>,
    pub model: Option<String>,
    pub runtime_options: Map<String, Value>,
}

impl CreateRequest {
    /// The body of `POST /v1/temp-skill-runs`: the same without
    /// `skill_id` (the package names it).
    pub fn parse_temp(body: &Value) -> ApiResult<CreateRequest> {
        let mut with_id = body.clone();
        if let Some(obj) = with_id.as_object_mut() {
            obj.insert("skill_id".into(), Value::String(String::new()));
        }
        CreateRequest::parse(&with_id)
    }

    /// A new record for this request, not started.
    pub fn into_record(self, skill_id: String, runtime_options: Map<String, Value>, temp: bool) -> JobRecord {
        let now = store::now();
        JobRecord {
            request_id: uuid::Uuid::new_v4().to_string(),
            skill_id,
            engine: self.engine,
            input: self.input,
            parameter: self.parameter,
            model: self.model,
            runtime_options,
            created_at: now.clone(),
            updated_at: now,
            run_id: None,
            status: None,
            warnings: Vec::new(),
            error: None,
            cancel_requested: false,
            temp,
            recovery_state: None,
            recovered_at: None,
            recovery_reason: None,
            cache_hit: false,
            cache_key: None,
            interaction: None,
        }
    }

    pub fn parse(body: &Value) -> ApiResult<CreateRequest> {
        let Some(obj) = body.as_object() else {
            return Err(ApiError::field(
                "model_attributes_type",
                &["body"],
                "Input should be a valid dictionary or object to extract fields from",
            ));
        };
        let string = |key: &str| -> ApiResult<Option<String>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => {
                    Err(ApiError::field("string_type", &["body", key], "Input should be a valid string"))
                }
            }
        };
        let object = |key: &str| -> ApiResult<Map<String, Value>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(Map::new()),
                Some(Value::Object(m)) => Ok(m.clone()),
                Some(_) => {
                    Err(ApiError::field("dict_type", &["body", key], "Input should be a valid dictionary"))
                }
            }
        };
        let skill_id = match obj.get("skill_id") {
            None => return Err(ApiError::field("missing", &["body", "skill_id"], "Field required")),
            Some(_) => string("skill_id")?.ok_or_else(|| {
                ApiError::field("string_type", &["body", "skill_id"], "Input should be a valid string")
            })?,
        };
        Ok(CreateRequest {
            skill_id,
            engine: string("engine")?.unwrap_or_else(|| "codex".into()),
            input: object("input")?,
            parameter: object("parameter")?,
            model: string("model")?,
            runtime_options: object("runtime_options")?,
        })
    }
}

/// Upstream's engine policy for one request (400 `SKILL_ENGINE_UNSUPPORTED`).
pub fn check_engine(skill: &Skill, engine: &str) -> ApiResult<()> {
    if skill.effective_engines.iter().any(|e| e == engine) {
        return Ok(());
    }
    Err(ApiError {
        status: 400,
        detail: json!({
            "code": "SKILL_ENGINE_UNSUPPORTED",
            "message": format!("Skill '{}' does not support engine '{engine}'", skill.id),
            "declared_engines": skill.engines,
            "unsupported_engines": skill.unsupported_engines,
            "effective_engines": skill.effective_engines,
            "requested_engine": engine,
        }),
    })
}

/// The (normalized) `execution_mode` against the skill's modes: 400
/// `SKILL_EXECUTION_MODE_UNSUPPORTED` when the skill does not declare it.
pub fn check_mode(skill: &Skill, options: &Map<String, Value>) -> ApiResult<()> {
    let mode = options.get("execution_mode").and_then(Value::as_str).unwrap_or("auto");
    if skill.execution_modes.iter().any(|m| m == mode) {
        return Ok(());
    }
    Err(ApiError {
        status: 400,
        detail: json!({
            "code": "SKILL_EXECUTION_MODE_UNSUPPORTED",
            "message": format!("Skill '{}' does not support execution_mode '{mode}'", skill.id),
            "declared_execution_modes": skill.execution_modes,
            "requested_execution_mode": mode,
        }),
    })
}

/// Whether the (normalized) options ask for an interactive job.
pub fn is_interactive(options: &Map<String, Value>) -> bool {
    options.get("execution_mode").and_then(Value::as_str) == Some("interactive")
}

/// A JSON value as Python's `bool()` of its decoded form: false for
/// `null`, `false`, `0`, `""`, `[]` and `{}`.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Upstream's runtime-options policy: known keys, their types, defaults;
/// `hard_timeout_seconds` only below the server's `job_timeout`. Like
/// upstream, the flags `verbose`, `no_cache`, `debug` and
/// `debug_keep_temp` take any value (its own e2e runner sends `verbose` as
/// a count) and are read as Python truth values ([`truthy`]).
pub fn runtime_options(given: &Map<String, Value>, job_timeout: Duration) -> ApiResult<Map<String, Value>> {
    const FLAGS: [&str; 4] = ["verbose", "no_cache", "debug", "debug_keep_temp"];
    const BOOLS: [&str; 1] = ["interactive_require_user_reply"];
    const POSITIVE: [&str; 5] = [
        "session_timeout_sec",
        "interactive_wait_timeout_sec",
        "hard_wait_timeout_sec",
        "wait_timeout_sec",
        "hard_timeout_seconds",
    ];
    let mut unknown: Vec<&str> = given
        .keys()
        .map(String::as_str)
        .filter(|k| {
            !FLAGS.contains(k) && !BOOLS.contains(k) && !POSITIVE.contains(k) && *k != "execution_mode"
        })
        .collect();
    if !unknown.is_empty() {
        unknown.sort();
        return Err(ApiError::new(400, format!("Unknown runtime_options: {}", unknown.join(", "))));
    }
    let mut out = given.clone();
    for (k, v) in given {
        if BOOLS.contains(&k.as_str()) {
            if !v.is_boolean() {
                return Err(ApiError::new(400, format!("runtime_options.{k} must be a boolean")));
            }
        } else if POSITIVE.contains(&k.as_str()) {
            if v.as_u64().is_none_or(|n| n == 0) {
                return Err(ApiError::new(400, format!("runtime_options.{k} must be a positive integer")));
            }
        } else if k == "execution_mode" && !matches!(v.as_str(), Some("auto" | "interactive")) {
            return Err(ApiError::new(
                400,
                "runtime_options.execution_mode must be one of: auto, interactive",
            ));
        }
    }
    if let Some(seconds) = given.get("hard_timeout_seconds").and_then(Value::as_u64)
        && Duration::from_secs(seconds) >= job_timeout
    {
        return Err(ApiError::new(
            400,
            format!(
                "runtime_options.hard_timeout_seconds must be less than the server's job timeout ({} seconds)",
                job_timeout.as_secs_f64()
            ),
        ));
    }
    out.entry("execution_mode").or_insert_with(|| json!("auto"));
    out.entry("session_timeout_sec").or_insert_with(|| json!(1200));
    Ok(out)
}

/// The body of `POST /v1/jobs/{id}/interaction/reply`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplyRequest {
    pub interaction_id: i64,
    pub response: Value,
    pub idempotency_key: Option<String>,
}

impl ReplyRequest {
    /// Checked as pydantic checks upstream's model: `interaction_id` an
    /// integer (a string of digits too, as its lax mode takes it),
    /// `response` present (any value), `idempotency_key` a string or null.
    pub fn parse(body: &Value) -> ApiResult<ReplyRequest> {
        let Some(obj) = body.as_object() else {
            return Err(ApiError::field(
                "model_attributes_type",
                &["body"],
                "Input should be a valid dictionary or object to extract fields from",
            ));
        };
        let interaction_id = match obj.get("interaction_id") {
            None => return Err(ApiError::field("missing", &["body", "interaction_id"], "Field required")),
            Some(v) => lax_int(v).ok_or_else(|| {
                ApiError::field(
                    "int_parsing",
                    &["body", "interaction_id"],
                    "Input should be a valid integer, unable to parse string as an integer",
                )
            })?,
        };
        let Some(response) = obj.get("response") else {
            return Err(ApiError::field("missing", &["body", "response"], "Field required"));
        };
        let idempotency_key = match obj.get("idempotency_key") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(ApiError::field(
                    "string_type",
                    &["body", "idempotency_key"],
                    "Input should be a valid string",
                ));
            }
        };
        Ok(ReplyRequest { interaction_id, response: response.clone(), idempotency_key })
    }
}

/// An integer as pydantic's lax mode reads one: a JSON integer, a float
/// with no fraction, or a string of digits (with an optional sign).
fn lax_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => {
            n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64))
        }
        Value::String(s) => {
            let t = s.trim();
            let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
            if digits.is_empty() || digits.len() > 18 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            t.parse().ok()
        }
        _ => None,
    }
}

/// The query of `GET /v1/jobs/{id}/events`: where the client's copy of
/// each log ends (`stdout_from`, `stderr_from`, bytes, default 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventsQuery {
    pub stdout_from: u64,
    pub stderr_from: u64,
}

impl EventsQuery {
    /// Parses the raw query string; an offset that is not a non-negative
    /// integer is FastAPI's 422 for that query parameter. Other
    /// parameters are ignored, as FastAPI ignores them.
    pub fn parse(query: Option<&str>) -> ApiResult<EventsQuery> {
        let mut out = EventsQuery::default();
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match key {
                "stdout_from" => &mut out.stdout_from,
                "stderr_from" => &mut out.stderr_from,
                _ => continue,
            };
            *slot = match value.parse::<i64>() {
                Ok(n) if n >= 0 => n as u64,
                Ok(_) => {
                    return Err(ApiError::field(
                        "greater_than_equal",
                        &["query", key],
                        "Input should be greater than or equal to 0",
                    ));
                }
                Err(_) => {
                    return Err(ApiError::field(
                        "int_parsing",
                        &["query", key],
                        "Input should be a valid integer, unable to parse string as an integer",
                    ));
                }
            };
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reply_bodies() {
        let ok = ReplyRequest::parse(&json!({"interaction_id": "3", "response": {"a": 1}})).unwrap();
        assert_eq!((ok.interaction_id, ok.response, ok.idempotency_key), (3, json!({"a": 1}), None));
        let ok =
            ReplyRequest::parse(&json!({"interaction_id": 2.0, "response": null, "idempotency_key": "k"}))
                .unwrap();
        assert_eq!((ok.interaction_id, ok.idempotency_key.as_deref()), (2, Some("k")));
        let loc = |body: Value| ReplyRequest::parse(&body).unwrap_err().detail[0]["loc"].clone();
        assert_eq!(loc(json!({"response": 1})), json!(["body", "interaction_id"]));
        assert_eq!(loc(json!({"interaction_id": 1})), json!(["body", "response"]));
        assert_eq!(loc(json!({"interaction_id": "x", "response": 1})), json!(["body", "interaction_id"]));
        assert_eq!(loc(json!({"interaction_id": 1.5, "response": 1})), json!(["body", "interaction_id"]));
        assert_eq!(
            loc(json!({"interaction_id": 1, "response": 1, "idempotency_key": 5})),
            json!(["body", "idempotency_key"])
        );
        assert_eq!(ReplyRequest::parse(&json!([1])).unwrap_err().status, 422);
    }

    #[test]
    fn events_queries() {
        assert_eq!(EventsQuery::parse(None).unwrap(), EventsQuery::default());
        let q = EventsQuery::parse(Some("stdout_from=10&x=y&stderr_from=0")).unwrap();
        assert_eq!((q.stdout_from, q.stderr_from), (10, 0));
        assert_eq!(EventsQuery::parse(Some("stdout_from=-1")).unwrap_err().status, 422);
        assert_eq!(EventsQuery::parse(Some("stderr_from=abc")).unwrap_err().status, 422);
    }
}
