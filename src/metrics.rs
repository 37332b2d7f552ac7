//! Prometheus metrics over HTTP, for the daemon (`proxy --metrics-listen`)
//! and the skill jobs' server (`skills serve --metrics-listen`).
//!
//! The families and the text format come from `prometheus-client` (the
//! OpenMetrics text exposition, which Prometheus scrapes natively); this
//! module only puts it on a socket. The daemon's binary links no HTTP
//! server, and one is not worth its pages for a single `GET`: the responder
//! here reads one request head (at most [`MAX_HEAD`] bytes within
//! [`HEAD_TIMEOUT`]), answers `GET /metrics` (or `HEAD`) with the text,
//! anything else with 404 or 405, and closes the connection. At most
//! [`MAX_CONNECTIONS`] are served at once; more are closed unanswered.
//!
//! Where: a TCP address (`127.0.0.1:9478`, `[::1]:9478`; port 0 picks one,
//! logged) or `unix:/path` (reached by whoever may connect to that file; a
//! stale socket from a daemon that is gone is replaced, a live one is an
//! error). Labels never carry a run id or anything else unbounded: the
//! families are named in docs/proxy.md ("Metrics").

use std::fmt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The media type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The longest request head read.
pub const MAX_HEAD: usize = 8 * 1024;
/// How long a client may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;

/// Where metrics are served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Listen, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(format!("{s}: a unix socket needs an absolute path (unix:/run/x/metrics.sock)"));
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        s.parse().map(Listen::Tcp).map_err(|_| {
            format!("{s}: not an address: give IP:PORT (127.0.0.1:9478, [::1]:9478) or unix:/PATH")
        })
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "{addr}"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// Why the metrics socket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("--metrics-listen {listen}: {}", sandbox::error::io_error_text(.source))]
    Bind { listen: Listen, source: std::io::Error },
    #[error("--metrics-listen unix:{}: a process is listening there already", .0.display())]
    InUse(PathBuf),
    #[error("--metrics-listen unix:{}: exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
}

/// A bound metrics socket, not yet served (bound before the runtime so a
/// bad address is a startup error).
pub enum Endpoint {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl Endpoint {
    pub fn bind(listen: &Listen) -> Result<Endpoint, MetricsError> {
        let failed = |source| MetricsError::Bind { listen: listen.clone(), source };
        let endpoint = match listen {
            Listen::Tcp(addr) => Endpoint::Tcp(std::net::TcpListener::bind(addr).map_err(failed)?),
            Listen::Unix(path) => {
                replace_stale_socket(path)?;
                Endpoint::Unix(std::os::unix::net::UnixListener::bind(path).map_err(failed)?)
            }
        };
        match &endpoint {
            Endpoint::Tcp(l) => l.set_nonblocking(true),
            Endpoint::Unix(l) => l.set_nonblocking(true),
        }
        .map_err(failed)?;
        Ok(endpoint)
    }

    /// Where it listens (the port chosen for port 0).
    pub fn local(&self) -> String {
        match self {
            Endpoint::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into()),
            Endpoint::Unix(l) => {
                match l.local_addr().ok().and_then(|a| a.as_pathname().map(Path::to_path_buf)) {
                    Some(p) => format!("unix:{}", p.display()),
                    None => "unix:?".into(),
                }
            }
        }
    }
}

/// A socket file left by a process that is gone is removed; a live one
/// or another kind of file is an error.
fn replace_stale_socket(path: &Path) -> Result<(), MetricsError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if !meta.file_type().is_socket() {
        return Err(MetricsError::NotASocket(path.to_path_buf()));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(MetricsError::InUse(path.to_path_buf()));
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

/// What answers a scrape: the whole exposition, made when asked.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// `registry` in the text format, `# EOF` included.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = text::encode(&mut out, registry) {
        tracing::error!("metrics: encoding failed: {e}");
    }
    out
}

