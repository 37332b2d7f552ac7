//! The link to the backend: one WebSocket at a time, reconnected forever
//! with capped exponential backoff and jitter.
//!
//! Per connection, in order: TCP (+ TLS for `wss://`, config re-read from
//! disk), the upgrade with `Authorization: Bearer <token>`, `register_agent`,
//! wait for `register_ack` (bounded: the backend handles messages
//! concurrently, so a reply sent before its registration completed could
//! hit "agent not registered"), `sandbox_inventory`, `workspace_inventory`,
//! then the outbox is drained in order while heartbeats and periodic
//! inventories run. A WebSocket ping goes out with every heartbeat; a
//! connection that shows no sign of life for three heartbeats is dropped.
//!
//! Endings:
//! * close 1008 / HTTP 401: the token is re-obtained before the next try;
//! * `proxy_id_conflict`: the daemon exits non-zero (docs/protocol.md,
//!   "Identity and proxy_id_conflict");
//! * shutdown: a proper close handshake (1000), so the backend removes
//!   this socket before any successor registers (docs/protocol.md,
//!   "Identity and proxy_id_conflict").

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::Daemon;
use super::auth::TokenSource;
use super::config::url_parts;
use super::protocol::{Incoming, Kind, RegisterAgent};
use super::unread::Unread;

pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}
type Ws = WebSocketStream<Box<dyn Io>>;

/// How a link session ended.
#[derive(Debug)]
enum End {
    /// Reconnect (after backoff). `healthy`: the session got registered.
    Retry { reason: String, healthy: bool },
    /// The token was refused: get a new one, then reconnect.
    Unauthorized(String),
    /// The backend refuses this proxy id: exit.
    Conflict(String),
    /// The daemon is shutting down.
    Shutdown,
}

/// Why the daemon stops for good.
#[derive(Debug)]
pub enum Exit {
    Shutdown,
    Conflict(String),
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
const BACKOFF_START: Duration = Duration::from_millis(500);
/// Messages written per flush when the outbox has a backlog: up to this
/// many, and about this many bytes. One flush is one `write` (or one TLS
/// record run); at 64 messages a relay of small updates spent a syscall
/// per 13 KB.
const OUTBOX_BATCH: usize = 2048;
const OUTBOX_BATCH_BYTES: usize = 256 * 1024;
/// Incoming frames are read in pieces of up to this size (tungstenite
/// zeroes the free part of its buffer before every read attempt: 128 KiB
/// by default, at each wake-up of the link; larger frames still arrive
/// whole, the buffer grows for them).
const READ_BUFFER: usize = 16 * 1024;

/// Runs the link on a thread of its own (a current-thread runtime of its
/// own): the socket is read, the outbox drained and heartbeats sent
/// however busy the runs' event loop is. Messages are routed from there to
/// the lanes, which live on the runs' loop (`RunContext::spawn`). Should the
/// thread not start, the link runs here.
pub async fn run_apart(d: Arc<Daemon>, shutdown: tokio::sync::watch::Receiver<bool>) -> Exit {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (dd, stop) = (d.clone(), shutdown.clone());
    let started = std::thread::Builder::new().name("link".into()).spawn(move || {
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => {
                let _ = tx.send(Some(rt.block_on(run(dd, stop))));
            }
            Err(e) => {
                tracing::warn!("link: no runtime of its own ({e}); it shares the runs' thread");
                let _ = tx.send(None);
            }
        }
    });
    if let Err(e) = started {
        tracing::warn!("link: no thread of its own ({e}); it shares the runs' thread");
        return run(d, shutdown).await;
    }
    match rx.await {
        Ok(Some(exit)) => exit,
        _ => run(d, shutdown).await,
    }
}

