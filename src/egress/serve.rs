//! The proxy itself: accepts on a sandbox's egress listener and serves
//! each connection as HTTP (CONNECT, or an absolute `http://` URI) or
//! SOCKS5 (CONNECT), told apart by the first byte. For every connection:
//! the allowlist first (no connection, no resolution for a name it does
//! not list), then resolution here, then the address guard on each
//! address, then a connection to exactly the address checked. Bytes are
//! relayed unchanged (TLS stays end to end), counted, and cut after an
//! idle timeout. Nothing of a request is logged but its destination.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::guard;
use super::policy::Policy;
use super::relay;
use super::request::{self, Ask, Host, RequestError, SocksError, Target, socks_reply};
use super::resolve::Resolver;

/// Bounds of one sandbox's proxy.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once; more wait to be accepted.
    pub max_connections: usize,
    /// For the request head or the SOCKS5 exchange to arrive.
    pub head_timeout: Duration,
    /// For each connection attempt to an address.
    pub connect_timeout: Duration,
    /// A relayed connection with no byte either way for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            head_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// Counters of one sandbox's proxy (or of all the sandboxes of an instance).
#[derive(Debug, Default)]
pub struct Stats {
    connections: AtomicU64,
    open: AtomicU64,
    denied: AtomicU64,
    failed: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    changed: AtomicBool,
}

/// A snapshot of [`Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Connections accepted.
    pub connections: u64,
    /// Open now.
    pub open: u64,
    /// Refused by the policy (allowlist or address guard).
    pub denied: u64,
    /// Allowed, but resolution or the connection failed.
    pub failed: u64,
    /// Bytes from the sandbox to its destinations.
    pub bytes_out: u64,
    /// Bytes from the destinations to the sandbox.
    pub bytes_in: u64,
}

impl Stats {
    /// Counters that go on from `counts` (nothing open).
    pub fn from_counts(counts: Counts) -> Stats {
        let stats = Stats::default();
        stats.connections.store(counts.connections, Ordering::Relaxed);
        stats.denied.store(counts.denied, Ordering::Relaxed);
        stats.failed.store(counts.failed, Ordering::Relaxed);
        stats.bytes_out.store(counts.bytes_out, Ordering::Relaxed);
        stats.bytes_in.store(counts.bytes_in, Ordering::Relaxed);
        stats
    }

    pub fn counts(&self) -> Counts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counts {
            connections: get(&self.connections),
            open: get(&self.open),
            denied: get(&self.denied),
            failed: get(&self.failed),
            bytes_out: get(&self.bytes_out),
            bytes_in: get(&self.bytes_in),
        }
    }

    /// Whether anything changed since the last call.
    pub fn take_changed(&self) -> bool {
        self.changed.swap(false, Ordering::Relaxed)
    }

    fn add(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
        self.changed.store(true, Ordering::Relaxed);
    }
}

/// A refused destination, as reported (never the request's contents).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// `host:port` as asked (control characters escaped, at most 300 bytes).
    pub target: String,
    /// `CONNECT`, `HTTP` (a forwarded request) or `SOCKS5`.
    pub via: &'static str,
    pub reason: String,
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "denied {} ({}): {}", self.target, self.via, self.reason)
    }
}

/// Where refusals go: a log line, a message to the backend.
pub trait Events: Send + Sync + 'static {
    fn denied(&self, denial: &Denial);
    /// The connection cap was reached; new connections wait.
    fn saturated(&self, max: usize) {
        tracing::warn!("egress proxy: {max} connections are open, the most allowed: new ones wait");
    }
}

/// Refusals as log lines (`run -v`).
pub struct LogEvents;

impl Events for LogEvents {
    fn denied(&self, denial: &Denial) {
        tracing::info!("egress proxy: {denial}");
    }
}

/// One sandbox's proxy: its policy, bounds, resolver, counters and where
/// refusals go.
pub struct Proxy {
    pub policy: Policy,
    pub limits: Limits,
    pub resolver: Resolver,
    pub stats: Arc<Stats>,
    pub events: Arc<dyn Events>,
}

/// Why a destination was not reached.
enum Refusal {
    /// The policy says no (403, SOCKS5 "not allowed").
    Denied(String),
    /// Allowed, but it could not be reached: text, HTTP status, SOCKS5 code.
    Failed(String, u16, u8),
}

