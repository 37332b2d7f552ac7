//! NDJSON JSON-RPC 2.0 over an agent's stdio (docs/acp.md, "Prompts and
//! sessions").
//!
//! Messages are never re-typed: the daemon relays what the agent says without a
//! typed round trip, so fields and update kinds newer than this code survive
//! (docs/acp.md, "Prompts and sessions"). A line is first read as an envelope
//! whose members stay raw JSON text ([`RawValue`]): a notification's `params`
//! reach the handler as the agent wrote them (the `session/update` relay copies
//! them into the backend message without building a tree), while requests and
//! responses become [`serde_json::Value`]s.
//!
//! * Our requests get integer ids from 1; responses are matched by id.
//!   The agent's own ids (integers or strings) live in a separate space
//!   and are echoed back untouched.
//! * Agent→client requests are each served by their own task, so a slow
//!   `terminal/wait_for_exit` or a pending permission never holds up the
//!   requests behind it (the Node proxy served them one at a time).
//!   `$/cancel_request` aborts the task and answers `-32800`; every
//!   request gets exactly one response (a request reusing the id of one
//!   still being served is answered `-32600` at once).
//! * Notifications are handed over in order, on the reader task.
//! * Writes go through one writer task: lines never interleave.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// JSON-RPC error codes used here (schema `ErrorCode`).
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    pub const REQUEST_CANCELLED: i64 = -32800;
    pub const AUTH_REQUIRED: i64 = -32000;
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
}

/// Longest line accepted from an agent; a longer one ends the connection
/// (it cannot be a well-formed ACP message the daemon could relay anyway).
pub const MAX_LINE: usize = 256 * 1024 * 1024;

/// The agent's stdout is read in pieces of up to this size (a pipe holds
/// 64 KiB unless the daemon enlarged it).
const READ_BUFFER: usize = 256 * 1024;

/// A JSON-RPC error, ours or the agent's.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), data: None }
    }

    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(code::INVALID_PARAMS, message)
    }

    pub fn internal(message: impl Into<String>) -> RpcError {
        RpcError::new(code::INTERNAL_ERROR, message)
    }

    pub fn not_found(message: impl Into<String>) -> RpcError {
        RpcError::new(code::RESOURCE_NOT_FOUND, message)
    }

    fn to_json(&self) -> Value {
        let mut v = json!({"code": self.code, "message": self.message});
        if let Some(d) = &self.data {
            v["data"] = d.clone();
        }
        v
    }

    fn from_json(v: &Value) -> RpcError {
        RpcError {
            code: v.get("code").and_then(Value::as_i64).unwrap_or(code::INTERNAL_ERROR),
            message: v.get("message").and_then(Value::as_str).unwrap_or("").to_string(),
            data: v.get("data").cloned(),
        }
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

/// Why a request of ours got no result.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CallError {
    #[error("the agent answered {0}")]
    Rpc(RpcError),
    #[error("no answer from the agent within {0:?} ({1})")]
    Timeout(Duration, String),
    #[error("the agent's connection is closed")]
    Closed,
}

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The result of a request the agent made: a tree, or JSON the handler
/// already wrote (a large result serialized off the daemon's thread; the
/// response then only copies it in).
#[derive(Debug)]
pub enum Reply {
    Value(Value),
    Raw(Box<RawValue>),
}

impl From<Value> for Reply {
    fn from(v: Value) -> Reply {
        Reply::Value(v)
    }
}

/// "null", as the params of a request that has none.
fn null_params() -> Box<RawValue> {
    RawValue::from_string("null".into()).expect("null is JSON")
}

/// What the transport hands to its owner.
pub trait Handler: Send + Sync + 'static {
    /// A notification, in arrival order (on the reader task: keep it
    /// quick). `params` is the agent's JSON text, untouched.
    fn notification(&self, method: &str, params: Option<&RawValue>);
    /// A `session/update` notification whose params were split while its
    /// line was read (the usual member order, `method` before `params`);
    /// otherwise it arrives through [`Handler::notification`].
    fn session_update(&self, params: UpdateParams<'_>);
    /// Awaited by the reader before it reads on: lets the owner slow a
    /// fast agent down to the pace its messages leave at.
    fn backpressure(&self) -> Option<BoxFuture<()>> {
        None
    }
    /// A request; the future runs on its own task and its output is the
    /// response. `params` are the agent's JSON text (parsed by the handler,
    /// where it likes: a 16 MB `fs/write_text_file` is parsed off the
    /// daemon's thread).
    fn request(
        self: Arc<Self>,
        id: Value,
        method: String,
        params: Box<RawValue>,
    ) -> BoxFuture<Result<Reply, RpcError>>;
    /// The agent's stdout ended (it exited or closed it).
    fn closed(&self);
}