/// Runs the link until shutdown or an id conflict.
pub async fn run(d: Arc<Daemon>, mut shutdown: tokio::sync::watch::Receiver<bool>) -> Exit {
    let mut tokens = TokenSource::new(d.cfg(), d.link_secrets(), d.proxy_id());
    let mut backoff = BACKOFF_START;
    let cap = Duration::from_secs(d.cfg().reconnect_max_seconds);
    loop {
        if *shutdown.borrow() {
            return Exit::Shutdown;
        }
        let end = attempt(&d, &mut tokens, &mut shutdown).await;
        let delay = match end {
            End::Shutdown => return Exit::Shutdown,
            End::Conflict(reason) => return Exit::Conflict(reason),
            End::Unauthorized(reason) => {
                tracing::warn!("link: {reason}");
                tokens.rejected();
                backoff = (backoff * 2).min(cap);
                jitter(backoff)
            }
            End::Retry { reason, healthy } => {
                if healthy {
                    backoff = BACKOFF_START;
                } else {
                    backoff = (backoff * 2).min(cap);
                }
                tracing::warn!("link: {reason}; reconnecting");
                jitter(backoff)
            }
        };
        tokio::select! {
            _ = sleep(delay) => {}
            _ = shutdown.changed() => return Exit::Shutdown,
        }
    }
}

/// A delay in [d/2, d] (equal jitter: spreads reconnects of many proxies
/// after a backend restart, but never retries immediately).
fn jitter(d: Duration) -> Duration {
    let r = uuid::Uuid::new_v4().as_u128() as u64 % 1000;
    d / 2 + d / 2 * (r as u32) / 1000
}

/// One connection: connect (abandoned at shutdown), then the session
/// (which closes properly at shutdown).
async fn attempt(
    d: &Arc<Daemon>,
    tokens: &mut TokenSource,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> End {
    let ws = tokio::select! {
        r = open(d, tokens) => match r {
            Ok(ws) => ws,
            Err(end) => return end,
        },
        _ = shutdown.changed() => return End::Shutdown,
    };
    session(d, ws, shutdown).await
}

/// The URL without its query (a `?token=` must not reach a log line).
fn shown(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or(url)
}

async fn open(d: &Arc<Daemon>, tokens: &mut TokenSource) -> Result<Ws, End> {
    let url = d.cfg().orchestrator_url.clone();
    let shown = shown(&url);
    let parts = url_parts(&url).map_err(|e| End::Retry { reason: e.to_string(), healthy: false })?;
    let tls = if parts.scheme == "wss" {
        Some(
            super::tls::client_config(&d.cfg().tls)
                .map_err(|e| End::Retry { reason: e.to_string(), healthy: false })?,
        )
    } else {
        None
    };
    let tls_for_http = || super::tls::client_config(&d.cfg().tls).ok();
    let token =
        tokens.token(tls_for_http).await.map_err(|e| End::Retry { reason: e.to_string(), healthy: false })?;
    match connect(&url, &parts, tls, token.as_ref().map(|t| t.expose())).await {
        Ok(ws) => {
            tracing::info!("link: connected to {shown}");
            Ok(ws)
        }
        Err(ConnectError::Unauthorized(status)) => {
            Err(End::Unauthorized(format!("{shown}: the backend refused the token (HTTP {status})")))
        }
        Err(ConnectError::Other(reason)) => {
            Err(End::Retry { reason: format!("{url}: {reason}"), healthy: false })
        }
    }
}

enum ConnectError {
    Unauthorized(u16),
    Other(String),
}

async fn connect(
    url: &str,
    parts: &super::config::UrlParts,
    tls: Option<rustls::ClientConfig>,
    token: Option<&str>,
) -> Result<Ws, ConnectError> {
    let other = |e: &dyn std::fmt::Display| ConnectError::Other(e.to_string());
    let tcp = timeout(CONNECT_TIMEOUT, TcpStream::connect((parts.host.as_str(), parts.port)))
        .await
        .map_err(|_| ConnectError::Other(format!("connect timed out after {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| {
            other(&format!("connect {}:{}: {}", parts.host, parts.port, sandbox::error::io_error_text(&e)))
        })?;
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Io> = match tls {
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from(parts.host.clone())
                .map_err(|e| other(&format!("server name {:?}: {e}", parts.host)))?;
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let tls = timeout(CONNECT_TIMEOUT, connector.connect(name, tcp))
                .await
                .map_err(|_| ConnectError::Other("TLS handshake timed out".into()))?
                .map_err(|e| other(&format!("TLS: {e}")))?;
            Box::new(tls)
        }
        None => Box::new(tcp),
    };
    let mut request = url.into_client_request().map_err(|e| other(&e))?;
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().map_err(|_| {
            ConnectError::Other("the token has characters an HTTP header cannot carry".into())
        })?;
        request.headers_mut().insert("authorization", value);
    }
    let config = WebSocketConfig::default()
        .max_message_size(Some(64 << 20))
        .max_frame_size(Some(16 << 20))
        .read_buffer_size(READ_BUFFER);
    match timeout(CONNECT_TIMEOUT, tokio_tungstenite::client_async_with_config(request, stream, Some(config)))
        .await
    {
        Err(_) => Err(ConnectError::Other("WebSocket handshake timed out".into())),
        Ok(Ok((ws, _))) => Ok(ws),
        Ok(Err(WsError::Http(resp))) if matches!(resp.status().as_u16(), 401 | 403) => {
            Err(ConnectError::Unauthorized(resp.status().as_u16()))
        }
        Ok(Err(WsError::Http(resp))) => {
            Err(ConnectError::Other(format!("upgrade refused: HTTP {}", resp.status())))
        }
        Ok(Err(e)) => Err(other(&e)),
    }
}

