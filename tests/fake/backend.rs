//! The fake tuixiu backend, one for every test and benchmark: a real
//! WebSocket server (tokio-tungstenite) on loopback that the real daemon
//! connects to. Two ways to drive it:
//!
//! * [`Backend`], for the tests: a server that accepts any number of
//!   connections (optionally over rustls), records every message it
//!   receives and answers `register_agent` itself. Like the real backend it
//!   keeps the proxy id each connection registered and can route by it
//!   ([`Backend::send_to`]): with several daemons it remembers which proxy
//!   each run was dispatched to, marks a proxy's runs failed when its
//!   connection goes away ("proxy disconnected"), and, with
//!   [`Backend::refuse_duplicate_ids`], refuses a second connection with an
//!   id that is already connected (close 4409 `proxy_id_conflict`:
//!   docs/protocol.md, "Identity and proxy_id_conflict"). Also a tiny real
//!   HTTP endpoint for the bootstrap registration ([`register_endpoint`]).
//! * [`link`], for the benchmarks: one connection read and written by the
//!   caller's own task, nothing recorded, so that the backend is never what
//!   a measurement measures (the relay benchmark classifies a million
//!   updates by substring search on the raw text).
//!
//! Both answer `register_agent` with the same [`register_ack`].

pub mod link;

use std::net::SocketAddr;
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

/// The backend's answer to an accepted `register_agent`.
pub fn register_ack() -> Message {
    Message::text(json!({"type":"register_ack","success":true}).to_string())
}

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
    /// While set, no connection reads (a backend too busy to read: what
    /// the daemon writes stays in socket buffers, its pings unanswered).
    reads_paused: AtomicBool,
    reads_resumed: tokio::sync::Notify,
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

    /// A `wss://localhost:<port>/ws/agent` backend with this server
    /// configuration; `plain`: a `ws://127.0.0.1` one.
    pub async fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let url = match tls {
            Some(_) => format!("wss://localhost:{}/ws/agent", addr.port()),
            None => format!("ws://127.0.0.1:{}/ws/agent", addr.port()),
        };
        Self::serve_on(listener, tls, url)
    }

    /// A backend on a listener made elsewhere (e.g. bound inside a network
    /// namespace of the test's own), over TLS when `tls` is given. `url` is
    /// what `self.url` says.
    pub fn start_on_with(
        listener: std::net::TcpListener,
        tls: Option<Arc<rustls::ServerConfig>>,
        url: String,
    ) -> Backend {
        listener.set_nonblocking(true).unwrap();
        let listener = TcpListener::from_std(listener).unwrap();
        Self::serve_on(listener, tls, url)
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

    /// Stops (`true`) or resumes reading on every connection.
    pub fn pause_reads(&self, on: bool) {
        self.shared.reads_paused.store(on, Ordering::SeqCst);
        if !on {
            self.shared.reads_resumed.notify_waiters();
        }
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
        let resumed = s.reads_resumed.notified();
        tokio::pin!(resumed);
        resumed.as_mut().enable();
        let paused = s.reads_paused.load(Ordering::SeqCst);
        tokio::select! {
            _ = &mut resumed, if paused => {}
            frame = ws.next(), if !paused => match frame {
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
                                let _ = ws.send(register_ack()).await;
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
