//! A fake tuixiu backend for the daemon's end-to-end tests: a real
//! WebSocket server (tokio-tungstenite, optionally over rustls with
//! certificates made by rcgen at test time), a tiny real HTTP endpoint for
//! the bootstrap registration, and a handle on the real `tuixiu-sandbox
//! proxy` process.
//!
//! Like the real backend it keeps the proxy id each connection registered
//! and can route by it ([`Backend::send_to`]): with several daemons it
//! remembers which proxy each run was dispatched to, marks a proxy's runs
//! failed when its connection goes away ("proxy disconnected"), and, with
//! [`Backend::refuse_duplicate_ids`], refuses a second connection with an
//! id that is already connected (close 4409 `proxy_id_conflict`:
//! docs/protocol.md, "Identity and proxy_id_conflict").

#![allow(dead_code)]

pub mod agent;
#[path = "../install/mod.rs"]
mod install;
pub mod net;
#[path = "../pki/mod.rs"]
mod pki;
pub use pki::Pki;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// What the backend does when a connection registers.
#[derive(Clone, Debug)]
pub enum OnRegister {
    Ack,
    /// Close with this code and reason (e.g. 4409 "proxy_id_conflict").
    Close(u16, String),
}

/// One message the backend received.
#[derive(Clone, Debug)]
pub struct Received {
    pub conn: usize,
    pub msg: Value,
    pub at: Instant,
}

enum Cmd {
    Text(String),
    Binary(Vec<u8>),
    Close(u16, String),
    Drop,
}

struct Conn {
    auth: Option<String>,
    tx: mpsc::UnboundedSender<Cmd>,
    open: Arc<AtomicBool>,
    peer: SocketAddr,
    /// The `agent.id` of its accepted `register_agent`.
    proxy_id: Option<String>,
}

#[derive(Default)]
struct Shared {
    received: Mutex<Vec<Received>>,
    conns: Mutex<Vec<Conn>>,
    /// Tokens accepted; `None` accepts anything. Others get close 1008.
    valid_tokens: Mutex<Option<Vec<String>>>,
    on_register: Mutex<Option<OnRegister>>,
    /// While set, new TCP connections are dropped at once.
    refuse: AtomicBool,
    /// Refuse a registration whose id another open connection holds.
    refuse_duplicate_ids: AtomicBool,
    /// run_id → (the proxy it was dispatched to by `send_to`, requests
    /// (`acp_open`, `prompt_send`) not yet answered).
    routes: Mutex<std::collections::HashMap<String, (String, usize)>>,
    /// Runs whose proxy went away while they were routed to it, with why.
    failed: Mutex<Vec<(String, String)>>,
    /// After answering a proxy's Close, keep the TCP connection open this
    /// long (a backend behind a proxy that does not close first).
    linger_after_close: Mutex<Option<Duration>>,
}

/// With `TUIXIU_TEST_WIRE_LOG=<file>`, every text frame any test backend
/// receives is appended to `<file>`, one line each, exactly as sent: the
/// daemon's outgoing traffic, to compare two builds byte for byte
/// (docs/protocol.md, "Checking the wire").
fn wire_log(text: &str) {
    use std::io::Write;
    static LOG: std::sync::OnceLock<Option<Mutex<std::fs::File>>> = std::sync::OnceLock::new();
    let log = LOG.get_or_init(|| {
        let path = std::env::var_os("TUIXIU_TEST_WIRE_LOG")?;
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).ok()?;
        Some(Mutex::new(file))
    });
    if let Some(file) = log {
        let mut line = text.replace('\n', "\\n");
        line.push('\n');
        let _ = file.lock().unwrap().write_all(line.as_bytes());
    }
}

pub struct Backend {
    pub addr: SocketAddr,
    pub url: String,
    shared: Arc<Shared>,
}

impl Backend {
    /// A plain `ws://127.0.0.1:<port>/ws/agent` backend.
    pub async fn start() -> Backend {
        Self::start_with(None).await
    }

    /// A `wss://localhost:<port>/ws/agent` backend; with
    /// `require_client_cert`, clients must present a certificate of the CA.
    pub async fn start_tls(pki: &Pki, require_client_cert: bool) -> Backend {
        Self::start_with(Some(Arc::new(pki.server_config(require_client_cert)))).await
    }