/// Sends one text message.
async fn send_text(ws: &mut Ws, text: &str) -> Result<(), WsError> {
    ws.send(Message::text(text)).await
}

/// What a received frame means for the session.
enum Rx {
    Continue,
    Ack,
    End(End),
}

/// Handles one frame: pongs and pings are liveness, text is dispatched.
fn on_frame(d: &Arc<Daemon>, msg: Result<Message, WsError>) -> Rx {
    match msg {
        Ok(Message::Text(text)) => match Incoming::decode(&text) {
            Ok(Incoming::RegisterAck(ack)) => {
                if ack.success == serde_json::Value::Bool(false) {
                    tracing::error!(
                        "link: the backend refused register_agent: {}",
                        super::protocol::error_text(&ack.error)
                    );
                }
                Rx::Ack
            }
            Ok(Incoming::IdConflict { reason }) => Rx::End(End::Conflict(reason)),
            Ok(msg) => {
                d.dispatch(msg);
                Rx::Continue
            }
            Err(e) => {
                // Never log the frame itself: it may carry init.env secrets.
                tracing::warn!("link: dropped an incoming frame ({} bytes): {e}", text.len());
                Rx::Continue
            }
        },
        Ok(Message::Binary(b)) => {
            tracing::warn!("link: dropped a binary frame ({} bytes): the protocol is text only", b.len());
            Rx::Continue
        }
        Ok(Message::Close(frame)) => Rx::End(close_end(frame)),
        Ok(_) => Rx::Continue,
        Err(e) => Rx::End(End::Retry { reason: format!("read: {e}"), healthy: true }),
    }
}

fn close_end(frame: Option<CloseFrame>) -> End {
    let (code, reason) = match &frame {
        Some(f) => (u16::from(f.code), f.reason.to_string()),
        None => (1005, String::new()),
    };
    if reason.contains("proxy_id_conflict") || reason.contains("proxy_id_taken_over") {
        return End::Conflict(format!("the backend closed the link: {code} {reason}"));
    }
    if code == 1008 {
        return End::Unauthorized(format!("the backend closed the link: 1008 {reason}"));
    }
    End::Retry { reason: format!("the backend closed the link: {code} {reason}"), healthy: true }
}

/// One registered session. Only a `register_ack` makes it count as healthy
/// for the backoff: a backend that accepts the WebSocket and then closes it
/// (or goes silent) before acknowledging the registration is retried with
/// a growing delay (docs/proxy.md, "The link").
async fn session(d: &Arc<Daemon>, ws: Ws, shutdown: &mut tokio::sync::watch::Receiver<bool>) -> End {
    let mut acked = false;
    match session_inner(d, ws, shutdown, &mut acked).await {
        End::Retry { reason, .. } => End::Retry { reason, healthy: acked },
        other => other,
    }
}