/// A count as a gauge's value.
pub fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A count kept elsewhere (a table, a shared page) shown as a counter:
/// raised to `total` when scraped, never lowered.
pub fn raise_to(counter: &prometheus_client::metrics::counter::Counter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

/// `tuixiu_build_info{version, binary}` 1, in `registry`.
pub fn register_build_info(registry: &mut Registry, binary: &'static str) {
    registry.register(
        "build",
        "The running binary: the package version and which binary serves these metrics",
        Info::new([("version", env!("CARGO_PKG_VERSION")), ("binary", binary)]),
    );
}

/// Serves scrapes on `endpoint` until the task is dropped. Call from
/// within a tokio runtime.
pub async fn serve(endpoint: Endpoint, render: Render) {
    let listener = match endpoint {
        Endpoint::Tcp(l) => tokio::net::TcpListener::from_std(l).map(Listener::Tcp),
        Endpoint::Unix(l) => tokio::net::UnixListener::from_std(l).map(Listener::Unix),
    };
    let listener = match listener {
        Ok(l) => l,
        Err(e) => return tracing::error!("metrics: cannot serve the socket: {e}"),
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok(stream) => stream,
            Err(e) => {
                // Out of descriptors, say: wait a little instead of spinning.
                tracing::warn!("metrics: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // More clients than slots: closed unanswered, never queued.
        let Ok(permit) = slots.clone().try_acquire_owned() else { continue };
        let render = render.clone();
        tokio::spawn(async move {
            let _permit = permit;
            answer(stream, &render).await;
        });
    }
}

/// A connection, TCP or unix.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send> Stream for S {}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Box<dyn Stream>> {
        Ok(match self {
            Listener::Tcp(l) => Box::new(l.accept().await?.0),
            Listener::Unix(l) => Box::new(l.accept().await?.0),
        })
    }
}

/// One request, one response, then the connection closes.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, render: &Render) {
    let Ok(Some(head)) = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await else {
        return;
    };
    let (status, body) = route(&head, render);
    let head_only = head.starts_with("HEAD ");
    let content_type = if status.starts_with("200") { CONTENT_TYPE } else { "text/plain; charset=utf-8" };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(&body);
    }
    let _ = tokio::time::timeout(HEAD_TIMEOUT, async {
        let _ = stream.write_all(out.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// The status line's code and reason, and the body, for a request head.
fn route(head: &str, render: &Render) -> (&'static str, String) {
    let mut words = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", render()),
        ("GET" | "HEAD", _) => ("404 Not Found", "metrics are at /metrics\n".into()),
        _ => ("405 Method Not Allowed", "only GET /metrics\n".into()),
    }
}

/// The request head up to its blank line; `None` for a client that closed
/// or sent more than [`MAX_HEAD`] bytes without one.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Option<String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end);
            return String::from_utf8(buf).ok();
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(
            "127.0.0.1:9478".parse::<Listen>().unwrap(),
            Listen::Tcp("127.0.0.1:9478".parse().unwrap())
        );
        assert_eq!("[::1]:0".parse::<Listen>().unwrap(), Listen::Tcp("[::1]:0".parse().unwrap()));
        assert_eq!("unix:/run/m.sock".parse::<Listen>().unwrap(), Listen::Unix("/run/m.sock".into()));
        assert!("unix:m.sock".parse::<Listen>().unwrap_err().contains("absolute path"));
        assert!("localhost:9478".parse::<Listen>().unwrap_err().contains("not an address"));
    }

    #[test]
    fn routes() {
        let render: Render = Arc::new(|| "x 1\n# EOF\n".to_string());
        assert_eq!(route("GET /metrics HTTP/1.1\r\nHost: a", &render), ("200 OK", "x 1\n# EOF\n".into()));
        assert_eq!(route("GET /metrics?x=1 HTTP/1.0", &render).0, "200 OK");
        assert_eq!(route("GET / HTTP/1.1", &render).0, "404 Not Found");
        assert_eq!(route("POST /metrics HTTP/1.1", &render).0, "405 Method Not Allowed");
    }

    #[tokio::test]
    async fn answers_one_request_and_closes() {
        let render: Render = Arc::new(|| "up 1\n# EOF\n".to_string());
        let (mut client, server) = tokio::io::duplex(4096);
        let task = tokio::spawn(async move { answer(server, &render).await });
        client.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut out = String::new();
        client.read_to_string(&mut out).await.unwrap();
        task.await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")), "{out}");
        assert!(out.contains("Content-Length: 11\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nup 1\n# EOF\n"), "{out}");
    }

    #[tokio::test]
    async fn an_endless_head_is_not_answered() {
        let render: Render = Arc::new(String::new);
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let task = tokio::spawn(async move { answer(server, &render).await });
        client.write_all(&vec![b'a'; MAX_HEAD + 600]).await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        task.await.unwrap();
        assert!(out.is_empty());
    }
}