type Pending = Mutex<HashMap<u64, oneshot::Sender<Result<Value, RpcError>>>>;

/// One connection to one agent process.
pub struct Transport {
    /// `None` once stdin was closed.
    out: Mutex<Option<mpsc::UnboundedSender<String>>>,
    pending: Arc<Pending>,
    /// Agent requests being served: their id (as JSON text) → task.
    serving: Arc<Mutex<HashMap<String, tokio::task::AbortHandle>>>,
    next_id: AtomicU64,
    closed: Arc<AtomicBool>,
}

impl Transport {
    /// Starts the reader and writer tasks over the agent's pipes.
    pub fn start<R, W>(stdout: R, stdin: W, handler: Arc<dyn Handler>) -> Arc<Transport>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel::<String>();
        let t = Arc::new(Transport {
            out: Mutex::new(Some(tx)),
            pending: Arc::new(Mutex::new(HashMap::new())),
            serving: Arc::new(Mutex::new(HashMap::new())),
            next_id: AtomicU64::new(1),
            closed: Arc::new(AtomicBool::new(false)),
        });
        tokio::spawn(write_loop(stdin, rx));
        tokio::spawn(read_loop(stdout, Arc::downgrade(&t), t.pending.clone(), t.closed.clone(), handler));
        t
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Queues one message (already a complete JSON object) for the agent.
    pub fn send_raw(&self, msg: &Value) {
        if let Some(out) = lock(&self.out).as_ref() {
            let _ = out.send(msg.to_string());
        }
    }

    /// Closes the agent's stdin once what is queued has been written.
    pub fn close_stdin(&self) {
        lock(&self.out).take();
    }