async fn session_inner(
    d: &Arc<Daemon>,
    mut ws: Ws,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    acked: &mut bool,
) -> End {
    let register = register_message(d);
    if let Err(e) = send_text(&mut ws, &register).await {
        return End::Retry { reason: format!("send register_agent: {e}"), healthy: false };
    }
    // Wait for register_ack; other frames are handled meanwhile.
    let ack_deadline = Instant::now() + Duration::from_secs(d.cfg().register_ack_timeout_seconds);
    loop {
        tokio::select! {
            frame = ws.next() => match frame {
                None => return End::Retry { reason: "closed before register_ack".into(), healthy: false },
                Some(frame) => match on_frame(d, frame) {
                    Rx::Ack => {
                        *acked = true;
                        break;
                    }
                    Rx::Continue => {}
                    Rx::End(end) => return finish(ws, end).await,
                },
            },
            _ = tokio::time::sleep_until(ack_deadline) => {
                tracing::warn!(
                    "link: no register_ack within {} s; going on (the backend may be an older version)",
                    d.cfg().register_ack_timeout_seconds
                );
                break;
            }
            _ = shutdown.changed() => return finish(ws, End::Shutdown).await,
        }
    }
    tracing::info!("link: registered as {}", d.proxy_id());
    // Inventories right after registering (docs/protocol.md, "Connection
    // lifecycle").
    for text in d.inventories().await.into_iter().flatten() {
        if let Err(e) = send_text(&mut ws, &text).await {
            return End::Retry { reason: format!("send inventory: {e}"), healthy: false };
        }
    }
    for notice in d.outbox().take_overflow_notices() {
        if let Err(e) = send_text(&mut ws, &notice).await {
            return End::Retry { reason: format!("send: {e}"), healthy: false };
        }
    }
    d.set_connected(true);
    let end = registered(d, &mut ws, shutdown).await;
    d.set_connected(false);
    finish(ws, end).await
}

/// The registered phase: outbox, heartbeats, inventories, liveness. A
/// heartbeat (or inventory) that is due goes before the next batch of the
/// outbox (a backlog that never empties while runs relay must not starve
/// it), so it waits at most for the batch being written. Bulk messages
/// wait while the backend has a window's worth left to read
/// (`unread.rs`); control answers never do.
async fn registered(d: &Arc<Daemon>, ws: &mut Ws, shutdown: &mut tokio::sync::watch::Receiver<bool>) -> End {
    let beat = Duration::from_secs(d.cfg().heartbeat_seconds);
    let mut heartbeat = tokio::time::interval_at(Instant::now() + beat, beat);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let inv_every = Duration::from_secs(d.cfg().inventory_interval_seconds.max(1));
    let mut inventory_tick = tokio::time::interval_at(Instant::now() + inv_every, inv_every);
    inventory_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let inventories = d.cfg().inventory_interval_seconds > 0;
    let dead_after = beat * 3 + Duration::from_secs(10);
    let mut last_rx = Instant::now();
    let mut unread = Unread::default();
    loop {
        let bulk_room = unread.room(Instant::now()).map(|r| usize::try_from(r).unwrap_or(usize::MAX));
        let probe = unread.probe_deadline().filter(|_| bulk_room.is_none());
        tokio::select! {
            biased;
            _ = shutdown.changed() => return End::Shutdown,
            frame = ws.next() => {
                last_rx = Instant::now();
                match frame {
                    None => return End::Retry { reason: "the connection was closed".into(), healthy: true },
                    Some(Ok(Message::Pong(payload))) => unread.pong(&payload),
                    Some(frame) => match on_frame(d, frame) {
                        Rx::Continue | Rx::Ack => {}
                        Rx::End(end) => return end,
                    },
                }
            }
            _ = heartbeat.tick() => {
                if last_rx.elapsed() > dead_after {
                    return End::Retry {
                        reason: format!("nothing received for {:?} (not even a pong)", last_rx.elapsed()),
                        healthy: true,
                    };
                }
                let hb = super::protocol::Heartbeat::new(d.proxy_id(), super::now_iso());
                let text = serde_json::to_string(&hb).expect("plain data");
                if let Err(e) = send_text(ws, &text).await {
                    return End::Retry { reason: format!("send heartbeat: {e}"), healthy: true };
                }
                unread.wrote(text.len());
                if let Err(e) = ws.send(Message::Ping(Vec::new().into())).await {
                    return End::Retry { reason: format!("send ping: {e}"), healthy: true };
                }
            }
            _ = inventory_tick.tick(), if inventories => {
                for text in d.inventories().await.into_iter().flatten() {
                    if let Err(e) = send_text(ws, &text).await {
                        return End::Retry { reason: format!("send inventory: {e}"), healthy: true };
                    }
                    unread.wrote(text.len());
                }
            }
            // The window closed before the backend ever answered a ping:
            // wake to give up waiting for one (`unread.rs`).
            _ = tokio::time::sleep_until(probe.unwrap_or_else(Instant::now)), if probe.is_some() => {}
            batch = d.outbox().peek_batch(OUTBOX_BATCH, OUTBOX_BATCH_BYTES, bulk_room) => {
                // Write the batch and a window ping, flush once, and only
                // then drop it from the outbox: a failure keeps it for the
                // next connection.
                for text in batch.texts() {
                    if let Err(e) = ws.feed(Message::Text(text.clone())).await {
                        return End::Retry { reason: format!("send: {e}"), healthy: true };
                    }
                    unread.wrote(text.len());
                }
                if let Some(payload) = unread.ping(Instant::now())
                    && let Err(e) = ws.feed(Message::Ping(payload.to_vec().into())).await
                {
                    return End::Retry { reason: format!("send ping: {e}"), healthy: true };
                }
                if let Err(e) = ws.flush().await {
                    return End::Retry { reason: format!("send: {e}"), healthy: true };
                }
                d.outbox().pop_sent(&batch);
            }
        }
    }
}

