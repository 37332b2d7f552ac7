//! One run cannot stall or steer another (docs/acp.md, "Paths" and
//! "terminal/*"; docs/architecture.md, "Threading"): the real daemon, a
//! fake backend over a real WebSocket, native sandboxes running the
//! fake agent (tests/fake/agent.rs).

mod proxy_support;

use std::time::{Duration, Instant};

use proxy_support::agent::{acp_config, prompt, reports};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use serde_json::{Value, json};

async fn open(b: &Backend, run: &str) -> Value {
    b.send(&json!({"type":"acp_open","run_id":run,"cwd":"/workspace",
        "init":{"script":"","env":{},"agentInputs":{"version":1,"items":[]}},
        "instance_name":format!("tuixiu-run-{run}"),"keepalive_ttl_seconds":600}));
    b.wait_type("acp_opened", "run_id", &json!(run), 60 * SECS).await
}

fn heartbeats_between(b: &Backend, from: Instant, to: Instant) -> Vec<Instant> {
    b.received()
        .iter()
        .filter(|r| r.msg["type"] == "heartbeat")
        .map(|r| r.at)
        .filter(|at| (from..=to).contains(at))
        .collect()
}

/// Run A floods over-long and over-deep writes, writes at the deepest
/// allowed path, and reads a 16 MB file, several requests at a time, while
/// run B prompts one prompt after another: B's prompts and the link's
/// heartbeats (every second) go on as if A were idle, and A gets a clear
/// error for every path over the bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_run_stalls_neither_another_run_nor_the_heartbeats() {
    let b = Backend::start().await;
    let s = Scratch::new("isolation-flood");
    let cfg = acp_config(&s, &b.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    b.registered(0, 20 * SECS).await;
    for run in ["fa", "fb"] {
        assert_eq!(open(&b, run).await["ok"], true, "{}", daemon.stderr());
    }
    let line = "0123456789abcdef".repeat(4) + "\n";
    std::fs::write(s.root.join("run-fa/big.txt"), line.repeat(16_000_000 / line.len())).unwrap();
    assert_eq!(prompt(&b, "fb", "b0", Value::Null, "say warm").await["ok"], true);
    let b_session = b.wait_type("prompt_result", "prompt_id", &json!("b0"), SECS).await["session_id"].clone();

    let long = format!("/workspace/{}f", "d/".repeat(20_000));
    let deep = format!("/workspace/{}f", "d/".repeat(300));
    let deepest = format!("/workspace/{}f", "e/".repeat(254));
    let script = [
        format!("flood 4 4 fs/write_text_file {}", json!({"path": long, "content": "x"})),
        format!("flood 3 4 fs/write_text_file {}", json!({"path": deep, "content": "x"})),
        format!("flood 3 4 fs/write_text_file {}", json!({"path": deepest, "content": "deepest"})),
        format!("flood 4 4 fs/read_text_file {}", json!({"path": "/workspace/big.txt"})),
    ]
    .join("\n");
    b.send(&json!({"type":"prompt_send","run_id":"fa","prompt_id":"a1","session_id":null,"cwd":"/workspace",
        "prompt":[{"type":"text","text":script}],"timeout_ms":120000}));
    let start = Instant::now();
    // B prompts while A floods.
    let mut latencies = Vec::new();
    let mut i = 0;
    while !b.received().iter().any(|r| r.msg["type"] == "prompt_result" && r.msg["prompt_id"] == "a1") {
        i += 1;
        let t = Instant::now();
        let r = prompt(&b, "fb", &format!("b{i}"), b_session.clone(), "say hi").await;
        assert_eq!(r["ok"], true, "{r}");
        latencies.push(t.elapsed());
        assert!(start.elapsed() < Duration::from_secs(120), "A's flood never ended\n{}", daemon.stderr());
    }
    let end = Instant::now();
    let a = b.wait_type("prompt_result", "prompt_id", &json!("a1"), SECS).await;
    assert_eq!(a["ok"], true, "{a}");
    let beats = heartbeats_between(&b, start, end);
    let gaps: Vec<Duration> = beats.windows(2).map(|w| w[1] - w[0]).collect();
    let max_gap = gaps.iter().max().copied().unwrap_or_default();
    let max_latency = latencies.iter().max().copied().unwrap_or_default();
    eprintln!(
        "flood of {:?}: {} prompts of B, slowest {max_latency:?}; {} heartbeats, largest gap {max_gap:?}",
        end - start,
        latencies.len(),
        beats.len()
    );
    // Bounds: a second between heartbeats (two on a machine this loaded),
    // and a prompt of B answered within two seconds.
    assert!(max_gap < Duration::from_millis(2000), "heartbeat gaps {gaps:?}");
    assert!(
        beats.len() as u64 + 1 >= (end - start).as_secs(),
        "{} heartbeats in {:?}",
        beats.len(),
        end - start
    );
    assert!(max_latency < Duration::from_millis(2000), "B's prompt latencies {latencies:?}");
    assert!(latencies.len() >= 5, "B prompted only {} times", latencies.len());

    let rep = reports(&b, "a1");
    assert_eq!(rep.len(), 4, "{rep:#?}");
    for (r, what) in [(&rep[0], "PATH_MAX"), (&rep[1], "more than the 256")] {
        let n = r["n"].as_u64().unwrap();
        assert!(n >= 20, "a refusal must be quick: only {n} in the flood: {r}");
        assert_eq!(r["codes"], json!({"-32602": n}), "{r}");
        assert!(r["message"].as_str().unwrap().contains(what), "{r}");
    }
    assert_eq!(rep[2]["codes"], json!({"ok": rep[2]["n"]}), "{}", rep[2]);
    assert_eq!(std::fs::read_to_string(s.root.join("run-fa").join(&deepest[11..])).unwrap(), "deepest");
    assert!(!s.root.join("run-fa/d").exists(), "nothing of a refused path was made");
    assert_eq!(rep[3]["codes"], json!({"ok": rep[3]["n"]}), "{}", rep[3]);
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}

