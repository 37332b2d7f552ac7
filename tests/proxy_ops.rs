//! What operators run the daemon with (docs/deploy.md): `--log-format
//! json` for journald and log shippers, the token from a file (a systemd
//! credential, a mounted secret), and the liveness a health check reads
//! (`<state>/status.json`, `tuixiu-sandbox check --daemon DIR`).

mod proxy_support;

use std::process::Command;
use std::time::Duration;

use proxy_support::{Backend, Daemon, SECS, Scratch, binary, jwt};
use serde_json::Value;

/// `tuixiu-sandbox check --json --daemon DIR`: (exit code, the daemon row).
fn check_daemon(state: &std::path::Path) -> (Option<i32>, Value) {
    let out = Command::new(binary()).args(["check", "--json", "--daemon"]).arg(state).output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("check --json: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    let row = report["checks"].as_array().unwrap().iter().find(|r| r["check"] == "daemon").cloned().unwrap();
    assert_eq!(report["runWorks"], true, "sandboxes work on the test machine");
    assert_eq!(report["daemonAlive"], out.status.success());
    (out.status.code(), row)
}

#[tokio::test]
async fn json_logs_token_file_and_liveness() {
    let backend = Backend::start().await;
    let token = jwt("from-file", 3600);
    backend.set_valid_tokens(Some(vec![token.clone()]));
    let s = Scratch::new("ops");
    let token_file = s.dir.join("auth_token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let config = s.config(&backend.url, "", "");

    // No daemon yet: not alive.
    let (code, row) = check_daemon(&s.state);
    assert_eq!(code, Some(1), "{row}");
    assert_eq!(row["status"], "fail", "{row}");

    let mut daemon = Daemon::start_args(
        &s,
        "daemon",
        &config,
        &["--log-format", "json", "--auth-token-file", token_file.to_str().unwrap()],
    );
    backend.registered(0, 20 * SECS).await;
    // The token came from the file, without its newline.
    assert_eq!(backend.auth(0).as_deref(), Some(format!("Bearer {token}").as_str()));

    // Alive and registered, as the status file says within an interval.
    let deadline = std::time::Instant::now() + 10 * SECS;
    let row = loop {
        let (code, row) = check_daemon(&s.state);
        if code == Some(0) && row["status"] == "ok" {
            break row;
        }
        assert!(std::time::Instant::now() < deadline, "{row}\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(row["detail"].as_str().unwrap().contains("proxy proxy-test"), "{row}");
    let status: Value = serde_json::from_slice(&std::fs::read(s.state.join("status.json")).unwrap()).unwrap();
    assert_eq!(status["connected"], true);
    assert_eq!(status["pid"], daemon.pid());

    // Every line on stderr is one JSON object with a level and a message;
    // the token is in none of them.
    daemon.stop();
    let log = daemon.stderr();
    assert!(!log.contains(&token), "the token is logged");
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() > 3, "{log}");
    for line in &lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string() && v["message"].is_string(), "{line}");
    }
    assert!(lines.iter().any(|l| l.contains("link: connected")), "{log}");

    // Stopped: its pid is gone, the check fails.
    let (code, row) = check_daemon(&s.state);
    assert_eq!(code, Some(1), "{row}");
    assert!(row["detail"].as_str().unwrap().contains("is gone"), "{row}");
}

#[tokio::test]
async fn token_file_problems_are_one_line_startup_errors() {
    let s = Scratch::new("ops-bad-token");
    let config = s.config("ws://127.0.0.1:9/ws/agent", "", "");
    let empty = s.dir.join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let missing = s.dir.join("missing");
    for (file, why) in [(&empty, "the file is empty"), (&missing, "ENOENT")] {
        let mut daemon =
            Daemon::start_args(&s, "daemon", &config, &["--auth-token-file", file.to_str().unwrap()]);
        assert_eq!(daemon.wait_exit(10 * SECS).code(), Some(125));
        let err = daemon.stderr();
        let line = err.lines().find(|l| l.starts_with("tuixiu-sandbox: ")).unwrap_or_else(|| panic!("{err}"));
        assert!(line.contains(&format!("--auth-token-file {}: {why}", file.display())), "{err}");
    }
}