impl Proxy {
    /// Serves `listener` until the task is dropped; the connections'
    /// tasks end with it.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let slots = Arc::new(tokio::sync::Semaphore::new(self.limits.max_connections));
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            let slot = match slots.clone().try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    self.events.saturated(self.limits.max_connections);
                    tokio::select! {
                        slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
                        Some(_) = tasks.join_next() => continue,
                    }
                }
            };
            let client = match listener.accept().await {
                Ok((client, _)) => client,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    tracing::warn!("egress proxy: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let proxy = self.clone();
            tasks.spawn(async move {
                proxy.stats.add(&proxy.stats.connections, 1);
                proxy.stats.open.fetch_add(1, Ordering::Relaxed);
                let _ = client.set_nodelay(true);
                if let Err(e) = proxy.handle(client).await {
                    tracing::debug!("egress proxy: connection ended: {e}");
                }
                proxy.stats.open.fetch_sub(1, Ordering::Relaxed);
                proxy.stats.changed.store(true, Ordering::Relaxed);
                drop(slot);
            });
        }
    }

    async fn handle(&self, mut client: TcpStream) -> io::Result<()> {
        let mut buf = Vec::with_capacity(1024);
        let deadline = tokio::time::Instant::now() + self.limits.head_timeout;
        read_more(&mut client, &mut buf, deadline).await?;
        if buf[0] == request::SOCKS_VERSION {
            self.socks(client, buf, deadline).await
        } else {
            self.http(client, buf, deadline).await
        }
    }

    async fn http(
        &self,
        mut client: TcpStream,
        mut buf: Vec<u8>,
        deadline: tokio::time::Instant,
    ) -> io::Result<()> {
        let head = loop {
            match request::parse_head(&buf) {
                Ok(Some(head)) => break head,
                Ok(None) => read_more(&mut client, &mut buf, deadline).await?,
                Err(e) => return answer(&mut client, 400, &e.to_string()).await,
            }
        };
        // A tunnel's first bytes, or the request passed on in origin form,
        // then what the client sent after the head.
        let (target, via, mut first) = match head.ask {
            Ask::Connect(target) => (target, "CONNECT", Vec::new()),
            Ask::Forward { target, method, path, http10, headers } => {
                let head = request::origin_head(&target, &method, &path, http10, &headers);
                (target, "HTTP", head)
            }
        };
        let upstream = match self.open(&target, via).await {
            Ok(upstream) => upstream,
            Err(refusal) => return refuse_http(&mut client, refusal).await,
        };
        if via == "CONNECT" {
            client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
        }
        first.extend_from_slice(&buf[head.len..]);
        self.start_relay(client, upstream, &first).await
    }

    async fn socks(
        &self,
        mut client: TcpStream,
        mut buf: Vec<u8>,
        deadline: tokio::time::Instant,
    ) -> io::Result<()> {
        let greeting = loop {
            match request::parse_greeting(&buf) {
                Ok(Some(n)) => break n,
                Ok(None) => read_more(&mut client, &mut buf, deadline).await?,
                Err(SocksError::NoMethod) => {
                    // "No acceptable methods".
                    return client.write_all(&[request::SOCKS_VERSION, 0xff]).await;
                }
                Err(_) => return Ok(()),
            }
        };
        client.write_all(&[request::SOCKS_VERSION, 0]).await?;
        buf.drain(..greeting);
        let (target, used) = loop {
            match request::parse_socks_request(&buf) {
                Ok(Some(parsed)) => break parsed,
                Ok(None) if buf.len() < 300 => read_more(&mut client, &mut buf, deadline).await?,
                Ok(None) => return client.write_all(&socks_reply(socks_reply::GENERAL_FAILURE)).await,
                Err(e) => {
                    if let SocksError::Host(why) = e {
                        self.deny(&Denial {
                            target: "(a bad name)".into(),
                            via: "SOCKS5",
                            reason: format!("the host is {why}"),
                        });
                    }
                    return match e.reply() {
                        Some(code) => client.write_all(&socks_reply(code)).await,
                        None => Ok(()),
                    };
                }
            }
        };
        let upstream = match self.open(&target, "SOCKS5").await {
            Ok(upstream) => upstream,
            Err(Refusal::Denied(_)) => return client.write_all(&socks_reply(socks_reply::NOT_ALLOWED)).await,
            Err(Refusal::Failed(_, _, code)) => return client.write_all(&socks_reply(code)).await,
        };
        client.write_all(&socks_reply(socks_reply::SUCCEEDED)).await?;
        self.start_relay(client, upstream, &buf[used..]).await
    }

    /// The policy's decision for `target`, then a connection to the first
    /// address that passes the guard and answers.
    async fn open(&self, target: &Target, via: &'static str) -> Result<TcpStream, Refusal> {
        let shown = shown(target);
        let deny = |reason: String| {
            self.deny(&Denial { target: shown.clone(), via, reason: reason.clone() });
            Refusal::Denied(reason)
        };
        if self.policy.rule_for(&target.host, target.port).is_none() {
            let reason = match &target.host {
                Host::Ip(_) => "an address not in the allowlist (ask for a listed name)",
                Host::Name(_) => "not in the allowlist",
            };
            return Err(deny(reason.into()));
        }
        let addrs = match &target.host {
            Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
            Host::Name(name) => match self.resolver.resolve(name, target.port).await {
                Ok(addrs) => addrs,
                Err(e) => {
                    return Err(self.fail(
                        format!("{shown}: could not resolve: {e}"),
                        502,
                        socks_reply::HOST_UNREACHABLE,
                    ));
                }
            },
        };
        let mut guarded = None;
        let mut failure = None;
        for addr in addrs {
            if let Err(why) = guard::check(addr.ip(), &self.policy) {
                guarded.get_or_insert((addr.ip(), why));
                continue;
            }
            match tokio::time::timeout(self.limits.connect_timeout, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(e)) => failure = Some((format!("{shown}: connect to {addr}: {e}"), e.kind())),
                Err(_) => {
                    failure =
                        Some((format!("{shown}: connect to {addr}: timed out"), io::ErrorKind::TimedOut))
                }
            }
        }
        match (failure, guarded) {
            (Some((text, kind)), _) => {
                let (status, code) = match kind {
                    io::ErrorKind::TimedOut => (504, socks_reply::TTL_EXPIRED),
                    io::ErrorKind::ConnectionRefused => (502, socks_reply::REFUSED),
                    _ => (502, socks_reply::HOST_UNREACHABLE),
                };
                Err(self.fail(text, status, code))
            }
            (None, Some((ip, why))) => Err(deny(format!(
                "{} is {why}, refused (an operator may allow the range with --allow-range)",
                ip
            ))),
            (None, None) => {
                Err(self.fail(format!("{shown}: no address"), 502, socks_reply::HOST_UNREACHABLE))
            }
        }
    }

    fn deny(&self, denial: &Denial) {
        self.stats.add(&self.stats.denied, 1);
        self.events.denied(denial);
    }

    fn fail(&self, text: String, status: u16, code: u8) -> Refusal {
        self.stats.add(&self.stats.failed, 1);
        tracing::debug!("egress proxy: {text}");
        Refusal::Failed(text, status, code)
    }

    /// `first` (the client's bytes already read) to the destination, then
    /// the relay.
    async fn start_relay(&self, client: TcpStream, mut upstream: TcpStream, first: &[u8]) -> io::Result<()> {
        upstream.write_all(first).await?;
        self.stats.add(&self.stats.bytes_out, first.len() as u64);
        self.relay(client, upstream).await
    }

    /// Both directions until both ends are done, or nothing moved for the
    /// idle timeout.
    async fn relay(&self, client: TcpStream, upstream: TcpStream) -> io::Result<()> {
        let start = Instant::now();
        let last = AtomicU64::new(0);
        let meter = |bytes| relay::Meter { bytes, changed: &self.stats.changed, last: &last, start };
        let (out, inbound) = (meter(&self.stats.bytes_out), meter(&self.stats.bytes_in));
        relay::relay(&client, &upstream, out, inbound, self.limits.idle_timeout).await
    }
}