    pub fn notify(&self, method: &str, params: Value) {
        self.send_raw(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Allocates an id for a request the caller sends itself (the raw
    /// tunnel); its response arrives on the returned receiver.
    pub fn reserve(&self) -> (u64, oneshot::Receiver<Result<Value, RpcError>>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        if self.is_closed() {
            lock(&self.pending).remove(&id);
        }
        (id, rx)
    }

    /// Sends a request and waits for its result (`None`: no timeout).
    pub async fn call(
        &self,
        method: &str,
        params: Value,
        timeout: Option<Duration>,
    ) -> Result<Value, CallError> {
        if self.is_closed() {
            return Err(CallError::Closed);
        }
        let (id, rx) = self.reserve();
        self.send_raw(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let outcome = match timeout {
            Some(t) => match tokio::time::timeout(t, rx).await {
                Ok(r) => r,
                Err(_) => {
                    lock(&self.pending).remove(&id);
                    return Err(CallError::Timeout(t, method.to_string()));
                }
            },
            None => rx.await,
        };
        match outcome {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(CallError::Rpc(e)),
            Err(_) => Err(CallError::Closed),
        }
    }

    fn respond(&self, id: &Value, result: Result<Reply, RpcError>) {
        let msg = match result {
            Ok(Reply::Value(v)) => json!({"jsonrpc": "2.0", "id": id, "result": v}),
            Ok(Reply::Raw(raw)) => {
                let id = id.to_string();
                let mut line = String::with_capacity(raw.get().len() + id.len() + 36);
                line.push_str(r#"{"jsonrpc":"2.0","id":"#);
                line.push_str(&id);
                line.push_str(r#","result":"#);
                line.push_str(raw.get());
                line.push('}');
                if let Some(out) = lock(&self.out).as_ref() {
                    let _ = out.send(line);
                }
                return;
            }
            Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e.to_json()}),
        };
        self.send_raw(&msg);
    }

    fn serve(self: &Arc<Self>, id: Value, method: String, params: Box<RawValue>, handler: Arc<dyn Handler>) {
        let key = id.to_string();
        let me = Arc::downgrade(self);
        let serving = self.serving.clone();
        let k = key.clone();
        // Registered before the task can finish: the task removes its own
        // entry, under the same lock, to decide who responds.
        let mut map = lock(&self.serving);
        if map.contains_key(&key) {
            // Two requests in flight under one id could not both be
            // answered (nor one of them cancelled): the second is refused.
            drop(map);
            let message = format!("request id {key} is in use by a request still being served");
            self.respond(&id, Err(RpcError::new(code::INVALID_REQUEST, message)));
            return;
        }
        let task = tokio::spawn(async move {
            let result = handler.request(id.clone(), method, params).await;
            let still_ours = lock(&serving).remove(&k).is_some();
            if still_ours && let Some(t) = me.upgrade() {
                t.respond(&id, result);
            }
        });
        map.insert(key, task.abort_handle());
    }

    /// `$/cancel_request {requestId}` from the agent.
    fn cancel_incoming(&self, request_id: &Value) {
        let task = lock(&self.serving).remove(&request_id.to_string());
        if let Some(task) = task {
            task.abort();
            self.respond(request_id, Err(RpcError::new(code::REQUEST_CANCELLED, "request cancelled")));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn write_loop<W: AsyncWrite + Unpin>(mut stdin: W, mut rx: mpsc::UnboundedReceiver<String>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    while let Some(first) = rx.recv().await {
        buf.clear();
        buf.extend_from_slice(first.as_bytes());
        buf.push(b'\n');
        // Batch what is already queued into one write.
        while buf.len() < 256 * 1024 {
            match rx.try_recv() {
                Ok(line) => {
                    buf.extend_from_slice(line.as_bytes());
                    buf.push(b'\n');
                }
                Err(_) => break,
            }
        }
        if stdin.write_all(&buf).await.is_err() || stdin.flush().await.is_err() {
            // The agent closed its stdin (or died): nothing more can be said.
            break;
        }
    }
    // Dropping `stdin` closes the pipe: end-of-file for the agent.
}

/// The agent's stdout, line by line, handled in the read buffer. Long
/// because the buffer handling (partial lines, backpressure between lines)
/// and the end of the connection must stay in one loop.
async fn read_loop<R: AsyncRead + Unpin>(
    stdout: R,
    transport: std::sync::Weak<Transport>,
    pending: Arc<Pending>,
    closed: Arc<AtomicBool>,
    handler: Arc<dyn Handler>,
) {
    let mut reader = BufReader::with_capacity(READ_BUFFER, stdout);
    // A line that began in an earlier read; complete lines are handled
    // where they lie in the reader's buffer, without a copy.
    let mut partial = Vec::new();
    let on_line = |line: &[u8]| {
        let text = trim_line(line);
        if text.is_empty() {
            return;
        }
        match serde_json::from_slice::<Envelope<'_>>(text) {
            // A request named `session/update` (answered -32601) keeps its
            // params whole: the general path.
            Ok(env) if env.update.is_some() && env.id.is_some() => {
                dispatch_value(text, &transport, &pending, &handler)
            }
            Ok(env) => dispatch(env, &transport, &pending, &handler),
            // Not a plain JSON-RPC object (a batch, a duplicate member, not
            // JSON at all): the general path says what it is.
            Err(_) => dispatch_value(text, &transport, &pending, &handler),
        }
    };
    loop {
        let buf = match reader.fill_buf().await {
            Ok(buf) => buf,
            Err(e) => {
                tracing::warn!("agent stdout: {e}; closing the connection");
                break;
            }
        };
        if buf.is_empty() {
            // End of file: a last line without its newline still counts.
            if !partial.is_empty() {
                on_line(&partial);
            }
            break;
        }
        let mut at = 0;
        while let Some(i) = memchr::memchr(b'\n', &buf[at..]) {
            let line = &buf[at..at + i];
            if partial.is_empty() {
                on_line(line);
            } else {
                partial.extend_from_slice(line);
                on_line(&partial);
                partial.clear();
            }
            at += i + 1;
            if let Some(wait) = handler.backpressure() {
                wait.await;
            }
            // One unit of the task's budget per line: a reader with a full
            // buffer yields after a bounded number of lines, so every other
            // task (another run's reader, a lane with a control) gets its
            // turn within a fraction of a millisecond.
            tokio::task::coop::consume_budget().await;
        }
        partial.extend_from_slice(&buf[at..]);
        let n = buf.len();
        reader.consume(n);
        if partial.len() > MAX_LINE {
            tracing::warn!("agent stdout: a line longer than {MAX_LINE} bytes; closing the connection");
            break;
        }
    }
    closed.store(true, Ordering::SeqCst);
    // Every request still waiting fails now (dropping the senders).
    lock(&pending).clear();
    if let Some(t) = transport.upgrade() {
        for (_, task) in lock(&t.serving).drain() {
            task.abort();
        }
    }
    handler.closed();
}

/// A JSON-RPC message with its members still raw text.
struct Envelope<'a> {
    method: Option<std::borrow::Cow<'a, str>>,
    id: Option<&'a RawValue>,
    params: Option<&'a RawValue>,
    /// The params of a `session/update` whose `method` came before them,
    /// split in the same pass (reading the params whole and then again
    /// for their members was a third of the relay's time).
    update: Option<UpdateParams<'a>>,
    result: Option<&'a RawValue>,
    error: Option<&'a RawValue>,
}

/// The two members of `session/update` params that the relay needs, as
/// the agent wrote them.
#[derive(Deserialize)]
pub struct UpdateParams<'a> {
    #[serde(rename = "sessionId", borrow)]
    pub session_id: Option<&'a RawValue>,
    #[serde(borrow)]
    pub update: Option<&'a RawValue>,
}

/// The envelope's member names (no allocation per key).
enum Member {
    Method,
    Id,
    Params,
    Result,
    Error,
    Other,
}

impl<'de> Deserialize<'de> for Member {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Member;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E>(self, v: &str) -> Result<Member, E> {
                Ok(match v {
                    "method" => Member::Method,
                    "id" => Member::Id,
                    "params" => Member::Params,
                    "result" => Member::Result,
                    "error" => Member::Error,
                    _ => Member::Other,
                })
            }
        }
        de.deserialize_identifier(Name)
    }
}

/// A string borrowed from the line unless it had escapes (`Cow<str>`
/// alone always allocates).
struct Text<'a>(std::borrow::Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Str<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Str<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Owned(v.to_string())))
            }
        }
        de.deserialize_str(Str(std::marker::PhantomData))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Envelope<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Members<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Members<'a> {
            type Value = Envelope<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON-RPC object")
            }

            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Envelope<'a>, M::Error> {
                use serde::de::Error;
                let mut env = Envelope {
                    method: None,
                    id: None,
                    params: None,
                    update: None,
                    result: None,
                    error: None,
                };
                let mut params_seen = false;
                // As the derived form did: a repeated member is an error
                // (the general path then says what the line is), and a
                // `null` one counts as absent (`"id": null` is a
                // notification).
                fn once<T, E: Error>(
                    slot: &mut Option<T>,
                    v: Option<T>,
                    name: &'static str,
                ) -> Result<(), E> {
                    if let Some(v) = v
                        && slot.replace(v).is_some()
                    {
                        return Err(E::duplicate_field(name));
                    }
                    Ok(())
                }
                while let Some(key) = map.next_key::<Member>()? {
                    match key {
                        Member::Method => {
                            let method: Option<Text<'a>> = map.next_value()?;
                            once(&mut env.method, method.map(|t| t.0), "method")?
                        }
                        Member::Id => once(&mut env.id, map.next_value()?, "id")?,
                        Member::Params => {
                            if std::mem::replace(&mut params_seen, true) {
                                return Err(M::Error::duplicate_field("params"));
                            }
                            if env.method.as_deref() == Some("session/update") {
                                env.update = Some(map.next_value()?);
                            } else {
                                env.params = map.next_value()?;
                            }
                        }
                        Member::Result => once(&mut env.result, map.next_value()?, "result")?,
                        Member::Error => once(&mut env.error, map.next_value()?, "error")?,
                        Member::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(env)
            }
        }
        de.deserialize_map(Members(std::marker::PhantomData))
    }
}

