//! The daemon's link to the backend, end to end: the real binary against a
//! real WebSocket server (plain, TLS, mTLS) and a real HTTP registration
//! endpoint.

mod proxy_support;

use std::process::Command;
use std::time::Duration;

use proxy_support::{Backend, Daemon, OnRegister, Pki, SECS, Scratch, jwt, register_endpoint};
use serde_json::{Value, json};

fn types(msgs: &[Value]) -> Vec<String> {
    msgs.iter().map(|m| m["type"].as_str().unwrap_or("?").to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_inventories_then_heartbeats_in_order() {
    let backend = Backend::start().await;
    let s = Scratch::new("order");
    std::fs::create_dir_all(s.root.join("run-w1")).unwrap();
    let cfg = s.config(&backend.url, "inventory_interval_seconds = 2", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    // A periodic inventory after the first heartbeats.
    backend
        .wait_for("two heartbeats and a periodic inventory", 20 * SECS, |_| {
            let msgs = backend.of_conn(0);
            msgs.iter().filter(|m| m["type"] == "heartbeat").count() >= 2
                && msgs.iter().filter(|m| m["type"] == "sandbox_inventory").count() >= 2
        })
        .await;
    let msgs = backend.of_conn(0);
    let t = types(&msgs);
    assert_eq!(&t[..3], ["register_agent", "sandbox_inventory", "workspace_inventory"], "{t:?}");
    let reg = &msgs[0]["agent"];
    assert_eq!(reg["id"], "proxy-test");
    assert_eq!(reg["name"], "proxy-test");
    assert_eq!(reg["max_concurrent"], 1);
    let caps = &reg["capabilities"];
    assert_eq!(caps["sandbox"]["provider"], "bwrap");
    assert_eq!(caps["sandbox"]["workspaceProvider"], "host");
    assert_eq!(caps["sandbox"]["agentMode"], "exec");
    assert_eq!(caps["acpTunnel"], true);
    assert_eq!(caps["runtime"]["platform"], "linux");
    assert!(msgs[0].get("auth").is_none(), "no auth field without register_hmac_secret");
    let inv = &msgs[1];
    assert_eq!(inv["provider"], "bwrap");
    assert!(inv["instances"].is_array());
    assert!(inv["captured_at"].as_str().unwrap().ends_with('Z'));
    let ws = &msgs[2];
    assert_eq!(ws["workspace_provider"], "host");
    assert_eq!(ws["workspaces"][0]["run_id"], "w1");
    assert!(ws["workspaces"][0]["mtime"].as_str().unwrap().ends_with('Z'));
    let hb = msgs.iter().find(|m| m["type"] == "heartbeat").unwrap();
    assert_eq!(hb["agent_id"], "proxy-test");
    assert!(hb["timestamp"].as_str().unwrap().contains('T'));
    // The first heartbeat comes after one interval, not before the inventories.
    let first_hb = t.iter().position(|x| x == "heartbeat").unwrap();
    assert!(first_hb > 2);
    // `tuixiu-sandbox proxy` runs the daemon's own, smaller binary.
    let exe = std::fs::read_link(format!("/proc/{}/exe", daemon.pid())).unwrap();
    assert_eq!(exe.file_name().unwrap(), "tuixiu-sandbox-proxy");
    assert!(daemon.running());
    assert!(daemon.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_auth_hmac_when_configured() {
    let backend = Backend::start().await;
    let s = Scratch::new("hmac");
    let cfg = s.config(&backend.url, "register_hmac_secret = \"reg-secret-xyz\"", "");
    let _daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    let reg = backend.of_conn(0).remove(0);
    let auth = &reg["auth"];
    assert_eq!(auth["type"], "hmac-sha256");
    assert_eq!(auth["proxy_id"], "proxy-test");
    let ts = auth["timestamp"].as_str().unwrap();
    let expect =
        tuixiu_sandbox::proxy::control::hmac_hex("reg-secret-xyz", format!("proxy-test.{ts}").as_bytes());
    assert_eq!(auth["signature"], expect);
}

/// A run workspace whose `origin` accepts TCP connections and never
/// answers: a `git_push` there keeps the run's lane busy until its timeout,
/// so replies queued behind it are produced while the test wants them.
fn hanging_remote(s: &Scratch, run: &str) -> std::net::TcpListener {
    let hang = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hang.local_addr().unwrap().port();
    let ws = s.root.join(format!("run-{run}"));
    std::fs::create_dir_all(&ws).unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git").arg("-C").arg(&ws).args(args).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "x"]);
    git(&["remote", "add", "origin", &format!("http://127.0.0.1:{port}/repo.git")]);
    hang
}

/// Sends a 5 s git_push to the hanging remote and `n` inspects queued
/// behind it, then takes the backend down until they have all been produced.
async fn replies_while_down(backend: &Backend, n: usize) {
    backend.send(&json!({"type":"sandbox_control","action":"git_push","request_id":"push",
        "run_id":"slow","branch":"main","timeout_seconds":5}));
    for i in 0..n {
        backend.send(&json!({"type":"sandbox_control","action":"inspect","request_id":format!("q{i}"),"run_id":"slow"}));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(backend.of_conn(0).iter().all(|m| m["type"] != "sandbox_control_result"), "lane was not busy");
    backend.refuse(true);
    backend.drop_conn();
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(backend.connections(), 1, "connected while refusing");
    backend.refuse(false);
}

/// Replies produced while the link is down wait in the outbox and arrive,
/// in order and complete, after the next register_agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_delivers_queued_replies_in_order() {
    let backend = Backend::start().await;
    let s = Scratch::new("outbox");
    let hang = hanging_remote(&s, "slow");
    let cfg = s.config(&backend.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    let n = 20;
    replies_while_down(&backend, n).await;
    backend
        .wait_for("the 21 queued replies", 20 * SECS, |_| {
            backend.received().iter().filter(|r| r.msg["type"] == "sandbox_control_result").count() == n + 1
        })
        .await;
    let conn = backend.connections() - 1;
    let msgs = backend.of_conn(conn);
    let t = types(&msgs);
    assert_eq!(t[0], "register_agent", "{t:?}");
    let results: Vec<&Value> = msgs.iter().filter(|m| m["type"] == "sandbox_control_result").collect();
    assert_eq!(results.len(), n + 1, "all replies on the new connection: {t:?}");
    assert_eq!(results[0]["request_id"], "push");
    assert_eq!(results[0]["ok"], false);
    assert_eq!(results[0]["error"], "timeout after 5s");
    for (i, r) in results[1..].iter().enumerate() {
        assert_eq!(r["request_id"], format!("q{i}"), "order");
        assert_eq!(r["action"], "inspect");
        assert_eq!(r["status"], "missing");
    }
    // Exactly one reply each, across both connections.
    let all: Vec<Value> = backend
        .received()
        .into_iter()
        .map(|r| r.msg)
        .filter(|m| m["type"] == "sandbox_control_result")
        .collect();
    assert_eq!(all.len(), n + 1);
    drop(hang);
    assert!(daemon.stop().success());
}

/// Past its bound the outbox drops the oldest messages, and says so: in
/// the log and, after re-registering, to the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_overflow_is_reported_not_silent() {
    let backend = Backend::start().await;
    let s = Scratch::new("overflow");
    let hang = hanging_remote(&s, "slow");
    let cfg = s.config(&backend.url, "outbox_max_messages = 5", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    replies_while_down(&backend, 9).await;
    let notice = backend
        .wait_for("the overflow notice", 20 * SECS, |r| {
            r.msg["type"] == "proxy_update"
                && r.msg["content"]["text"].as_str().is_some_and(|t| t.contains("outbox overflow"))
        })
        .await;
    // 10 results and 9 status updates (inspect with a run_id reports the
    // status too) for a bound of 5: 14 are dropped, the oldest bulk
    // messages (status updates) before any control answer.
    assert_eq!(notice.msg["run_id"], "slow");
    assert!(notice.msg["content"]["text"].as_str().unwrap().contains("14 message(s)"), "{}", notice.msg);
    backend
        .wait_for("the newest replies", 10 * SECS, |_| {
            backend.received().iter().filter(|r| r.msg["type"] == "sandbox_control_result").count() == 5
        })
        .await;
    let ids: Vec<String> = backend
        .received()
        .iter()
        .filter(|r| r.msg["type"] == "sandbox_control_result")
        .map(|r| r.msg["request_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["q4", "q5", "q6", "q7", "q8"], "the newest answers survive, in order");
    let log = daemon.stderr();
    assert!(log.contains("outbox full") && log.contains("sandbox_control_result for run slow"), "{log}");
    drop(hang);
    assert!(daemon.stop().success());
}

/// A registered token close to its `exp` is replaced at the next connect,
/// without waiting for the backend to refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_near_expiry_is_renewed_at_reconnect() {
    let backend = Backend::start().await;
    let short = jwt("short", 30);
    let long = jwt("long", 30 * 24 * 3600);
    let (url, calls) = register_endpoint("boot-secret-123456", vec![short.clone(), long.clone()]).await;
    let s = Scratch::new("renew");
    let cfg = s.config(
        &backend.url,
        &format!("register_url = \"{url}\"\nbootstrap_token = \"boot-secret-123456\""),
        "",
    );
    let _daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    assert_eq!(backend.auth(0).as_deref(), Some(format!("Bearer {short}").as_str()));
    backend.close(1012, "service restart");
    backend.registered(1, 20 * SECS).await;
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(backend.auth(1).as_deref(), Some(format!("Bearer {long}").as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_registration_and_refresh_after_1008() {
    let backend = Backend::start().await;
    let t1 = jwt("one", 30 * 24 * 3600);
    let t2 = jwt("two", 30 * 24 * 3600);
    // The backend only knows the second token: the first is refused with 1008.
    backend.set_valid_tokens(Some(vec![t2.clone()]));
    let (url, calls) = register_endpoint("boot-secret-123456", vec![t1.clone(), t2.clone()]).await;
    let s = Scratch::new("bootstrap");
    let cfg = s.config(
        &backend.url,
        &format!("register_url = \"{url}\"\nbootstrap_token = \"boot-secret-123456\""),
        "",
    );
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.wait_for("a register_agent", 30 * SECS, |r| r.msg["type"] == "register_agent").await;
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2, "registered twice");
    assert_eq!(backend.auth(0).as_deref(), Some(format!("Bearer {t1}").as_str()));
    let last = backend.connections() - 1;
    assert_eq!(backend.auth(last).as_deref(), Some(format!("Bearer {t2}").as_str()));
    let log = daemon.stderr();
    for secret in ["boot-secret-123456", &t1, &t2] {
        assert!(!log.contains(secret), "a secret reached the log:\n{log}");
    }
    assert!(log.contains("1008"), "{log}");
    assert!(daemon.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_token_is_sent_as_bearer() {
    let backend = Backend::start().await;
    backend.set_valid_tokens(Some(vec!["static-token-abcdef".into()]));
    let s = Scratch::new("static");
    let cfg = s.config(&backend.url, "", "");
    let _daemon = Daemon::start_env(&s, "proxy", &cfg, &[("ACP_PROXY_AUTH_TOKEN", "static-token-abcdef")]);
    backend.registered(0, 20 * SECS).await;
    assert_eq!(backend.auth(0).as_deref(), Some("Bearer static-token-abcdef"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_with_ca_file_and_client_certificate() {
    let s = Scratch::new("mtls");
    let pki = Pki::generate(&s.dir.join("pki"));
    let backend = Backend::start_tls(&pki, true).await;
    let tls = format!(
        "[tls]\nca_file = \"{}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"\n",
        pki.ca_file.display(),
        pki.client_cert.display(),
        pki.client_key.display()
    );
    let cfg = format!("{}{tls}", s.config(&backend.url, "", ""));
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    assert!(daemon.stop().success());

    // Without the client certificate the server refuses the handshake.
    let tls = format!("[tls]\nca_file = \"{}\"\n", pki.ca_file.display());
    let cfg = format!("{}{tls}", s.config(&backend.url, "", ""));
    let mut daemon = Daemon::start(&s, "nocert", &cfg);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(backend.connections(), 1, "connected without a client certificate");
    assert!(daemon.running());
    assert!(daemon.stderr().contains("link:"), "{}", daemon.stderr());
    daemon.stop();

    // Without the CA, the server certificate is not trusted.
    let backend = Backend::start_tls(&pki, false).await;
    let cfg = s.config(&backend.url, "", "");
    let mut daemon = Daemon::start(&s, "noca", &cfg);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(backend.connections(), 0);
    let log = daemon.stderr();
    assert!(log.contains("UnknownIssuer") || log.contains("certificate"), "{log}");
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_ws_to_a_remote_host_is_refused() {
    let s = Scratch::new("insecure");
    let cfg = s.config("ws://192.0.2.1:9/ws/agent", "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    let status = daemon.wait_exit(10 * SECS);
    assert_eq!(status.code(), Some(125));
    assert!(daemon.stderr().contains("only allowed to loopback"), "{}", daemon.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_config_is_a_clear_startup_error() {
    let s = Scratch::new("badcfg");
    let cfg = s.config("ws://127.0.0.1:9/ws/agent", "heartbeat_seconds = \"often\"\nmystery_key = 1", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    assert_eq!(daemon.wait_exit(10 * SECS).code(), Some(125));
    let log = daemon.stderr();
    assert!(log.contains("heartbeat_seconds: expected an integer"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_daemon_with_the_same_state_refuses_to_start() {
    let backend = Backend::start().await;
    let s = Scratch::new("lock");
    let cfg = s.config(&backend.url, "", "");
    let mut first = Daemon::start(&s, "first", &cfg);
    backend.registered(0, 20 * SECS).await;
    let mut second = Daemon::start(&s, "second", &cfg);
    assert_eq!(second.wait_exit(10 * SECS).code(), Some(125));
    let log = second.stderr();
    assert!(log.contains("already runs") && log.contains(&format!("pid {}", first.pid())), "{log}");
    assert!(first.running());
    assert_eq!(backend.connections(), 1);
    first.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_conflict_exits_non_zero() {
    let backend = Backend::start().await;
    backend.set_on_register(OnRegister::Close(4409, "proxy_id_conflict".into()));
    let s = Scratch::new("conflict");
    let cfg = s.config(&backend.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    let status = daemon.wait_exit(20 * SECS);
    assert_eq!(status.code(), Some(3));
    let log = daemon.stderr();
    assert!(log.contains("proxy_id_conflict") && log.contains("proxy-test"), "{log}");
    assert_eq!(backend.connections(), 1, "must not reconnect after a conflict");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_are_dropped_or_answered() {
    let backend = Backend::start().await;
    let s = Scratch::new("malformed");
    let cfg = s.config(&backend.url, "", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    backend.send_raw("{not json");
    backend.send_raw("[1,2]");
    backend.send_raw(r#"{"type":42}"#);
    backend.send_raw(r#"{"type":"bogus","run_id":"r"}"#);
    backend.send_binary(b"\x00\x01");
    // Messages that expect a reply get an error reply, not silence.
    backend.send(&json!({"type":"acp_open"}));
    backend.send(&json!({"type":"prompt_send","run_id":"../x","prompt_id":"p1","prompt":[]}));
    backend.send(&json!({"type":"session_cancel","run_id":"r1","control_id":"c1"}));
    backend.send(&json!({"type":"sandbox_control","request_id":"noaction"}));
    backend.send(&json!({"type":"sandbox_control","action":"explode","request_id":"x1","run_id":"r1"}));
    backend.send(&json!({"type":"acp_close","run_id":"never-opened"}));
    let open = backend.wait_type("acp_opened", "run_id", &Value::Null, 10 * SECS).await;
    assert_eq!(open["ok"], false);
    assert!(open["error"].as_str().unwrap().contains("run_id"), "{open}");
    let prompt = backend.wait_type("prompt_result", "prompt_id", &json!("p1"), 10 * SECS).await;
    assert_eq!(prompt["ok"], false);
    assert!(prompt["error"].as_str().unwrap().contains("'/'"), "{prompt}");
    let session = backend.wait_type("session_control_result", "control_id", &json!("c1"), 10 * SECS).await;
    assert_eq!(session["ok"], false);
    assert_eq!(session["error"], "session_id 为空");
    let r = backend.result("noaction").await;
    assert_eq!(r["error"], "unsupported_action");
    let r = backend.result("x1").await;
    assert_eq!(
        (r["ok"].clone(), r["error"].clone(), r["action"].clone()),
        (json!(false), json!("unsupported_action"), json!("explode"))
    );
    assert_eq!(r["run_id"], "r1");
    let closed = backend.wait_type("acp_closed", "run_id", &json!("never-opened"), 10 * SECS).await;
    assert_eq!(closed["ok"], false);
    // Still alive and answering.
    let r = backend.control(json!({"action":"inspect","instance_name":"tuixiu-run-zzz"})).await;
    assert_eq!(r["status"], "missing");
    assert!(daemon.running());
    let log = daemon.stderr();
    assert!(log.contains("not JSON") && log.contains("unknown message type \"bogus\""), "{log}");
    assert!(daemon.stop().success());
}

/// A backend that accepts the WebSocket but closes it before `register_ack`
/// does not reset the reconnect backoff: the delays grow. Once a connection
/// is registered, the next reconnect starts from the shortest delay again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_is_reset_only_by_a_registered_connection() {
    let backend = Backend::start().await;
    backend.set_on_register(OnRegister::Close(1011, "try again later".into()));
    let s = Scratch::new("backoff");
    let cfg = s.config(&backend.url, "reconnect_max_seconds = 8", "");
    let mut daemon = Daemon::start(&s, "proxy", &cfg);
    backend.registered(0, 20 * SECS).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let starts: Vec<std::time::Instant> =
        backend.received().iter().filter(|r| r.msg["type"] == "register_agent").map(|r| r.at).collect();
    // Delays of [d/2, d] for d = 1, 2, 4, 8 s: at most 4 connections in
    // 6 s (a reset after every connect would make one every 0.5 s at most).
    assert!((2..=4).contains(&starts.len()), "{} connections in 6 s: the backoff was reset", starts.len());
    let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.windows(2).all(|g| g[1] >= g[0] / 2), "the delays do not grow: {gaps:?}");
    assert!(gaps.last().unwrap() >= &Duration::from_millis(900), "{gaps:?}");
    // A registered connection resets it: after a drop, it is back at once.
    backend.set_on_register(OnRegister::Ack);
    let n = backend.connections();
    backend
        .wait_for("a registered connection", 20 * SECS, |r| r.conn >= n && r.msg["type"] == "register_agent")
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dropped_at = std::time::Instant::now();
    backend.drop_conn();
    backend
        .wait_for("the reconnect after the drop", 10 * SECS, |r| {
            r.conn > n && r.msg["type"] == "register_agent"
        })
        .await;
    assert!(dropped_at.elapsed() < Duration::from_secs(2), "not reset: {:?}", dropped_at.elapsed());
    assert!(daemon.stop().success());
}