/// The agent swaps its directory `/workspace/d` with a symlink to `/etc`
/// without pause while it creates terminals there: every terminal starts
/// in the directory it was resolved to (by descriptor), never in `/etc`,
/// or is refused.
async fn cwd_race(b: &Backend, daemon: &Daemon, run: &str, tries: usize) {
    assert_eq!(open(b, run).await["ok"], true, "{}", daemon.stderr());
    let create = json!({"command": "pwd", "args": ["-P"], "cwd": "/workspace/d"});
    let r = prompt(b, run, "race", Value::Null, &format!("cwdrace {tries} 4 {create}")).await;
    assert_eq!(r["ok"], true, "{r}");
    let rep = &reports(b, "race")[0];
    let outputs = rep["outputs"].as_object().unwrap();
    let started: u64 = outputs.values().map(|n| n.as_u64().unwrap()).sum();
    let refused: u64 = rep["codes"].as_object().unwrap().values().map(|n| n.as_u64().unwrap()).sum();
    eprintln!("{run}: {rep}");
    assert_eq!(started + refused, tries as u64, "{rep}");
    for (out, _) in outputs {
        assert!(out == "/workspace/d" || out == "/workspace/l", "a terminal ran in {out:?}: {rep}");
    }
    assert!(started > 0, "no terminal started: {rep}");
    for code in rep["codes"].as_object().unwrap().keys() {
        assert!(code == "-32602" || code == "-32002", "{rep}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_cwd_race_never_lands_outside() {
    let b = Backend::start().await;
    let s = Scratch::new("isolation-cwd");
    let cfg = acp_config(&s, &b.url, "", "");
    let daemon = Daemon::start(&s, "proxy", &cfg);
    b.registered(0, 20 * SECS).await;
    cwd_race(&b, &daemon, "cr", 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_cwd_race_never_lands_outside_for_an_unprivileged_daemon() {
    let b = Backend::start().await;
    let s = Scratch::new("isolation-cwd-user");
    let cfg = acp_config(&s, &b.url, "", "");
    let daemon = Daemon::start_unprivileged(&s, "proxy", &cfg, false);
    b.registered(0, 20 * SECS).await;
    cwd_race(&b, &daemon, "cu", 100).await;
}

/// Permission options are taken as ACP defines them; terminal output that
/// does not fit the run's memory goes to anonymous files; an error names
/// the component that failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_permissions_spilled_output_and_exact_errors() {
    let b = Backend::start().await;
    let s = Scratch::new("isolation-misc");
    let cfg = acp_config(&s, &b.url, "run_terminal_memory_bytes = 0", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    b.registered(0, 20 * SECS).await;
    assert_eq!(open(&b, "m1").await["ok"], true, "{}", daemon.stderr());
    let ask = |options: Value| {
        format!(
            "call session/request_permission {}",
            json!({"toolCall": {"toolCallId": "t"}, "options": options})
        )
    };
    let script = [
        ask(json!([{"optionId": "x", "kind": "allow_everything", "name": "Yes to all"}])),
        ask(json!([{"optionId": "r", "kind": "reject_once"}, {"optionId": "a", "kind": "allow_always"}])),
        ask(json!([{"optionId": "a", "kind": "allow_once"}, {"optionId": "a", "kind": "reject_once"}])),
        ask(json!([{"optionId": 7, "kind": "allow_once"}])),
        r#"term {"command":"head -c 10000000 /dev/zero | tr '\\000' y; echo -n end","outputByteLimit":100000}"#.into(),
        r#"call fs/read_text_file {"path":"/proc/self/status"}"#.into(),
    ]
    .join("\n");
    let r = prompt(&b, "m1", "p1", Value::Null, &script).await;
    assert_eq!(r["ok"], true, "{r}");
    let rep = reports(&b, "p1");
    assert_eq!(rep.len(), 6, "{rep:#?}");
    assert_eq!(rep[0]["result"], json!({"outcome": {"outcome": "cancelled"}}), "an unknown kind is no allow");
    assert_eq!(rep[1]["result"], json!({"outcome": {"outcome": "selected", "optionId": "a"}}));
    assert_eq!(rep[2]["error"]["code"], -32602, "{}", rep[2]);
    assert!(rep[2]["error"]["message"].as_str().unwrap().contains("unique"), "{}", rep[2]);
    assert_eq!(rep[3]["error"]["code"], -32602, "{}", rep[3]);
    let term = &rep[4];
    assert_eq!((term["len"].clone(), term["truncated"].clone()), (json!(100_000), json!(true)), "{term}");
    assert!(term["tail"].as_str().unwrap().ends_with("yyyend"), "{term}");
    let spill = s.state.join("terminals");
    assert!(spill.is_dir(), "the output went to a file");
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "no named file is left");
    // The daemon cannot follow the sandbox's /proc/self (it is not in the
    // sandbox's pid namespace): the error names /proc/self, not /proc.
    let e = &rep[5]["error"];
    assert!(e["message"].as_str().unwrap().starts_with("/proc/self:"), "{e}");
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}

/// The number of message chunks of prompt `id` the backend received.
fn relayed(b: &Backend, id: &str) -> usize {
    b.received()
        .iter()
        .filter(|r| r.msg["type"] == "acp_update" && r.msg["prompt_id"] == id)
        .filter(|r| r.msg["update"]["sessionUpdate"] == "agent_message_chunk")
        .count()
}

/// A control sent while the backend has not read for a while (a run
/// relaying 20 MB meanwhile) is answered behind no more than the link's
/// read window of updates (256 KiB, docs/proxy.md, "The link"), not
/// behind the MiBs the socket buffers would hold; and no update is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_answer_waits_behind_no_more_than_the_read_window() {
    const N: usize = 100_000;
    let b = Backend::start().await;
    let s = Scratch::new("isolation-window");
    let cfg = acp_config(&s, &b.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    b.registered(0, 20 * SECS).await;
    assert_eq!(open(&b, "wa").await["ok"], true, "{}", daemon.stderr());
    // The backend has answered the link's pings by now.
    assert_eq!(prompt(&b, "wa", "w0", Value::Null, "say warm").await["ok"], true);
    b.pause_reads(true);
    b.send(&json!({"type":"prompt_send","run_id":"wa","prompt_id":"w1","session_id":null,"cwd":"/workspace",
        "prompt":[{"type":"text","text":format!("relay {N}")}],"timeout_ms":120000}));
    // Long enough for the agent to write far more than any socket buffer.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = b.received().len();
    b.send(&json!({"type":"sandbox_control","request_id":"q-window","action":"inspect","run_id":"wa"}));
    b.pause_reads(false);
    b.wait_type("sandbox_control_result", "request_id", &json!("q-window"), 60 * SECS).await;
    let rec = b.received();
    let at = rec.iter().position(|r| r.msg["request_id"] == "q-window").unwrap();
    let ahead: usize = rec[before..at]
        .iter()
        .filter(|r| r.msg["type"] == "acp_update")
        .map(|r| r.msg.to_string().len())
        .sum();
    eprintln!("{} KiB of updates reached the backend before the control's answer", ahead / 1024);
    assert!(ahead <= 320 * 1024, "{} KiB of updates ahead of the control's answer", ahead / 1024);
    let done = b.wait_type("prompt_result", "prompt_id", &json!("w1"), 120 * SECS).await;
    assert_eq!(done["ok"], true, "{done}");
    assert_eq!(relayed(&b, "w1"), N, "every update arrives");
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}

/// A backend that answers no WebSocket ping (here: its pongs dropped on
/// the way) is sent everything all the same: the link turns its read
/// window off for the connection and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_answers_no_ping_is_sent_everything() {
    const N: usize = 20_000;
    let b = Backend::start().await;
    let url = proxy_support::pongless::relay(b.addr).await;
    let s = Scratch::new("isolation-pongless");
    let cfg = acp_config(&s, &url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    b.registered(0, 20 * SECS).await;
    assert_eq!(open(&b, "pa").await["ok"], true, "{}", daemon.stderr());
    let done = prompt(&b, "pa", "p1", Value::Null, &format!("relay {N}")).await;
    assert_eq!(done["ok"], true, "{done}");
    assert_eq!(relayed(&b, "p1"), N, "every update arrives");
    assert!(daemon.stop().success(), "{}", daemon.stderr());
    assert!(daemon.stderr().contains("answers no WebSocket ping"), "{}", daemon.stderr());
}