fn to_value(raw: Option<&RawValue>) -> Value {
    raw.and_then(|r| serde_json::from_str(r.get()).ok()).unwrap_or(Value::Null)
}

fn dispatch(
    env: Envelope<'_>,
    transport: &std::sync::Weak<Transport>,
    pending: &Pending,
    handler: &Arc<dyn Handler>,
) {
    // `"id": null` reads as no id: a notification, as before.
    match (env.method, env.id) {
        (Some(method), Some(id)) => {
            if let Some(t) = transport.upgrade() {
                let params = env.params.map_or_else(null_params, RawValue::to_owned);
                t.serve(to_value(Some(id)), method.into_owned(), params, handler.clone());
            }
        }
        (Some(method), None) => {
            if method == "$/cancel_request" {
                let params = to_value(env.params);
                if let (Some(t), Some(id)) = (transport.upgrade(), params.get("requestId")) {
                    t.cancel_incoming(id);
                }
            } else if let Some(update) = env.update {
                handler.session_update(update);
            } else {
                handler.notification(&method, env.params);
            }
        }
        (None, Some(id)) => {
            let Ok(id) = id.get().parse::<u64>() else {
                tracing::warn!("agent answered an id we never used: {}", id.get());
                return;
            };
            let result = match (env.error, env.result) {
                (Some(e), _) => Err(RpcError::from_json(&to_value(Some(e)))),
                (None, r) => Ok(to_value(r)),
            };
            resolve(pending, id, result);
        }
        (None, None) => {
            tracing::warn!("agent stdout: a JSON object that is neither request, notification nor response")
        }
    }
}