    async fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let url = match tls {
            Some(_) => format!("wss://localhost:{}/ws/agent", addr.port()),
            None => format!("ws://127.0.0.1:{}/ws/agent", addr.port()),
        };
        Self::serve_on(listener, tls, url)
    }

    /// A backend on a listener made elsewhere (e.g. bound inside a network
    /// namespace of the test's own), over TLS with `pki`'s server
    /// certificate when given. `url` is what `self.url` says.
    pub fn start_on(listener: std::net::TcpListener, pki: Option<&Pki>, url: String) -> Backend {
        listener.set_nonblocking(true).unwrap();
        let listener = TcpListener::from_std(listener).unwrap();
        Self::serve_on(listener, pki.map(|p| Arc::new(p.server_config(false))), url)
    }

    fn serve_on(listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>, url: String) -> Backend {
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        *shared.on_register.lock().unwrap() = Some(OnRegister::Ack);
        let s = shared.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, peer)) = listener.accept().await else { continue };
                if s.refuse.load(Ordering::SeqCst) {
                    drop(tcp);
                    continue;
                }
                let s = s.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        Some(cfg) => {
                            let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                serve(s, stream, peer).await;
                            }
                        }
                        None => serve(s, tcp, peer).await,
                    }
                });
            }
        });
        Backend { addr, url, shared }
    }

    pub fn set_valid_tokens(&self, tokens: Option<Vec<String>>) {
        *self.shared.valid_tokens.lock().unwrap() = tokens;
    }

    pub fn set_on_register(&self, r: OnRegister) {
        *self.shared.on_register.lock().unwrap() = Some(r);
    }

    /// Drop every new connection at once (the backend is "down").
    pub fn refuse(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::SeqCst);
    }

    pub fn connections(&self) -> usize {
        self.shared.conns.lock().unwrap().len()
    }

    /// Answer a proxy's Close, then keep the connection open for `d`.
    pub fn linger_after_close(&self, d: Duration) {
        *self.shared.linger_after_close.lock().unwrap() = Some(d);
    }

    /// Refuse a `register_agent` whose id an open connection already holds.
    pub fn refuse_duplicate_ids(&self, on: bool) {
        self.shared.refuse_duplicate_ids.store(on, Ordering::SeqCst);
    }

    /// The newest open connection registered as `proxy`.
    fn of_proxy(&self, proxy: &str) -> Option<(usize, mpsc::UnboundedSender<Cmd>)> {
        let conns = self.shared.conns.lock().unwrap();
        conns
            .iter()
            .enumerate()
            .rev()
            .find(|(_, c)| c.open.load(Ordering::SeqCst) && c.proxy_id.as_deref() == Some(proxy))
            .map(|(i, c)| (i, c.tx.clone()))
    }

    /// Waits until `proxy` is connected; `context` says what to show if not.
    pub async fn wait_connected(&self, proxy: &str, timeout: Duration, context: impl Fn() -> String) {
        let deadline = Instant::now() + timeout;
        while !self.is_connected(proxy) {
            assert!(Instant::now() < deadline, "{proxy} did not register:\n{}", context());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether `proxy` is registered on an open connection.
    pub fn is_connected(&self, proxy: &str) -> bool {
        self.of_proxy(proxy).is_some()
    }

    /// The peer address `proxy` registered from.
    pub fn peer_of(&self, proxy: &str) -> Option<SocketAddr> {
        let (i, _) = self.of_proxy(proxy)?;
        Some(self.shared.conns.lock().unwrap()[i].peer)
    }

    /// Sends `msg` to the daemon registered as `proxy`, and routes its
    /// `run_id` there, as the backend binds a run to one proxy.
    pub fn send_to(&self, proxy: &str, msg: &Value) {
        let (_, tx) = self.of_proxy(proxy).unwrap_or_else(|| panic!("proxy {proxy} is not connected"));
        if let Some(run) = msg["run_id"].as_str() {
            let mut routes = self.shared.routes.lock().unwrap();
            let route = routes.entry(run.to_string()).or_insert_with(|| (proxy.to_string(), 0));
            route.0 = proxy.to_string();
            if msg["type"] == "acp_open" || msg["type"] == "prompt_send" {
                route.1 += 1;
            }
        }
        tx.send(Cmd::Text(msg.to_string())).unwrap();
    }

    /// Runs whose requests were pending when their proxy went away (the
    /// backend rejects them): (run_id, reason).
    pub fn failed_runs(&self) -> Vec<(String, String)> {
        self.shared.failed.lock().unwrap().clone()
    }

    /// Messages received from the connections registered as `proxy`.
    pub fn received_from(&self, proxy: &str) -> Vec<Received> {
        let ids: Vec<usize> = {
            let conns = self.shared.conns.lock().unwrap();
            (0..conns.len()).filter(|&i| conns[i].proxy_id.as_deref() == Some(proxy)).collect()
        };
        self.received().into_iter().filter(|r| ids.contains(&r.conn)).collect()
    }

    /// The Authorization header of connection `i`.
    pub fn auth(&self, i: usize) -> Option<String> {
        self.shared.conns.lock().unwrap()[i].auth.clone()
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// Messages of connection `conn`.
    pub fn of_conn(&self, conn: usize) -> Vec<Value> {
        self.received().into_iter().filter(|r| r.conn == conn).map(|r| r.msg).collect()
    }

    fn latest(&self) -> mpsc::UnboundedSender<Cmd> {
        let conns = self.shared.conns.lock().unwrap();
        conns.iter().rev().find(|c| c.open.load(Ordering::SeqCst)).expect("no open connection").tx.clone()
    }

    /// Sends `msg` on the newest open connection.
    pub fn send(&self, msg: &Value) {
        self.latest().send(Cmd::Text(msg.to_string())).unwrap();
    }

    pub fn send_raw(&self, text: &str) {
        self.latest().send(Cmd::Text(text.to_string())).unwrap();
    }

    pub fn send_binary(&self, bytes: &[u8]) {
        self.latest().send(Cmd::Binary(bytes.to_vec())).unwrap();
    }

    pub fn close(&self, code: u16, reason: &str) {
        self.latest().send(Cmd::Close(code, reason.to_string())).unwrap();
    }

    /// Drops the newest connection's socket without a close frame.
    pub fn drop_conn(&self) {
        self.latest().send(Cmd::Drop).unwrap();
    }

    /// Waits until a received message satisfies `pred`; returns it.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Received) -> bool,
    ) -> Received {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.received().into_iter().find(|r| pred(r)) {
                return r;
            }
            if Instant::now() > deadline {
                let types: Vec<String> =
                    self.received().iter().map(|r| format!("{}:{}", r.conn, r.msg["type"])).collect();
                panic!("timed out after {timeout:?} waiting for {what}; received: {types:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for a message of `type` with `field == value`.
    pub async fn wait_type(&self, kind: &str, field: &str, value: &Value, timeout: Duration) -> Value {
        self.wait_for(&format!("{kind} with {field}={value}"), timeout, |r| {
            r.msg["type"] == kind && &r.msg[field] == value
        })
        .await
        .msg
    }

    /// Waits for the `sandbox_control_result` of `request_id`.
    pub async fn result(&self, request_id: &str) -> Value {
        self.wait_type("sandbox_control_result", "request_id", &json!(request_id), Duration::from_secs(20))
            .await
    }

    /// Waits for the first `register_agent` of connection `conn`.
    pub async fn registered(&self, conn: usize, timeout: Duration) {
        self.wait_for(&format!("register_agent on connection {conn}"), timeout, |r| {
            r.conn == conn && r.msg["type"] == "register_agent"
        })
        .await;
    }

    /// Sends a control and returns its result.
    pub async fn control(&self, mut msg: Value) -> Value {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let id = format!("req-{}", NEXT.fetch_add(1, Ordering::SeqCst));
        msg["type"] = json!("sandbox_control");
        msg["request_id"] = json!(id);
        self.send(&msg);
        self.result(&id).await
    }
}

async fn serve<S>(s: Arc<Shared>, stream: S, peer: SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let auth = Arc::new(Mutex::new(None));
    let auth2 = auth.clone();
    // The callback's error type is tungstenite's (large) HTTP response.
    #[allow(clippy::result_large_err)]
    let callback = move |req: &Request, resp: Response| {
        *auth2.lock().unwrap() =
            req.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
        Ok(resp)
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await else { return };
    let auth = auth.lock().unwrap().clone();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let open = Arc::new(AtomicBool::new(true));
    let conn = {
        let mut conns = s.conns.lock().unwrap();
        conns.push(Conn { auth: auth.clone(), tx, open: open.clone(), peer, proxy_id: None });
        conns.len() - 1
    };
    let valid = s.valid_tokens.lock().unwrap().clone();
    if let Some(valid) = valid {
        let ok = auth
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "))
            .is_some_and(|t| valid.iter().any(|v| v == t));
        if !ok {
            let _ =
                ws.close(Some(CloseFrame { code: CloseCode::Policy, reason: "Unauthorized".into() })).await;
            open.store(false, Ordering::SeqCst);
            return;
        }
    }
    loop {
        tokio::select! {
            frame = ws.next() => match frame {
                Some(Ok(Message::Text(text))) => {
                    wire_log(&text);
                    let msg: Value = serde_json::from_str(&text).unwrap_or(json!({"unparsable": text.to_string()}));
                    let register = msg["type"] == "register_agent";
                    // This message's own id: `received` is shared by every
                    // connection, so its last entry may be another's by now.
                    let id = msg["agent"]["id"].as_str().map(str::to_string);
                    if (msg["type"] == "acp_opened" || msg["type"] == "prompt_result")
                        && let Some(run) = msg["run_id"].as_str()
                        && let Some(route) = s.routes.lock().unwrap().get_mut(run)
                    {
                        route.1 = route.1.saturating_sub(1);
                    }
                    s.received.lock().unwrap().push(Received { conn, msg, at: Instant::now() });
                    if register {
                        let mut action = s.on_register.lock().unwrap().clone();
                        {
                            let mut conns = s.conns.lock().unwrap();
                            let taken = conns.iter().enumerate().any(|(i, c)| {
                                i != conn && c.open.load(Ordering::SeqCst) && c.proxy_id.is_some() && c.proxy_id == id
                            });
                            if taken && s.refuse_duplicate_ids.load(Ordering::SeqCst) {
                                action = Some(OnRegister::Close(4409, "proxy_id_conflict".into()));
                            } else {
                                conns[conn].proxy_id = id;
                            }
                        }
                        match action {
                            Some(OnRegister::Close(code, reason)) => {
                                let _ = ws.close(Some(CloseFrame { code: CloseCode::from(code), reason: reason.into() })).await;
                            }
                            _ => {
                                let _ = ws.send(Message::text(json!({"type":"register_ack","success":true}).to_string())).await;
                            }
                        }
                    }
                }
                Some(Ok(Message::Close(_))) => {
                    // The answer went out with this read; the socket stays.
                    let linger = *s.linger_after_close.lock().unwrap();
                    if let Some(d) = linger {
                        let _ = ws.flush().await;
                        tokio::time::sleep(d).await;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            },
            cmd = rx.recv() => match cmd {
                Some(Cmd::Text(t)) => { let _ = ws.send(Message::text(t)).await; }
                Some(Cmd::Binary(b)) => { let _ = ws.send(Message::binary(b)).await; }
                Some(Cmd::Close(code, reason)) => {
                    let _ = ws.close(Some(CloseFrame { code: CloseCode::from(code), reason: reason.into() })).await;
                }
                Some(Cmd::Drop) | None => break,
            }
        }
    }
    open.store(false, Ordering::SeqCst);
    // As the backend does when a proxy's socket closes: what was routed to
    // it fails, unless the proxy is connected again on another socket.
    let proxy = s.conns.lock().unwrap()[conn].proxy_id.clone();
    if let Some(proxy) = proxy {
        let still = s
            .conns
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.open.load(Ordering::SeqCst) && c.proxy_id.as_deref() == Some(proxy.as_str()));
        if !still {
            let mut routes = s.routes.lock().unwrap();
            let mut failed = s.failed.lock().unwrap();
            for (run, route) in routes.iter_mut().filter(|(_, (p, pending))| *p == proxy && *pending > 0) {
                route.1 = 0;
                failed.push((run.clone(), format!("proxy {proxy} disconnected")));
            }
        }
    }
}

/// A minimal HTTP/1.1 server for `POST /api/admin/acp-proxy/register`:
/// checks the bootstrap header, answers `{success, data:{token}}` with the
/// next token of `tokens`. Returns its URL and the number of calls so far.
pub async fn register_endpoint(secret: &'static str, tokens: Vec<String>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url =
        format!("http://127.0.0.1:{}/api/admin/acp-proxy/register", listener.local_addr().unwrap().port());
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else { continue };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // Read the head, then the body by Content-Length.
            let (head, body) = loop {
                let n = tcp.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    break (String::new(), Vec::new());
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..pos]).to_string();
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    let mut body = buf[pos + 4..].to_vec();
                    while body.len() < len {
                        let n = tcp.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            break;
                        }
                        body.extend_from_slice(&chunk[..n]);
                    }
                    break (head, body);
                }
            };
            let lower = head.to_ascii_lowercase();
            let authorized = lower.contains(&format!("x-acp-proxy-bootstrap: {secret}"));
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let (status, reply) = if !head.starts_with("POST /api/admin/acp-proxy/register ") {
                ("404 Not Found", json!({"success":false}))
            } else if !authorized {
                (
                    "401 Unauthorized",
                    json!({"success":false,"error":{"code":"UNAUTHORIZED","message":"bootstrap token 无效"}}),
                )
            } else if body["proxyId"].as_str().is_none_or(str::is_empty) {
                ("400 Bad Request", json!({"success":false}))
            } else {
                let n = c.fetch_add(1, Ordering::SeqCst);
                let token = tokens.get(n).or(tokens.last()).cloned().unwrap_or_default();
                ("200 OK", json!({"success":true,"data":{"token":token}}))
            };
            let text = reply.to_string();
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                text.len()
            );
            let _ = tcp.write_all(resp.as_bytes()).await;
            let _ = tcp.shutdown().await;
        }
    });
    (url, calls)
}

