//! The skills server's connections: HTTP/1.1 with a time limit on each
//! request's headers, a cap on open connections, and a graceful stop.
//!
//! * A connection must send a request's headers within `header_timeout`
//!   of starting to wait for them (an idle keep-alive connection is
//!   waiting too), or it is closed: a client that opens connections and
//!   sends nothing, or a byte at a time, does not hold them.
//! * At most `max_connections` are open; past that, new connections wait
//!   in the listen backlog until one closes.
//! * Bodies have their own limit, enforced where they are read
//!   ([`super::http`]).
//! * On shutdown the listener closes, event streams end, requests in
//!   flight get [`SHUTDOWN_DRAIN`] to finish (a client that stops reading
//!   a download does not hold the server), then the rest are dropped.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use super::http::router;
use super::jobs::Service;

/// How long open requests may take to finish once shutdown begins.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// The connection limits.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits { header_timeout: Duration::from_secs(15), max_connections: 256 }
    }
}

/// Serves until `shutdown` completes, then stops as described above.
pub async fn serve(
    svc: Arc<Service>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    limits: ConnLimits,
) -> std::io::Result<()> {
    let app = router(Arc::clone(&svc));
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Event frames and small answers go out at once.
                    let _ = stream.set_nodelay(true);
                    stream
                }
                Err(e) => {
                    // Out of descriptors, or a connection reset before
                    // it was taken: wait a little rather than spin.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (app, mut stop) = (app.clone(), stop_rx.clone());
        conns.spawn(async move {
            let _slot = permit;
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
            let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
            tokio::pin!(conn);
            let served = tokio::select! {
                served = conn.as_mut() => served,
                _ = async { stop.wait_for(|s| *s).await.is_ok() } => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = served {
                tracing::debug!("connection: {e}");
            }
        });
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    svc.stop();
    stop_tx.send_replace(true);
    let drained =
        tokio::time::timeout(SHUTDOWN_DRAIN, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!("stopping with requests still open after {SHUTDOWN_DRAIN:?}");
        conns.abort_all();
    }
    Ok(())
}
