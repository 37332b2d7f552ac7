//! The daemon's Prometheus metrics (`proxy --metrics-listen`), scraped
//! over real sockets while runs go through the fake backend to the
//! fake agent in real sandboxes, and read with a real parser of the
//! text format (the `prometheus-parse` crate, tests/scrape/mod.rs).

mod egress_support;
mod proxy_support;
mod scrape;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use egress_support::{HOSTS_ENV, Server, hosts_file};
use proxy_support::agent::{acp_config, prompt, reports};
use proxy_support::{Backend, Daemon, SECS, Scratch};
use scrape::{Metrics, exchange, scrape, scrape_unix};
use serde_json::json;

/// Waits until `check` holds for a scrape of `path`.
async fn until(path: &Path, what: &str, check: impl Fn(&Metrics) -> bool) -> Metrics {
    let deadline = Instant::now() + 20 * SECS;
    loop {
        let m = scrape_unix(path);
        if check(&m) {
            return m;
        }
        assert!(Instant::now() < deadline, "{what}:\n{}", m.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn open_msg(run: &str, items: serde_json::Value) -> serde_json::Value {
    json!({"type": "acp_open", "run_id": run, "cwd": "/workspace",
           "init": {"script": "true", "timeout_seconds": 30, "env": {"USER_HOME": "/home/agent"},
                    "agentInputs": {"version": 1, "items": items}},
           "instance_name": format!("tuixiu-run-{run}"), "keepalive_ttl_seconds": 600})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_serves_metrics_that_follow_its_runs() {
    let backend = Backend::start().await;
    let s = Scratch::new("metrics");
    let cfg = acp_config(&s, &backend.url, "", "");
    let sock = s.dir.join("metrics.sock");
    let listen = format!("unix:{}", sock.display());
    let mut daemon = Daemon::start_args(&s, "proxy", &cfg, &["--metrics-listen", &listen]);
    backend.registered(0, 20 * SECS).await;

    let idle = until(&sock, "registered", |m| m.get("tuixiu_backend_connected", &[]) == Some(1.0)).await;
    assert_eq!(idle.value("tuixiu_backend_registrations_total", &[]), 1.0);
    assert_eq!(idle.value("tuixiu_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), 1.0);
    assert_eq!(idle.value("tuixiu_agents_running", &[]), 0.0);
    assert_eq!(idle.get("tuixiu_acp_open_seconds_count", &[("result", "ok")]), None);

    // A run with one inline file; a prompt with 20 updates; a control.
    let items = json!([{"id": "notes", "apply": "writeFile", "source": {"type": "inlineText", "text": "hi"},
                        "target": {"root": "WORKSPACE", "path": "notes.txt"}}]);
    backend.send(&open_msg("m1", items));
    let opened = backend.wait_type("acp_opened", "run_id", &json!("m1"), 60 * SECS).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
    let r = prompt(&backend, "m1", "p1", serde_json::Value::Null, "updates 20\nsay done").await;
    assert_eq!(r["ok"], true, "{r}");
    let inspect = backend
        .control(json!({"type": "sandbox_control", "action": "inspect", "run_id": "m1",
                        "instance_name": "tuixiu-run-m1", "request_id": "c1"}))
        .await;
    assert_eq!(inspect["ok"], true, "{inspect}");
    // A run whose manifest is refused: no sandbox, an input error code.
    let bad = json!([{"id": "evil", "apply": "writeFile", "source": {"type": "inlineText", "text": "x"},
                      "target": {"root": "WORKSPACE", "path": "../escape"}}]);
    backend.send(&open_msg("m2", bad));
    let refused = backend.wait_type("acp_opened", "run_id", &json!("m2"), 60 * SECS).await;
    assert_eq!(refused["ok"], false, "{refused}");
    let code = refused["error"].as_str().unwrap().split(':').next().unwrap().to_string();

    let busy = until(&sock, "the control counted", |m| {
        m.get("tuixiu_controls_total", &[("action", "inspect"), ("result", "ok")]) == Some(1.0)
    })
    .await;
    assert_eq!(busy.value("tuixiu_acp_open_seconds_count", &[("result", "ok")]), 1.0);
    assert_eq!(busy.value("tuixiu_acp_open_seconds_count", &[("result", "error")]), 1.0);
    assert!(busy.value("tuixiu_acp_open_seconds_sum", &[("result", "ok")]) > 0.0);
    assert_eq!(busy.value("tuixiu_inputs_applied_total", &[("apply", "writeFile")]), 1.0);
    assert_eq!(busy.value("tuixiu_inputs_failures_total", &[("code", &code)]), 1.0, "{code}");
    assert_eq!(code, "INVALID_AGENT_INPUTS_ITEM_TARGET");
    assert_eq!(busy.value("tuixiu_sandbox_start_seconds_count", &[("provider", "bwrap")]), 1.0);
    assert_eq!(busy.value("tuixiu_prompt_seconds_count", &[("result", "ok")]), 1.0);
    assert!(busy.value("tuixiu_messages_sent_total", &[("type", "acp_update")]) >= 20.0, "{}", busy.text);
    assert_eq!(busy.value("tuixiu_messages_received_total", &[("type", "acp_open")]), 2.0);
    assert_eq!(busy.value("tuixiu_messages_received_total", &[("type", "prompt_send")]), 1.0);
    assert_eq!(busy.value("tuixiu_agents_started_total", &[]), 1.0);
    assert_eq!(busy.value("tuixiu_agents_running", &[]), 1.0);
    assert!(busy.value("tuixiu_run_lanes", &[]) >= 1.0);
    assert_eq!(busy.value("tuixiu_prompts_in_flight", &[]), 0.0);
    assert!(
        busy.get("tuixiu_outbox_messages", &[]).is_some() && busy.get("tuixiu_outbox_bytes", &[]).is_some()
    );
    assert_eq!(busy.value("tuixiu_outbox_dropped_total", &[]), 0.0);
    // Bounded labels: no run, prompt or request id anywhere.
    for v in busy.label_values() {
        assert!(!["m1", "m2", "p1", "c1", "notes", "evil"].contains(&v.as_str()), "label value {v}");
    }

    // The agent crashes: an exit of its own, counted by reason.
    let r = prompt(&backend, "m1", "p2", r["session_id"].clone(), "exit 3").await;
    assert_eq!(r["ok"], false, "{r}");
    let after = until(&sock, "the exit counted", |m| {
        m.get("tuixiu_agents_exited_total", &[("reason", "exit_error")]) == Some(1.0)
    })
    .await;
    assert_eq!(after.value("tuixiu_agents_running", &[]), 0.0);
    assert_eq!(after.value("tuixiu_prompt_seconds_count", &[("result", "error")]), 1.0);

    // The link goes down and comes back: a disconnect, a second registration.
    backend.drop_conn();
    let back = until(&sock, "registered again", |m| {
        m.get("tuixiu_backend_registrations_total", &[]) == Some(2.0)
            && m.get("tuixiu_backend_connected", &[]) == Some(1.0)
    })
    .await;
    assert_eq!(back.value("tuixiu_backend_disconnects_total", &[]), 1.0);

    // Anything but GET /metrics.
    let (status, _, _) = exchange(UnixStream::connect(&sock).unwrap(), "GET / HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    let (status, _, _) = exchange(UnixStream::connect(&sock).unwrap(), "POST /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    assert!(daemon.stop().success());
}

// What happens inside the sandboxes, where the daemon does not see it
// directly: nested sandboxes (counted by the portal's workers in memory
// shared with the daemon) and the egress proxies' refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_sandboxes_and_egress_refusals_are_counted() {
    let backend = Backend::start().await;
    let s = Scratch::new("metrics-inside");
    let model = Server::start("127.0.0.2", None, "model-ok");
    let p = model.port;
    let mapping = hosts_file(&s.dir, &[("127.0.0.2", "api.model.test"), ("127.0.0.2", "other.test")]);
    let sandbox =
        format!("network = \"allow\"\nallowHosts = [\"api.model.test:{p}\"]\nallowRanges = [\"127.0.0.2\"]");
    let cfg = acp_config(&s, &backend.url, "", &sandbox);
    let sock = s.dir.join("metrics.sock");
    let listen = format!("unix:{}", sock.display());
    let env = [(HOSTS_ENV, mapping.to_str().unwrap())];
    let mut daemon = Daemon::start_args_env(&s, "proxy", &cfg, &["--metrics-listen", &listen], &env);
    backend.registered(0, 20 * SECS).await;
    let idle = until(&sock, "registered", |m| m.get("tuixiu_backend_connected", &[]) == Some(1.0)).await;
    for result in ["started", "refused", "failed"] {
        assert_eq!(idle.value("tuixiu_nested_sandboxes_total", &[("result", result)]), 0.0, "{result}");
    }

    backend.send(&open_msg("n1", json!([])));
    let opened = backend.wait_type("acp_opened", "run_id", &json!("n1"), 60 * SECS).await;
    assert_eq!(opened["ok"], true, "{opened}\n{}", daemon.stderr());
    let script = [
        "run bwrap --ro-bind / / -- true".to_string(),
        "run bwrap --ro-bind / / -- true".to_string(),
        // A source the sandbox cannot see: refused before anything starts.
        "run bwrap --ro-bind /no/such/dir /x -- true".to_string(),
        // Built, then COMMAND cannot be executed.
        "run bwrap --ro-bind / / -- /no/such/program".to_string(),
        format!("run curl -sS http://other.test:{p}/"),
    ]
    .join("\n");
    let r = prompt(&backend, "n1", "p1", serde_json::Value::Null, &script).await;
    assert_eq!(r["ok"], true, "{r}\n{}", daemon.stderr());
    let rep = reports(&backend, "p1");
    let codes: Vec<_> = rep.iter().map(|r| r["code"].as_i64().unwrap()).collect();
    assert_eq!(&codes[..2], [0, 0], "{rep:?}");
    assert!(codes[2..4].iter().all(|c| *c != 0), "{rep:?}");

    let m = until(&sock, "the nested requests counted", |m| {
        m.get("tuixiu_nested_sandboxes_total", &[("result", "started")]) == Some(2.0)
    })
    .await;
    assert_eq!(
        m.value("tuixiu_nested_sandboxes_total", &[("result", "refused")]),
        1.0,
        "{rep:?}\n{}",
        m.text
    );
    assert_eq!(m.value("tuixiu_nested_sandboxes_total", &[("result", "failed")]), 1.0, "{rep:?}\n{}", m.text);
    assert_eq!(m.value("tuixiu_egress_denied_total", &[("via", "http")]), 1.0, "{rep:?}\n{}", m.text);
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_tcp_and_bad_addresses() {
    let backend = Backend::start().await;
    let s = Scratch::new("metrics-tcp");
    let cfg = s.config(&backend.url, "", "");
    // Port 0: the daemon logs the port it got.
    let mut daemon = Daemon::start_args(&s, "proxy", &cfg, &["--metrics-listen", "127.0.0.1:0"]);
    backend.registered(0, 20 * SECS).await;
    let deadline = Instant::now() + 10 * SECS;
    let addr = loop {
        let log = daemon.stderr();
        if let Some(at) = log.find("metrics on ") {
            let rest = &log[at + "metrics on ".len()..];
            break rest[..rest.find("/metrics").unwrap()].to_string();
        }
        assert!(Instant::now() < deadline, "no metrics address logged:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let m = scrape(std::net::TcpStream::connect(&addr).unwrap());
    assert_eq!(m.value("tuixiu_build_info", &[("binary", "tuixiu-sandbox-proxy")]), 1.0);
    // The port is taken now: a second daemon refuses to start.
    let s2 = Scratch::new("metrics-taken");
    let mut second =
        Daemon::start_args(&s2, "proxy", &s2.config(&backend.url, "", ""), &["--metrics-listen", &addr]);
    assert_eq!(second.wait_exit(10 * SECS).code(), Some(125));
    assert!(second.stderr().contains(&format!("--metrics-listen {addr}:")), "{}", second.stderr());
    assert!(daemon.stop().success());

    // Not an address: clap refuses it with the reason.
    let out = std::process::Command::new(proxy_support::binary())
        .args(["proxy", "--metrics-listen", "localhost:9"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unix:/PATH"), "{out:?}");
}