fn resolve(pending: &Pending, id: u64, result: Result<Value, RpcError>) {
    let Some(tx) = lock(pending).remove(&id) else {
        tracing::debug!("agent answered request {id}, which nobody waits for any more");
        return;
    };
    let _ = tx.send(result);
}

/// The general path, for lines that are not a plain JSON-RPC object.
fn dispatch_value(
    text: &[u8],
    transport: &std::sync::Weak<Transport>,
    pending: &Pending,
    handler: &Arc<dyn Handler>,
) {
    let msg: Value = match serde_json::from_slice(text) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(
                "agent stdout: not JSON ({e}): {}",
                String::from_utf8_lossy(&text[..text.len().min(200)])
            );
            return;
        }
    };
    let Value::Object(mut obj) = msg else {
        // Batches are not part of ACP (the v5 SDK answers -32600 too).
        if let Some(t) = transport.upgrade() {
            t.respond(&Value::Null, Err(RpcError::new(code::INVALID_REQUEST, "batches are not supported")));
        }
        return;
    };
    match (obj.remove("method"), obj.remove("id")) {
        (Some(Value::String(method)), Some(id)) if !id.is_null() => {
            let params = obj.remove("params").unwrap_or(Value::Null);
            let params = serde_json::value::to_raw_value(&params).unwrap_or_else(|_| null_params());
            if let Some(t) = transport.upgrade() {
                t.serve(id, method, params, handler.clone());
            }
        }
        (Some(Value::String(method)), _) => {
            let params = obj.remove("params").unwrap_or(Value::Null);
            if method == "$/cancel_request" {
                if let (Some(t), Some(id)) = (transport.upgrade(), params.get("requestId")) {
                    t.cancel_incoming(id);
                }
            } else {
                let raw = serde_json::value::to_raw_value(&params).ok();
                handler.notification(&method, raw.as_deref());
            }
        }
        (None, Some(id)) => {
            let Some(id) = id.as_u64() else {
                tracing::warn!("agent answered an id we never used: {id}");
                return;
            };
            let result = match (obj.remove("error"), obj.remove("result")) {
                (Some(e), _) if !e.is_null() => Err(RpcError::from_json(&e)),
                (_, Some(r)) => Ok(r),
                (_, None) => Ok(Value::Null),
            };
            resolve(pending, id, result);
        }
        _ => tracing::warn!("agent stdout: a JSON object that is neither request, notification nor response"),
    }
}