/// Ends a session: for our own endings, a close handshake (1000 on
/// shutdown); for the backend's close, the reply to it.
async fn finish(mut ws: Ws, end: End) -> End {
    let frame = match &end {
        End::Shutdown => Some(CloseFrame { code: CloseCode::Normal, reason: "proxy shutting down".into() }),
        End::Conflict(_) => Some(CloseFrame { code: CloseCode::Normal, reason: "proxy_id_conflict".into() }),
        End::Retry { .. } | End::Unauthorized(_) => {
            Some(CloseFrame { code: CloseCode::Away, reason: "reconnecting".into() })
        }
    };
    // `close` sends our Close (or completes the reply to the peer's) and
    // flushes; then wait for the peer's Close so the backend has removed
    // this socket before the next one registers. Its Close ends the wait:
    // a backend (or a proxy in front of it) may keep the TCP connection
    // open after the handshake, and nothing is left to wait for.
    let shutdown = matches!(end, End::Shutdown);
    if shutdown {
        tracing::info!(
            "shutting down: closing the link (waiting for the backend's close, at most {CLOSE_TIMEOUT:?})"
        );
    }
    let answered = timeout(CLOSE_TIMEOUT, async {
        if ws.close(frame).await.is_ok() {
            while let Some(Ok(m)) = ws.next().await {
                if m.is_close() {
                    break;
                }
            }
        }
    })
    .await;
    if shutdown && answered.is_err() {
        tracing::warn!("shutting down: the backend did not answer the close within {CLOSE_TIMEOUT:?}");
    }
    end
}

fn register_message(d: &Daemon) -> String {
    let msg = RegisterAgent {
        kind: Kind::REGISTER_AGENT,
        agent: super::protocol::AgentInfo {
            id: d.proxy_id().to_string(),
            name: d.cfg().agent.name.clone().unwrap_or_else(|| d.proxy_id().to_string()),
            max_concurrent: d.cfg().agent.max_concurrent,
            capabilities: d.capabilities(),
        },
        auth: d.link_secrets().register_hmac_secret.as_ref().map(|secret| {
            let timestamp = super::now_iso();
            let signature =
                super::signing::hmac_hex(secret.expose(), format!("{}.{timestamp}", d.proxy_id()).as_bytes());
            super::protocol::RegisterAuth {
                kind: Kind::HMAC_SHA256,
                proxy_id: d.proxy_id().to_string(),
                timestamp,
                signature,
            }
        }),
    };
    serde_json::to_string(&msg).expect("plain data")
}
