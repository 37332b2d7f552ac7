//! Interactive skill jobs and live events over HTTP, against the real
//! `skills serve` with the stub engine in the sandbox: a resumable engine
//! (`command`: asks and exits, run again with the reply and the session
//! it named) and a sticky one (`sticky`: keeps running in its sandbox and
//! reads the reply on stdin). Ask, pending, reply, stale ids, idempotency
//! keys, the wait timeout, cancel and restarts while waiting, and the
//! server-sent events of a job.

mod common;
mod inputs_support;
mod skills_support;

use std::time::{Duration, Instant};

use common::Caller;
use serde_json::{Value, json};
use skills_support::{Env, processes_with};

fn interactive() -> Value {
    json!({"execution_mode": "interactive"})
}

/// The events of an SSE body, as (name, data).
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|frame| {
            let name = frame.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_default();
            let data = frame.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("null");
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

/// Waits until the job's record on disk says `status` (what a restart
/// finds).
fn wait_on_disk(env: &Env, rid: &str, status: &str, pending: i64) {
    let path = env.data.join(format!("jobs/{rid}.json"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        if record["status"] == status && record["interaction"]["pending"]["interaction_id"] == pending {
            return;
        }
        assert!(Instant::now() < deadline, "{record}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn home_exists(env: &Env, rid: &str) -> bool {
    env.run_dir(rid).join("home").exists()
}

#[test]
fn resumable_engine_asks_and_is_run_again_with_the_reply() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let rid = server.start_demo("command", "ask", "which format", interactive());
    let status = server.wait_status(&rid, "waiting_user");
    assert_eq!(
        (status["pending_interaction_id"].clone(), status["interaction_count"].clone()),
        (json!(1), json!(1))
    );

    let pending = server.get(&format!("/v1/jobs/{rid}/interaction/pending")).json();
    assert_eq!(pending["status"], "waiting_user");
    assert_eq!(
        pending["pending"],
        json!({"interaction_id": 1, "kind": "choose_one", "prompt": "Which format?",
               "options": [{"label": "Markdown", "value": "md"}, {"label": "Text", "value": "txt"}],
               "ui_hints": {}, "default_decision_policy": "engine_judgement", "required_fields": [], "context": null})
    );
    let result = server.get(&format!("/v1/jobs/{rid}/result")).json()["result"].clone();
    assert_eq!(result["status"], "waiting_user");
    assert_eq!(result["pending_interaction"]["interaction_id"], 1);
    assert_eq!(result["interactive_profile"]["kind"], "resumable");
    let r = server.get(&format!("/v1/jobs/{rid}/bundle"));
    assert_eq!((r.status, r.detail()), (409, json!("Run is not finished yet")));
    // Nothing runs while it waits; the session is in the run's home.
    assert!(home_exists(&env, &rid));

    let r = server.reply(&rid, json!({"interaction_id": 2, "response": "md"}));
    assert_eq!((r.status, r.detail()), (409, json!("stale interaction")));
    let r = server.reply(&rid, json!({"interaction_id": 1}));
    assert_eq!(r.status, 422, "{}", r.text());
    let r = server.reply(&rid, json!({"interaction_id": 1, "response": "md", "idempotency_key": "k1"}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"request_id": rid, "status": "queued", "accepted": true}));
    // The same reply again is accepted and changes nothing; another
    // response under the same key is refused.
    let r = server.reply(&rid, json!({"interaction_id": 1, "response": "md", "idempotency_key": "k1"}));
    assert_eq!((r.status, r.json()["accepted"].clone()), (200, json!(true)));
    let r = server.reply(&rid, json!({"interaction_id": 1, "response": "txt", "idempotency_key": "k1"}));
    assert_eq!((r.status, r.detail()), (409, json!("idempotency_key already used with different response")));

    let status = server.wait(&rid);
    assert_eq!(status["status"], "succeeded", "{status}\n{}", env.server_log());
    assert_eq!(status["pending_interaction_id"], Value::Null);
    let summary = server.get(&format!("/v1/jobs/{rid}/artifacts/artifacts/summary.md")).text();
    assert!(summary.contains("query: which format") && summary.contains("reply: md"), "{summary}");
    assert_eq!(server.get(&format!("/v1/jobs/{rid}/artifacts/artifacts/replies")).text(), "md\n");
    let logs = server.get(&format!("/v1/jobs/{rid}/logs")).json();
    assert_eq!(logs["prompt"], "md", "the resumed turn's prompt is the reply");
    assert!(logs["stderr"].as_str().unwrap().contains("asked stub-"), "{logs}");
    assert!(!home_exists(&env, &rid), "the home is removed once the job ends");
    let r = server.reply(&rid, json!({"interaction_id": 1, "response": "again"}));
    assert_eq!((r.status, r.detail()), (409, json!("Run is not waiting for user interaction")));

    // A resumable engine that names no session cannot be resumed.
    let anonymous = server.start_demo("command", "ask-anonymous", "anonymous", interactive());
    let status = server.wait(&anonymous);
    assert_eq!(
        (status["status"].clone(), status["error"]["code"].clone()),
        (json!("failed"), json!("SESSION_RESUME_FAILED"))
    );

    // An auto job has no interaction endpoints.
    let auto = server.start_demo("command", "ok", "auto", json!({}));
    let r = server.get(&format!("/v1/jobs/{auto}/interaction/pending"));
    let refusal = json!("Interaction endpoints require runtime_options.execution_mode=interactive");
    assert_eq!((r.status, r.detail()), (400, refusal.clone()));
    let r = server.reply(&auto, json!({"interaction_id": 1, "response": "x"}));
    assert_eq!((r.status, r.detail()), (400, refusal));
}

#[test]
fn a_waiting_resumable_job_survives_a_restart() {
    let env = Env::new(Caller::Root);
    let mut server = env.serve(&[]);
    let rid = server.start_demo("command", "ask", "twice", interactive());
    server.wait_status(&rid, "waiting_user");
    let r = server.reply(&rid, json!({"interaction_id": 1, "response": "again", "idempotency_key": "a"}));
    assert_eq!(r.status, 200, "{}", r.text());
    wait_on_disk(&env, &rid, "waiting_user", 2);
    server.crash();

    let server = env.serve(&[]);
    let status = server.wait_status(&rid, "waiting_user");
    assert_eq!(status["recovery_state"], "recovered_waiting");
    assert_eq!(
        (status["pending_interaction_id"].clone(), status["interaction_count"].clone()),
        (json!(2), json!(2))
    );
    // The earlier reply's key still answers as a replay.
    let r = server.reply(&rid, json!({"interaction_id": 1, "response": "again", "idempotency_key": "a"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = server.reply(&rid, json!({"interaction_id": 2, "response": "txt"}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(server.wait(&rid)["status"], "succeeded", "{}", env.server_log());
    assert_eq!(server.get(&format!("/v1/jobs/{rid}/artifacts/artifacts/replies")).text(), "again\ntxt\n");
}

#[test]
fn sticky_engine_waits_in_its_sandbox_and_reads_the_reply() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let marker = format!("sticky-marker-{}", std::process::id());
    let rid = server.start_demo("sticky", "sticky-ask", &marker, interactive());
    let status = server.wait_status(&rid, "waiting_user");
    assert_eq!(status["pending_interaction_id"], 1);
    let pending = server.get(&format!("/v1/jobs/{rid}/interaction/pending")).json();
    assert_eq!(
        (pending["pending"]["kind"].clone(), pending["pending"]["prompt"].clone()),
        (json!("confirm"), json!("Go on?"))
    );
    // The engine is still running, in its sandbox, while the job waits.
    assert!(!processes_with(&marker).is_empty(), "the sticky engine should be alive");
    let r =
        server.reply(&rid, json!({"interaction_id": 1, "response": {"ok": true}, "idempotency_key": "s1"}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "running");
    let status = server.wait(&rid);
    assert_eq!(status["status"], "succeeded", "{status}\n{}", env.server_log());
    let get = |name: &str| server.get(&format!("/v1/jobs/{rid}/artifacts/artifacts/{name}")).text();
    assert_eq!(get("replies"), "{\"interaction_id\":1,\"response\":{\"ok\":true}}\n");
    assert_eq!(get("asked-pid"), get("answered-pid"), "one process asked and answered");
    let result = server.get(&format!("/v1/jobs/{rid}/result")).json()["result"].clone();
    assert_eq!(result["data"]["summary_path"], "/workspace/artifacts/summary.md");
    assert_eq!(result["interactive_profile"]["kind"], "sticky_process");
    let r =
        server.reply(&rid, json!({"interaction_id": 1, "response": {"ok": true}, "idempotency_key": "s1"}));
    assert_eq!(r.status, 200, "a replay after the end: {}", r.text());
    assert!(processes_with(&marker).is_empty());
}

#[test]
fn sticky_engine_lost_while_waiting() {
    let env = Env::new(Caller::Root);
    let mut server = env.serve(&[]);
    // The engine asks and exits instead of waiting.
    let rid = server.start_demo("sticky", "sticky-exit", "gone", interactive());
    let status = server.wait(&rid);
    assert_eq!(status["status"], "failed");
    assert_eq!(status["error"]["code"], "INTERACTION_PROCESS_LOST", "{status}");
    let r = server.reply(&rid, json!({"interaction_id": 1, "response": "yes"}));
    assert_eq!((r.status, r.detail()), (409, json!("sticky process lost")));

    // A server restart kills the waiting engine with it (as upstream).
    let marker = format!("sticky-restart-{}", std::process::id());
    let rid = server.start_demo("sticky", "sticky-ask", &marker, interactive());
    wait_on_disk(&env, &rid, "waiting_user", 1);
    server.crash();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "left running: {:?}", processes_with(&marker));
        std::thread::sleep(Duration::from_millis(20));
    }
    let server = env.serve(&[]);
    let status = server.get(&format!("/v1/jobs/{rid}")).json();
    assert_eq!(status["status"], "failed");
    assert_eq!(status["error"]["code"], "INTERACTION_PROCESS_LOST");
    assert_eq!(status["recovery_state"], "failed_reconciled");
    let r = server.reply(&rid, json!({"interaction_id": 1, "response": "yes"}));
    assert_eq!((r.status, r.detail()), (409, json!("sticky process lost")));
}

#[test]
fn unanswered_questions_time_out() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--kill-grace", "1s"]);
    let short = json!({"execution_mode": "interactive", "session_timeout_sec": 1});
    let marker = format!("sticky-timeout-{}", std::process::id());
    let resumable = server.start_demo("command", "ask", "timeout", short.clone());
    let sticky = server.start_demo("sticky", "sticky-ask", &marker, short.clone());
    for rid in [&resumable, &sticky] {
        let status = server.wait(rid);
        assert_eq!(status["status"], "failed", "{status}");
        assert_eq!(status["error"]["code"], "INTERACTION_WAIT_TIMEOUT", "{status}");
        let r = server.reply(rid, json!({"interaction_id": 1, "response": "late"}));
        assert_eq!((r.status, r.detail()), (409, json!("interaction wait timeout")));
        assert!(!home_exists(&env, rid));
        let result = server.get(&format!("/v1/jobs/{rid}/result")).json();
        assert_eq!(result["result"]["error"]["code"], "INTERACTION_WAIT_TIMEOUT", "{result}");
    }
    assert!(processes_with(&marker).is_empty());

    // Without `interactive_require_user_reply`, the server decides: the
    // engine gets upstream's auto-decision reply and finishes.
    let auto = json!({"execution_mode": "interactive", "session_timeout_sec": 1, "interactive_require_user_reply": false});
    let rid = server.start_demo("command", "ask", "decide", auto.clone());
    let status = server.wait(&rid);
    assert_eq!(status["status"], "succeeded", "{status}\n{}", env.server_log());
    assert_eq!(status["auto_decision_count"], 1);
    assert!(status["last_auto_decision_at"].is_string());
    let replies = server.get(&format!("/v1/jobs/{rid}/artifacts/artifacts/replies")).text();
    assert!(replies.contains("\"source\":\"auto_decide_timeout\""), "{replies}");
    let rid = server.start_demo("sticky", "sticky-ask", "decide sticky", auto);
    assert_eq!(server.wait(&rid)["status"], "succeeded", "{}", env.server_log());
}

#[test]
fn cancel_while_waiting() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&["--kill-grace", "1s"]);
    let marker = format!("sticky-cancel-{}", std::process::id());
    let resumable = server.start_demo("command", "ask", "cancel me", interactive());
    let sticky = server.start_demo("sticky", "sticky-ask", &marker, interactive());
    for rid in [&resumable, &sticky] {
        server.wait_status(rid, "waiting_user");
        let c = server.post(&format!("/v1/jobs/{rid}/cancel")).json();
        assert_eq!((c["accepted"].clone(), c["status"].clone()), (json!(true), json!("canceled")));
        let status = server.wait(rid);
        assert_eq!(status["status"], "canceled");
        assert_eq!(status["error"]["code"], "CANCELED_BY_USER");
        let result = server.get(&format!("/v1/jobs/{rid}/result")).json();
        assert_eq!(result["result"]["status"], "canceled");
        assert!(!home_exists(&env, rid));
        let r = server.reply(rid, json!({"interaction_id": 1, "response": "late"}));
        assert_eq!((r.status, r.detail()), (409, json!("Run is not waiting for user interaction")));
    }
    assert!(processes_with(&marker).is_empty(), "{:?}", processes_with(&marker));
}

#[test]
fn events_stream_logs_and_status_until_the_end() {
    let env = Env::new(Caller::Root);
    let server = env.serve(&[]);
    let rid = server.start_demo("command", "ask", "events", interactive());
    server.wait_status(&rid, "waiting_user");
    let r = server.get(&format!("/v1/jobs/{rid}/events"));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let first = events(&r.text());
    let names: Vec<&str> = first.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"snapshot"), "{names:?}");
    assert_eq!(first[0].1["status"], "waiting_user");
    assert_eq!(first[0].1["pending_interaction_id"], 1);
    assert_eq!(&names[names.len() - 2..], ["status", "end"], "{names:?}");
    assert_eq!(first.last().unwrap().1, json!({"reason": "waiting_user"}));
    let stdout: String =
        first.iter().filter(|(n, _)| n == "stdout").map(|(_, d)| d["chunk"].as_str().unwrap()).collect();
    assert!(stdout.contains("\"ask_user\""), "{stdout}");
    let stdout_to =
        first.iter().filter(|(n, _)| n == "stdout").map(|(_, d)| d["to"].as_u64().unwrap()).max().unwrap();
    let stderr_to =
        first.iter().filter(|(n, _)| n == "stderr").map(|(_, d)| d["to"].as_u64().unwrap()).max().unwrap();

    // Resumed from where the client was: only what came after.
    assert_eq!(server.reply(&rid, json!({"interaction_id": 1, "response": "md"})).status, 200);
    let r = server.get(&format!("/v1/jobs/{rid}/events?stdout_from={stdout_to}&stderr_from={stderr_to}"));
    let second = events(&r.text());
    assert_eq!(second[0].1["stdout_offset"], stdout_to);
    let (last_name, last) = second.last().unwrap();
    assert_eq!((last_name.as_str(), last.clone()), ("end", json!({"reason": "terminal"})));
    let statuses: Vec<&Value> =
        second.iter().filter(|(n, _)| n == "status").map(|(_, d)| &d["status"]).collect();
    assert_eq!(statuses.last().unwrap().as_str(), Some("succeeded"), "{second:?}");
    let more: String =
        second.iter().filter(|(n, _)| n == "stdout").map(|(_, d)| d["chunk"].as_str().unwrap()).collect();
    let logs = server.get(&format!("/v1/jobs/{rid}/logs")).json();
    assert_eq!(format!("{stdout}{more}"), logs["stdout"].as_str().unwrap(), "the chunks are the log, once");
    assert!(second.iter().filter(|(n, _)| n == "stdout").all(|(_, d)| d["from"].as_u64() >= Some(stdout_to)));

    let r = server.get(&format!("/v1/jobs/{rid}/events?stdout_from=-1"));
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.detail()[0]["loc"], json!(["query", "stdout_from"]));
    let r = server.get("/v1/jobs/nope/events");
    assert_eq!((r.status, r.detail()), (404, json!("Request not found")));
}