/// A JWT-shaped token (unsigned: the fake backend compares strings).
pub fn jwt(label: &str, exp_in_secs: i64) -> String {
    use base64::Engine;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let b = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.sig-{label}",
        b(&json!({"alg":"HS256","typ":"JWT"})),
        b(&json!({"type":"acp_proxy","proxyId":"p","iat":now,"exp":now + exp_in_secs}))
    )
}

/// Scratch directory of one test: state, workspace root, config.
pub struct Scratch {
    pub dir: PathBuf,
    pub state: PathBuf,
    pub root: PathBuf,
}

impl Scratch {
    pub fn new(label: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tuixiu-proxy-{}-{}-{label}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.join("workspaces");
        std::fs::create_dir_all(&root).unwrap();
        Scratch { state: dir.join("state"), root, dir }
    }

    /// A config with short intervals for tests; `extra` is appended to the
    /// top level, `sandbox_extra` to `[sandbox]`.
    pub fn config(&self, url: &str, extra: &str, sandbox_extra: &str) -> String {
        let mut top = format!("orchestrator_url = \"{url}\"\nstate_dir = \"{}\"\n", self.state.display());
        for line in [
            "heartbeat_seconds = 1",
            "inventory_interval_seconds = 0",
            "reconnect_max_seconds = 1",
            "keepalive_min_seconds = 1",
        ] {
            let key = line.split(' ').next().unwrap();
            if !extra.lines().any(|l| l.trim_start().starts_with(&format!("{key} "))) {
                top.push_str(line);
                top.push('\n');
            }
        }
        format!(
            "{top}{extra}\n[agent]\nid = \"proxy-test\"\n\n[sandbox]\nworkspaceHostRoot = \"{}\"\n{sandbox_extra}\n",
            self.root.display()
        )
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The daemon process.
pub struct Daemon {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `tuixiu-sandbox proxy --config <dir>/<name>.toml` with `config`.
    pub fn start(scratch: &Scratch, name: &str, config: &str) -> Daemon {
        Self::start_env(scratch, name, config, &[])
    }

    pub fn start_env(scratch: &Scratch, name: &str, config: &str, env: &[(&str, &str)]) -> Daemon {
        Self::spawn(scratch, name, config, env, &[], &[])
    }

    /// Starts the daemon as uid/gid 65534 (`nested`: inside `unshare -U -r`
    /// as well), with the scratch directory handed to that user.
    pub fn start_unprivileged(scratch: &Scratch, name: &str, config: &str, nested: bool) -> Daemon {
        Self::start_unprivileged_env(scratch, name, config, nested, &[])
    }

    /// As [`Daemon::start_unprivileged`], with variables for the daemon.
    pub fn start_unprivileged_env(
        scratch: &Scratch,
        name: &str,
        config: &str,
        nested: bool,
        env: &[(&str, &str)],
    ) -> Daemon {
        let chown = |p: &Path| std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        chown(&scratch.dir);
        chown(&scratch.root);
        let mut wrapper = vec!["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"];
        if nested {
            wrapper.extend(["unshare", "-U", "-r"]);
        }
        Self::spawn(scratch, name, config, env, &wrapper, &[])
    }

    /// Starts the daemon through `wrapper` (e.g. `nsenter --target PID --net --`).
    pub fn start_wrapped(
        scratch: &Scratch,
        name: &str,
        config: &str,
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Daemon {
        Self::spawn(scratch, name, config, env, wrapper, &[])
    }

    /// Starts the daemon with more `proxy` options after `--config`.
    pub fn start_args(scratch: &Scratch, name: &str, config: &str, args: &[&str]) -> Daemon {
        Self::spawn(scratch, name, config, &[], &[], args)
    }

    /// As [`Daemon::start_args`], with variables for the daemon.
    pub fn start_args_env(
        scratch: &Scratch,
        name: &str,
        config: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        Self::spawn(scratch, name, config, env, &[], args)
    }

    fn spawn(
        scratch: &Scratch,
        name: &str,
        config: &str,
        env: &[(&str, &str)],
        wrapper: &[&str],
        args: &[&str],
    ) -> Daemon {
        let path = scratch.dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let log = scratch.dir.join(format!("{name}.log"));
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(binary());
                c
            }
            None => Command::new(binary()),
        };
        cmd.args(["proxy", "--config"]).arg(&path).args(args);
        cmd.env_clear();
        cmd.env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        cmd.env("TUIXIU_LOG", "debug");
        cmd.env("HOME", &scratch.dir);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("spawn tuixiu-sandbox proxy");
        Daemon { child: Some(child), log }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            if Instant::now() > deadline {
                panic!("the daemon did not exit within {timeout:?}; stderr:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// SIGTERM, then waits (the daemon closes its link properly).
    pub fn stop(&mut self) -> ExitStatus {
        if let Some(child) = &self.child {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        self.wait_exit(Duration::from_secs(15))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub const SECS: Duration = Duration::from_secs(1);

/// The launcher, installed where every user can execute it (the checkout
/// may not be reachable for uid 65534), with the full tool next to it.
pub fn binary() -> &'static Path {
    install::launcher()
}

/// The positions of messages in `msgs` by type, for order checks.
pub fn position(msgs: &[Value], pred: impl Fn(&Value) -> bool) -> Option<usize> {
    msgs.iter().position(pred)
}

/// The run state file at `path` once it satisfies `pred`. Lanes hand run
/// state to a background writer (src/proxy/persist.rs) and, except for
/// `acp_opened`, reply without waiting for it, so a reply can reach the
/// backend before the file is replaced: wait (bounded) for the write rather
/// than racing it.
pub async fn persisted(path: &Path, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: Option<Value> = std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok());
        match now {
            Some(v) if pred(&v) => return v,
            _ if Instant::now() > deadline => {
                panic!("{what}: {} never reached the expected state (now: {now:?})", path.display())
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Waits (bounded) until the run state file at `path` is gone.
pub async fn unpersisted(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while path.exists() {
        assert!(Instant::now() < deadline, "{what}: {} still exists", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
