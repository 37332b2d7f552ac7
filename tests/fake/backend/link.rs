//! The fake backend driven directly, for the benchmarks (examples/
//! daemon_bench/): start the real daemon against a loopback listener,
//! accept its one WebSocket, and read and write JSON messages on it from
//! the caller's task. Nothing is recorded or parsed unless asked.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

pub type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A loopback listener for the daemon to connect to, and its URL (the
/// `orchestrator_url` of the daemon's config).
pub async fn listen() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://127.0.0.1:{}/ws/agent", listener.local_addr().unwrap().port());
    (listener, url)
}

/// Starts `bin proxy --config CONFIG EXTRA...` with a clean environment
/// (PATH, and TUIXIU_LOG if set here), accepts its link on `listener` and
/// reads until it has sent its `workspace_inventory` (registered and idle).
/// The daemon's stderr goes to ours when `stderr` is true.
pub async fn start_daemon(
    bin: &Path,
    config: &Path,
    extra: &[&str],
    listener: &TcpListener,
    stderr: bool,
) -> (Child, u32, Ws) {
    let mut cmd = Command::new(bin);
    cmd.args(["proxy", "--config"]).arg(config).args(extra).env_clear().env("PATH", "/usr/bin:/bin");
    if let Some(filter) = std::env::var_os("TUIXIU_LOG") {
        cmd.env("TUIXIU_LOG", filter);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if stderr { Stdio::inherit() } else { Stdio::null() })
        .spawn()
        .expect("spawn the daemon");
    let pid = child.id();
    let (tcp, _) = listener.accept().await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    until(&mut ws, |m| m["type"] == "workspace_inventory").await;
    (child, pid, ws)
}

/// The next text message.
pub async fn recv_text(ws: &mut Ws) -> String {
    loop {
        match ws.next().await.expect("daemon closed the link").expect("read") {
            Message::Text(t) => return t.to_string(),
            _ => continue,
        }
    }
}

/// The next text message, parsed.
pub async fn recv_json(ws: &mut Ws) -> Value {
    serde_json::from_str(&recv_text(ws).await).unwrap()
}

pub async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// Reads until a message satisfies `pred`, acking `register_agent` and
/// printing the daemon's error and stderr notes on the way.
pub async fn until(ws: &mut Ws, pred: impl Fn(&Value) -> bool) -> Value {
    loop {
        let m = recv_json(ws).await;
        if m["type"] == "register_agent" {
            ws.send(super::register_ack()).await.unwrap();
        }
        if m["type"] == "proxy_update" && m["content"]["type"] == "text" {
            let t = m["content"]["text"].as_str().unwrap_or("");
            if t.contains("error") || t.contains("stderr") {
                eprintln!("daemon says: {t}");
            }
        }
        if pred(&m) {
            return m;
        }
    }
}