fn trim_line(line: &[u8]) -> &[u8] {
    let mut s = line;
    while let [rest @ .., last] = s
        && (*last == b'\r' || *last == b' ' || *last == b'\t')
    {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo {
        notes: Mutex<Vec<String>>,
    }

    impl Handler for Echo {
        fn notification(&self, method: &str, _params: Option<&RawValue>) {
            lock(&self.notes).push(method.to_string());
        }
        fn session_update(&self, _params: UpdateParams<'_>) {
            lock(&self.notes).push("session/update (split)".to_string());
        }
        fn request(
            self: Arc<Self>,
            _id: Value,
            method: String,
            params: Box<RawValue>,
        ) -> BoxFuture<Result<Reply, RpcError>> {
            Box::pin(async move {
                match method.as_str() {
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        Ok(Value::Null.into())
                    }
                    "fast" => Ok(Reply::Raw(params)),
                    _ => Err(RpcError::new(code::METHOD_NOT_FOUND, format!("method not found: {method}"))),
                }
            })
        }
        fn closed(&self) {}
    }

    async fn lines(r: &mut BufReader<tokio::io::DuplexStream>, n: usize) -> Vec<Value> {
        let mut out = Vec::new();
        for _ in 0..n {
            let mut l = Vec::new();
            assert!(r.read_until(b'\n', &mut l).await.unwrap() > 0);
            out.push(serde_json::from_slice(&l).unwrap());
        }
        out
    }

    #[tokio::test]
    async fn requests_are_served_concurrently_and_cancelled_once() {
        let (agent_out, ours_in) = tokio::io::duplex(1 << 16);
        let (ours_out, agent_in) = tokio::io::duplex(1 << 16);
        let h = Arc::new(Echo { notes: Mutex::new(Vec::new()) });
        let t = Transport::start(ours_in, ours_out, h.clone());
        let mut agent_in = BufReader::new(agent_in);
        let mut agent_out = agent_out;
        agent_out
            .write_all(
                b"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"slow\"}\n\
                  {\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"fast\",\"params\":{\"x\":1}}\n\
                  {\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"_vendor/thing\"}\n\
                  {\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{}}\n\
                  {\"params\":{\"sessionId\":\"s\"},\"jsonrpc\":\"2.0\",\"method\":\"session/update\"}\n\
                  {\"jsonrpc\":\"2.0\",\"method\":\"$/cancel_request\",\"params\":{\"requestId\":\"a\"}}\n",
            )
            .await
            .unwrap();
        let got = lines(&mut agent_in, 3).await;
        let by_id = |id: Value| got.iter().find(|m| m["id"] == id).cloned().unwrap();
        // The fast request is not stuck behind the slow one.
        assert_eq!(by_id(json!(7)), json!({"jsonrpc":"2.0","id":7,"result":{"x":1}}));
        assert_eq!(by_id(json!(8))["error"]["code"], -32601);
        assert_eq!(
            by_id(json!("a")),
            json!({"jsonrpc":"2.0","id":"a","error":{"code":-32800,"message":"request cancelled"}})
        );
        // Params after the method are split while the line is read; before
        // it, they reach the handler whole.
        assert_eq!(*lock(&h.notes), vec!["session/update (split)".to_string(), "session/update".to_string()]);
        // Our own call, answered by the agent.
        let call = {
            let t = t.clone();
            tokio::spawn(async move { t.call("initialize", json!({"protocolVersion":1}), None).await })
        };
        let req = lines(&mut agent_in, 1).await.remove(0);
        assert_eq!(req["method"], "initialize");
        assert_eq!(req["id"], 1);
        agent_out
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocolVersion\":1}}\n")
            .await
            .unwrap();
        assert_eq!(call.await.unwrap().unwrap(), json!({"protocolVersion":1}));
        // End-of-file fails what is still pending.
        let call = {
            let t = t.clone();
            tokio::spawn(async move { t.call("session/prompt", json!({}), None).await })
        };
        lines(&mut agent_in, 1).await;
        drop(agent_out);
        assert_eq!(call.await.unwrap(), Err(CallError::Closed));
        assert!(t.is_closed());
    }

    /// Found by the `acp_transport` fuzz target: a second request under the
    /// id of one still being served took over its slot, and one of the two
    /// was never answered.
    #[tokio::test]
    async fn a_reused_id_in_flight_is_refused_and_both_are_answered() {
        let (agent_out, ours_in) = tokio::io::duplex(1 << 16);
        let (ours_out, agent_in) = tokio::io::duplex(1 << 16);
        let h = Arc::new(Echo { notes: Mutex::new(Vec::new()) });
        let _t = Transport::start(ours_in, ours_out, h);
        let mut agent_in = BufReader::new(agent_in);
        let mut agent_out = agent_out;
        agent_out
            .write_all(
                b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"slow\"}\n\
                  {\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"fast\",\"params\":1}\n\
                  {\"jsonrpc\":\"2.0\",\"method\":\"$/cancel_request\",\"params\":{\"requestId\":3}}\n",
            )
            .await
            .unwrap();
        let got = lines(&mut agent_in, 2).await;
        assert_eq!(got[0]["error"]["code"], -32600, "{got:?}");
        assert_eq!(got[0]["id"], 3);
        // The first request, still in flight, is the one the cancel reaches.
        assert_eq!(
            got[1],
            json!({"jsonrpc":"2.0","id":3,"error":{"code":-32800,"message":"request cancelled"}})
        );
    }
}
