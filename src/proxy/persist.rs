//! Run state files written off the daemon's thread.
//!
//! A run's state is replaced atomically and durably (a temporary file,
//! `fsync`, `rename`). An `fsync` usually takes a fraction of a
//! millisecond but can take tens on a busy disk, and the daemon has one
//! thread: done inline, it would hold up every run's messages, relays
//! included. So lanes hand the new content here and go on; one blocking
//! worker writes it.
//!
//! Order: only the latest content per file is kept, and the worker holds
//! the `writing` lock while it takes and writes a batch, so a file is never
//! overwritten by an older content, and a deletion (a forgotten run) is
//! never undone by a write queued before it. [`Persister::flush`] writes
//! what is still queued, inline, when the daemon stops.
//!
//! Durable before the reply: where the backend must be able to rely on a
//! record once it has the answer (an `acp_opened`: the run exists, with an
//! instance on this host), the lane asks [`Persister::on_disk`] for the
//! file it already queued and awaits that before it replies. Only that
//! lane waits (a file and a directory `fsync`, usually about a
//! millisecond); every other run's messages go on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::report::Reporter;

/// The run-state writer; clones share one queue and one worker.
#[derive(Clone)]
pub struct Persister {
    shared: Arc<Shared>,
}

struct Shared {
    /// path → `(run id, new content)`; `None` content deletes the file.
    pending: Mutex<Pending>,
    /// Held while a batch is taken and written.
    writing: Mutex<()>,
    /// Where a failed write is reported.
    report: Arc<Reporter>,
}

#[derive(Default)]
struct Pending {
    files: HashMap<PathBuf, Entry>,
    worker: bool,
}

/// The newest content queued for one file.
struct Entry {
    run_id: String,
    /// `None` deletes the file.
    content: Option<Vec<u8>>,
    /// Told once this content (or a newer one for the same file) is written.
    waiters: Vec<oneshot::Sender<()>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Persister {
    /// A writer whose failures are reported through `report`.
    pub fn new(report: Arc<Reporter>) -> Persister {
        Persister {
            shared: Arc::new(Shared { pending: Mutex::default(), writing: Mutex::default(), report }),
        }
    }

    /// Queues `content` for `path` (`None`: delete it) and makes sure a
    /// worker runs.
    pub fn write(&self, run_id: &str, path: PathBuf, content: Option<Vec<u8>>) {
        let mut p = lock(&self.shared.pending);
        // A newer content supersedes the queued one; whoever waited for
        // the older one is told when the newer one is written.
        let waiters = p.files.remove(&path).map(|e| e.waiters).unwrap_or_default();
        p.files.insert(path, Entry { run_id: run_id.to_string(), content, waiters });
        if p.worker {
            return;
        }
        p.worker = true;
        drop(p);
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            loop {
                let _writing = lock(&shared.writing);
                let batch = {
                    let mut p = lock(&shared.pending);
                    if p.files.is_empty() {
                        p.worker = false;
                        return;
                    }
                    std::mem::take(&mut p.files)
                };
                write_batch(&shared.report, batch);
            }
        });
    }

    /// Told once what was last given to [`Persister::write`] for `path` is
    /// on disk (written and synced, or the failure logged and reported: a
    /// write that failed is not retried by waiting longer).
    pub fn on_disk(&self, path: &Path) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut p = lock(&self.shared.pending);
        if let Some(entry) = p.files.get_mut(path) {
            entry.waiters.push(tx);
            return rx;
        }
        drop(p);
        // Not queued: written already, or in the batch the worker is
        // writing now. The worker takes a batch and writes it under
        // `writing`, so once that lock is ours the batch is on disk.
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            let _writing = lock(&shared.writing);
            let _ = tx.send(());
        });
        rx
    }

    /// Writes what is queued now, on this thread (at shutdown).
    pub fn flush(&self) {
        let _writing = lock(&self.shared.writing);
        let batch = std::mem::take(&mut lock(&self.shared.pending).files);
        write_batch(&self.shared.report, batch);
    }
}

/// Debug builds only: `TUIXIU_PERSIST_DELAY_MS` holds each batch back that
/// long, so a test can show what waits for the writer and what does not
/// (tests/proxy_runs.rs). Release builds never read it.
fn injected_delay() {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("TUIXIU_PERSIST_DELAY_MS").ok().and_then(|v| v.parse().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

fn write_batch(report: &Reporter, batch: HashMap<PathBuf, Entry>) {
    injected_delay();
    for (path, Entry { run_id, content, waiters }) in batch {
        match content {
            Some(bytes) => {
                if let Err(e) = super::identity::write_private(&path, &bytes) {
                    tracing::error!("run {run_id}: persisting its state: {e}");
                    report.push(&super::protocol::ProxyUpdate::error(
                        &run_id,
                        &format!("persisting run state: {e}"),
                    ));
                }
            }
            None => match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::error!("run {run_id}: deleting its state {}: {e}", path.display()),
            },
        }
        for waiter in waiters {
            let _ = waiter.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn latest_content_wins_and_deletes_stick() {
        let dir = std::env::temp_dir().join(format!("tuixiu-persist-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let report = Arc::new(Reporter::new(
            super::super::outbox::Outbox::new(100, 1 << 20),
            crate::env::Redactor::default(),
            crate::provider::ProviderKind::Host,
            None,
        ));
        let writer = Persister::new(report);
        let (a, b) = (dir.join("a.json"), dir.join("b.json"));
        for i in 0..50 {
            writer.write("a", a.clone(), Some(format!("{i}").into_bytes()));
            writer.write("b", b.clone(), Some(b"x".to_vec()));
        }
        writer.write("b", b.clone(), None);
        // Wait for the worker, then check.
        for _ in 0..500 {
            if !lock(&writer.shared.pending).worker {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        writer.flush();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "49");
        assert!(!b.exists());

        // Durable writes: the file is there when the receiver is told, also
        // when a newer content superseded the awaited one in the queue, and
        // when nothing is queued any more.
        let c = dir.join("c.json");
        writer.write("c", c.clone(), Some(b"1".to_vec()));
        let first = writer.on_disk(&c);
        writer.write("c", c.clone(), Some(b"2".to_vec()));
        writer.write("c", c.clone(), Some(b"3".to_vec()));
        let second = writer.on_disk(&c);
        first.await.unwrap();
        assert!(["1", "2", "3"].contains(&std::fs::read_to_string(&c).unwrap().as_str()));
        second.await.unwrap();
        assert_eq!(std::fs::read_to_string(&c).unwrap(), "3");
        writer.on_disk(&c).await.unwrap();
        assert_eq!(std::fs::read_to_string(&c).unwrap(), "3");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
