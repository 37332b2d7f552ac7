//! Nested sandboxes through the daemon (docs/security.md, "Nested sandboxes"):
//! a run on the native provider whose agent runs `bwrap` itself, with the
//! daemon as root, as uid 65534 and nested in `unshare -U -r`. The agent is the
//! fake one (tests/fake/agent.rs); its `run` command starts
//! the stand-in of tests/fixtures/nested/ as the agent's own child process.

mod nested_support;
mod proxy_support;

use proxy_support::agent::{acp_config, agent_dir, prompt, reports};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use serde_json::json;

async fn stand_in_through_the_daemon(caller: &str) {
    let backend = Backend::start().await;
    let s = Scratch::new(&format!("nested-{caller}"));
    let cfg = acp_config(&s, &backend.url, "", "");
    // The stand-in sits next to the fake agent (at /agent, read-only).
    nested_support::install(&agent_dir(&s).join("nested"));
    let uid = if caller == "root" { 0 } else { 65534 };
    let run = format!("n-{caller}");
    let ws = s.root.join(format!("run-{run}"));
    std::fs::create_dir_all(&ws).unwrap();
    nested_support::prepare_workspace(&ws, uid);
    let mut daemon = match caller {
        "root" => Daemon::start(&s, "proxy", &cfg),
        _ => Daemon::start_unprivileged(&s, "proxy", &cfg, caller == "nested"),
    };
    backend.registered(0, 20 * SECS).await;

    let init = json!({"script": "", "timeout_seconds": 30, "env": {},
        "agentInputs": {"version": 1, "items": [
            {"id": "note", "apply": "writeFile", "source": {"type": "inlineText", "text": "x"},
             "target": {"root": "WORKSPACE", "path": "note.txt"}}]}});
    backend.send(&json!({"type":"acp_open","run_id":run,"cwd":"/workspace","init":init,
        "instance_name":format!("tuixiu-run-{run}"),"keepalive_ttl_seconds":600}));
    let opened = backend.wait_type("acp_opened", "run_id", &json!(run), 60 * SECS).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());

    let token = format!("nested-daemon-{}-{caller}", std::process::id());
    let script = format!("run sh /agent/nested/agent.sh /workspace {token}");
    let r = prompt(&backend, &run, "p1", serde_json::Value::Null, &script).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    let report = &reports(&backend, "p1")[0];
    assert_eq!(report["code"], 0, "{report}");
    let seen = nested_support::observations(report["stdout"].as_str().unwrap());
    nested_support::assert_codex_and_sandbox_runtime(&seen, &ws, uid);
    assert!(daemon.stop().success(), "{}", daemon.stderr());
    nested_support::assert_nothing_left_running(&token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_run_serves_its_agents_bwrap_as_root() {
    stand_in_through_the_daemon("root").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_run_serves_its_agents_bwrap_unprivileged() {
    stand_in_through_the_daemon("unprivileged").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_run_serves_its_agents_bwrap_nested() {
    stand_in_through_the_daemon("nested").await;
}
