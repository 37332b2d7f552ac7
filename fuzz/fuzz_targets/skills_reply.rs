//! The requests and answers of interactive skill jobs: a reply body
//! (`POST .../interaction/reply`, `protocol::ReplyRequest::parse`), an
//! events query (`GET .../events`, `protocol::EventsQuery::parse`), what
//! an engine printed as its turn's answer (`interaction::interpret`), and
//! a reply judged against a job's interaction state (`interaction::judge`).
//!
//! The input is four sections separated by lines `----`: the reply body,
//! the query string, the engine's answer (JSON text), and the state (the
//! `interaction` of a job record, JSON; its first byte past the JSON
//! picks the job's status).
//!
//! Checked: no panic; refusals are FastAPI's 422 list (body or query) or
//! a 409 with one of upstream's texts; a question is normalized (positive
//! id, one of the five kinds, a trimmed prompt, labelled options) and
//! normalizing it again changes nothing; a reply is taken only by a job
//! waiting on that very question, replayed only for the same key and
//! response; the line a sticky engine reads is one line that gives the
//! reply back; the cache's stable JSON is ASCII and parses to the value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use tuixiu_sandbox::skills::cache::stable_json;
use tuixiu_sandbox::skills::interaction::{self, Turn, Verdict};
use tuixiu_sandbox::skills::protocol::{EventsQuery, ReplyRequest};
use tuixiu_sandbox::skills::store::{InteractionState, Profile, Status, TakenReply};

const STATUSES: [Status; 6] =
    [Status::Queued, Status::Running, Status::WaitingUser, Status::Succeeded, Status::Failed, Status::Canceled];
const CONFLICTS: [&str; 6] = [
    "idempotency_key already used with different response",
    "sticky process lost",
    "interaction wait timeout",
    "Run is not waiting for user interaction",
    "No pending interaction",
    "stale interaction",
];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut sections = text.split("\n----\n");
    let mut next = || sections.next().unwrap_or("");
    let (body, query, answer, state) = (next(), next(), next(), next());

    let reply = match serde_json::from_str::<Value>(body) {
        Ok(body) => match ReplyRequest::parse(&body) {
            Ok(reply) => Some(reply),
            Err(e) => {
                assert_eq!(e.status, 422);
                assert_eq!(e.detail[0]["loc"][0], "body", "{}", e.detail);
                None
            }
        },
        Err(_) => None,
    };

    if let Err(e) = EventsQuery::parse(Some(query)) {
        assert_eq!((e.status, e.detail[0]["loc"][0].clone()), (422, json!("query")), "{}", e.detail);
    }

    if let Ok(answer) = serde_json::from_str::<Value>(answer) {
        let ascii = stable_json(&answer);
        assert!(ascii.is_ascii(), "{ascii}");
        assert_eq!(serde_json::from_str::<Value>(&ascii).unwrap(), answer);
        if let Turn::Ask(p) = interaction::interpret(answer) {
            check_question(&p);
            let again = interaction::pending_of(&json!({"ask_user": p})).expect("a normalized question asks");
            assert_eq!(again, p, "normalizing twice changed the question");
        }
    }

    let (state_json, pick) = match state.rfind('}') {
        Some(end) => (&state[..=end], state.as_bytes().get(end + 1).copied().unwrap_or(0)),
        None => (state, 0),
    };
    let Some(reply) = reply else { return };
    let state = serde_json::from_str::<InteractionState>(state_json)
        .unwrap_or_else(|_| InteractionState::new(Profile::Resumable));
    let status = STATUSES[usize::from(pick) % STATUSES.len()];
    let code = ["INTERACTION_PROCESS_LOST", "INTERACTION_WAIT_TIMEOUT", "TIMEOUT"].get(usize::from(pick) / 6 % 4);
    match interaction::judge(Some(status), code.copied(), &state, &reply) {
        Ok(Verdict::Take) => {
            assert_eq!(status, Status::WaitingUser);
            assert_eq!(state.pending_id(), Some(reply.interaction_id));
            let taken = TakenReply {
                interaction_id: reply.interaction_id,
                idempotency_key: reply.idempotency_key.clone(),
                response: reply.response.clone(),
                resolution_mode: "user_reply".into(),
                resolved_at: String::new(),
            };
            let line = interaction::sticky_line(&taken);
            assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'), "{line:?}");
            let back: Value = serde_json::from_str(&line).unwrap();
            assert_eq!((back["interaction_id"].as_i64(), &back["response"]), (Some(reply.interaction_id), &reply.response));
        }
        Ok(Verdict::Replay) => {
            let key = reply.idempotency_key.as_ref().expect("a replay has a key");
            assert!(state.replies.iter().any(|r| r.interaction_id == reply.interaction_id
                && r.idempotency_key.as_ref() == Some(key)
                && r.response == reply.response));
        }
        Err(e) => {
            assert_eq!(e.status, 409);
            assert!(CONFLICTS.contains(&e.detail.as_str().unwrap_or_default()), "{}", e.detail);
        }
    }
});

/// A question as upstream normalizes it.
fn check_question(p: &Value) {
    assert!(p["interaction_id"].as_i64().is_some_and(|id| id > 0), "{p}");
    let kinds = ["choose_one", "confirm", "fill_fields", "open_text", "risk_ack"];
    assert!(kinds.contains(&p["kind"].as_str().unwrap()), "{p}");
    let prompt = p["prompt"].as_str().unwrap();
    assert!(!prompt.is_empty() && prompt.trim() == prompt, "{p}");
    for o in p["options"].as_array().unwrap() {
        assert!(!o["label"].as_str().unwrap().trim().is_empty(), "{p}");
    }
    assert!(p["ui_hints"].is_object() && p["required_fields"].is_array(), "{p}");
}