/// Reads what is there (at least one byte) before `deadline`.
async fn read_more(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: tokio::time::Instant,
) -> io::Result<()> {
    if buf.len() >= request::MAX_HEAD {
        return Err(io::Error::other(RequestError::TooLarge.to_string()));
    }
    buf.reserve(1024);
    match tokio::time::timeout_at(deadline, client.read_buf(buf)).await {
        Ok(Ok(0)) => Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "the request did not arrive in time")),
    }
}

async fn refuse_http(client: &mut TcpStream, refusal: Refusal) -> io::Result<()> {
    match refusal {
        Refusal::Denied(reason) => answer(client, 403, &reason).await,
        Refusal::Failed(text, status, _) => answer(client, status, &text).await,
    }
}

/// A short plain-text answer, then the connection is closed.
async fn answer(client: &mut TcpStream, status: u16, text: &str) -> io::Result<()> {
    let phrase = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        504 => "Gateway Timeout",
        _ => "Bad Gateway",
    };
    let body = format!("tuixiu-sandbox egress proxy: {text}\n");
    let reply = format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(reply.as_bytes()).await?;
    client.shutdown().await
}

/// `host:port` for reports: escaped, bounded.
fn shown(target: &Target) -> String {
    let text = target.to_string();
    let mut out: String = text.escape_debug().collect();
    if out.len() > 300 {
        let mut cut = 300;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct Recorded(Mutex<Vec<String>>);

    impl Events for Recorded {
        fn denied(&self, denial: &Denial) {
            self.0.lock().unwrap().push(denial.to_string());
        }
    }

    /// A proxy on an ephemeral loopback port with `hosts` allowed and
    /// loopback opened; an echo server its rules name `echo.test`.
    async fn start(limits: Limits, hosts: &[&str]) -> (SocketAddr, Arc<Proxy>, Arc<Recorded>) {
        let events = Arc::new(Recorded::default());
        let proxy = Arc::new(Proxy {
            policy: Policy::parse(hosts, &["127.0.0.0/8"]).unwrap(),
            limits,
            resolver: Resolver::default(),
            stats: Arc::default(),
            events: events.clone(),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(proxy.clone().serve(listener));
        (addr, proxy, events)
    }

    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn read_head(s: &mut TcpStream) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).await.unwrap() == 1 {
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap()
    }

    #[tokio::test]
    async fn a_tunnel_carries_early_bytes_and_counts_them() {
        let echo = echo().await;
        let rule = format!("127.0.0.1:{}", echo.port());
        let (addr, proxy, _) = start(Limits::default(), &[&rule]).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        // The first bytes of the tunnel ride with the request head.
        s.write_all(format!("CONNECT {rule} HTTP/1.1\r\n\r\nearly").as_bytes()).await.unwrap();
        assert_eq!(read_head(&mut s).await, "HTTP/1.1 200 Connection established\r\n\r\n");
        let mut got = [0u8; 5];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"early");
        drop(s);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let c = proxy.stats.counts();
        assert_eq!((c.connections, c.open, c.bytes_out, c.bytes_in, c.denied), (1, 0, 5, 5, 0));
    }

    #[tokio::test]
    async fn oversized_and_slow_heads_are_cut() {
        let limits = Limits { head_timeout: Duration::from_millis(300), ..Limits::default() };
        let (addr, _, _) = start(limits, &[]).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let big = format!("GET http://a.test/ HTTP/1.1\r\nX: {}\r\n\r\n", "y".repeat(request::MAX_HEAD));
        let _ = s.write_all(big.as_bytes()).await;
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply).await;
        assert!(reply.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{reply}");
        assert!(reply.contains("larger than 16384 bytes"), "{reply}");
        // A client that never finishes its head is dropped at the deadline.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"CONNECT a.test:443 HTTP/1.1\r\n").await.unwrap();
        let started = Instant::now();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await.unwrap();
        assert!(n.is_ok() && rest.is_empty());
        assert!(started.elapsed() >= Duration::from_millis(250));
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait() {
        let echo = echo().await;
        let rule = format!("127.0.0.1:{}", echo.port());
        let limits = Limits { max_connections: 2, ..Limits::default() };
        let (addr, proxy, _) = start(limits, &[&rule]).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("CONNECT {rule} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
            read_head(&mut s).await;
            held.push(s);
        }
        let mut third = TcpStream::connect(addr).await.unwrap();
        third.write_all(format!("CONNECT {rule} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
        let mut byte = [0u8; 1];
        let waited = tokio::time::timeout(Duration::from_millis(300), third.read(&mut byte)).await;
        assert!(waited.is_err(), "the third connection was served");
        assert_eq!(proxy.stats.counts().open, 2);
        drop(held.pop());
        assert_eq!(read_head(&mut third).await, "HTTP/1.1 200 Connection established\r\n\r\n");
    }

    #[tokio::test]
    async fn idle_tunnels_are_closed() {
        let echo = echo().await;
        let rule = format!("127.0.0.1:{}", echo.port());
        let limits = Limits { idle_timeout: Duration::from_millis(200), ..Limits::default() };
        let (addr, _, _) = start(limits, &[&rule]).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("CONNECT {rule} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
        read_head(&mut s).await;
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
        assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");
    }

    #[tokio::test]
    async fn socks5_refusals_use_its_codes() {
        let (addr, proxy, events) = start(Limits::default(), &["listed.test"]).await;
        let ask = |name: &str, port: u16| {
            let mut req = vec![5, 1, 0, 3, name.len() as u8];
            req.extend_from_slice(name.as_bytes());
            req.extend_from_slice(&port.to_be_bytes());
            req
        };
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&[5, 1, 0]).await.unwrap();
        let mut reply = [0u8; 2];
        s.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply, [5, 0]);
        s.write_all(&ask("unlisted.test", 443)).await.unwrap();
        let mut reply = [0u8; 10];
        s.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply[1], socks_reply::NOT_ALLOWED);
        // Username/password only: no acceptable method.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&[5, 1, 2]).await.unwrap();
        let mut reply = [0u8; 2];
        s.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply, [5, 0xff]);
        // A listed name the system resolver does not know.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&[5, 1, 0]).await.unwrap();
        s.read_exact(&mut [0u8; 2]).await.unwrap();
        s.write_all(&ask("listed.test", 443)).await.unwrap();
        let mut reply = [0u8; 10];
        s.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply[1], socks_reply::HOST_UNREACHABLE);
        assert_eq!(*events.0.lock().unwrap(), ["denied unlisted.test:443 (SOCKS5): not in the allowlist"]);
        let c = proxy.stats.counts();
        assert_eq!((c.denied, c.failed), (1, 1));
    }
}
