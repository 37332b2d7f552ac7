//! The daemon under faults (docs/reliability.md, "Fault matrix"): the real
//! daemon binary, the real native sandbox and the scripted agent
//! (tests/fixtures/scripted_agent.py), driven by the fake backend of
//! tests/proxy_support: restarts and kills of the daemon, expiry, full
//! disks, unwritable state, agents that ignore end-of-file.

mod proxy_support;

use std::path::Path;
use std::time::Duration;

use proxy_support::agent::{acp_config, chunks, prompt};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use serde_json::{Value, json};

fn init(items: Value) -> Value {
    json!({"script": "", "timeout_seconds": 30,
           "env": {"TUIXIU_RUN_ID": "x", "USER_HOME": "/home/agent"},
           "agentInputs": {"version": 1, "items": items}})
}

async fn open_with(b: &Backend, run: &str, init: Value, ttl: u64) -> Value {
    b.send(&json!({"type":"acp_open","run_id":run,"cwd":"/workspace","init":init,
        "instance_name":format!("tuixiu-run-{run}"),"keepalive_ttl_seconds":ttl}));
    b.wait_type("acp_opened", "run_id", &json!(run), 60 * SECS).await
}

/// The statuses reported for `run`'s instance so far, in order.
fn statuses(b: &Backend, run: &str) -> Vec<String> {
    b.received()
        .iter()
        .filter(|r| r.msg["type"] == "proxy_update" && r.msg["content"]["type"] == "sandbox_instance_status")
        .filter(|r| r.msg["run_id"] == run)
        .map(|r| r.msg["content"]["status"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// Keepalive expiry removes the instance but keeps the run: the backend,
/// which still holds the run open, sends a plain `prompt_send` (no
/// `init`); a new instance is made, the agent started and the session
/// loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_then_a_plain_prompt_resumes_the_run() {
    let backend = Backend::start().await;
    let s = Scratch::new("ttl-resume");
    let cfg = acp_config(&s, &backend.url, "expire_idle_runs = true", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    let opened = open_with(&backend, "e1", init(json!([])), 2).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
    let r = prompt(&backend, "e1", "p1", Value::Null, "say before").await;
    assert_eq!(r["ok"], true, "{r}");
    let session = r["session_id"].as_str().unwrap().to_string();
    backend
        .wait_for("missing after the TTL", 20 * SECS, |_| {
            statuses(&backend, "e1").last().map(String::as_str) == Some("missing")
        })
        .await;
    assert!(!s.state.join("native/tuixiu-run-e1").exists(), "the instance was removed");
    // What the real backend sends next: no init.
    backend.send(&json!({"type":"prompt_send","run_id":"e1","prompt_id":"p2","session_id":session,
        "cwd":"/workspace","instance_name":"tuixiu-run-e1","keepalive_ttl_seconds":2,
        "prompt":[{"type":"text","text":"say after"}],"timeout_ms":60000}));
    let r = backend.wait_type("prompt_result", "prompt_id", &json!("p2"), 60 * SECS).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    assert_eq!(r["session_id"], session.as_str(), "the session was resumed");
    assert_eq!(chunks(&backend, "p2"), ["after"]);
    assert_eq!(statuses(&backend, "e1").last().map(String::as_str), Some("running"));
    let kept = read_json(&s.state.join("runs/e1.json"));
    assert_eq!(kept["init"]["agentInputs"]["version"], 1, "the run's init is kept: {kept}");
    assert!(daemon.stop().success());
}
