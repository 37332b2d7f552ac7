//! The daemon under faults (docs/reliability.md, "Fault matrix"): the real
//! daemon binary, the real native sandbox and the scripted agent
//! (tests/fixtures/scripted_agent.py), driven by the fake backend of
//! tests/proxy_support: restarts and kills of the daemon, expiry, full
//! disks, unwritable state, agents that ignore end-of-file.

mod proxy_support;

use std::path::Path;
use std::time::Duration;

use proxy_support::agent::{acp_config, agent_dir, chunks, prompt};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use serde_json::{Value, json};

/// How the scripted agent behaves when its stdin ends.
#[derive(Clone, Copy, Debug)]
enum OnEof {
    Exit,
    /// Keeps running (claude-code-acp does), and ignores SIGTERM too.
    Ignore,
}

/// A config running the scripted agent with `on_eof`, tagged with a
/// marker unique to this scratch directory (to find its processes).
fn agent_config(s: &Scratch, url: &str, on_eof: OnEof, extra: &str) -> String {
    let dir = agent_dir(s);
    let mut argv = vec!["python3".to_string(), "/agent/scripted_agent.py".into(), format!("--marker={}", marker(s))];
    if let OnEof::Ignore = on_eof {
        argv.extend(["--ignore-eof".into(), "--ignore-term".into()]);
    }
    let argv: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    s.config(
        url,
        &format!("agent_command = [{}]\nagent_shutdown_grace_seconds = 1\n{extra}", argv.join(", ")),
        &format!(
            "terminalEnabled = true\n[[sandbox.volumes]]\nhostPath = \"{}\"\nguestPath = \"/agent\"\nreadOnly = true\n",
            dir.display()
        ),
    )
}

fn marker(s: &Scratch) -> String {
    format!("m{}", s.dir.file_name().unwrap().to_string_lossy())
}

/// Host pids of the processes whose command line carries the marker.
fn agent_pids(s: &Scratch) -> Vec<u32> {
    let marker = format!("--marker={}", marker(s));
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == marker.as_bytes()))
        })
        .filter(|pid| {
            // A zombie has ended.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|st| st.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
        })
        .collect()
}

/// Waits until no process of the agent is left; panics after `timeout`.
async fn agents_gone(s: &Scratch, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = agent_pids(s);
        if left.is_empty() {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "agent processes still running after {timeout:?}: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn types_of(b: &Backend, conn: usize) -> Vec<String> {
    b.of_conn(conn).iter().map(|m| m["type"].as_str().unwrap_or("?").to_string()).collect()
}

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

/// SIGTERM mid-prompt: the agents are closed while the link is still up,
/// so the interrupted prompt's result and the agent's exit reach the
/// backend before the close; nothing is reported lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_agents_then_flushes_then_closes_the_link() {
    for on_eof in [OnEof::Exit, OnEof::Ignore] {
        let backend = Backend::start().await;
        let s = Scratch::new("sigterm");
        let mut daemon = Daemon::start(&s, "proxy", &agent_config(&s, &backend.url, on_eof, ""));
        backend.registered(0, 20 * SECS).await;
        let opened = open_with(&backend, "t1", init(json!([])), 600).await;
        assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
        backend.send(&json!({"type":"prompt_send","run_id":"t1","prompt_id":"p1","session_id":null,
            "prompt":[{"type":"text","text":"say started\nsleep 60"}],"timeout_ms":120000}));
        backend
            .wait_for("the prompt is running", 30 * SECS, |_| chunks(&backend, "p1") == ["started"])
            .await;
        assert!(daemon.stop().success(), "{}", daemon.stderr());
        let t = types_of(&backend, 0);
        let result = backend
            .of_conn(0)
            .into_iter()
            .find(|m| m["type"] == "prompt_result" && m["prompt_id"] == "p1")
            .unwrap_or_else(|| panic!("{on_eof:?}: the interrupted prompt's result was lost: {t:?}\n{}", daemon.stderr()));
        assert_eq!(result["ok"], false, "{result}");
        assert!(
            backend.of_conn(0).iter().any(|m| m["content"]["type"] == "transport_disconnected"),
            "{on_eof:?}: the agent's exit was lost: {t:?}"
        );
        let log = daemon.stderr();
        assert!(!log.contains("lost with this shutdown"), "{on_eof:?}: {log}");
        assert!(agent_pids(&s).is_empty(), "{on_eof:?}: the agent outlived the daemon");
    }
}
