//! The daemon's blocking pool: work that may block (filesystem calls,
//! reading a terminal's spilled output, tree walks and removals) runs on
//! threads of its own, never on the daemon's one event-loop thread, so a
//! slow or hostile request of one run cannot stall the others, the link or
//! its heartbeats (docs/architecture.md, "Threading").
//!
//! Two bounds, both counted in jobs running at once: the pool's
//! [`THREADS`], shared by every run, and each run's [`PER_RUN`]. A run
//! whose jobs wait for its own share holds none of the pool's: with
//! `THREADS` well above `PER_RUN`, one run saturating its share leaves the
//! rest to the others, who are served in the order they asked (the
//! semaphores are fair). A job keeps its permits until it ends, even when
//! whoever awaited it went away (a cancelled request): the bound counts
//! what really runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Semaphore;

/// Jobs of all runs running at once.
pub const THREADS: usize = 16;
/// Jobs of one run running at once.
pub const PER_RUN: usize = 4;

/// The pool: its threads are tokio's blocking threads, admitted here.
pub struct Pool {
    threads: Arc<Semaphore>,
    per_run: usize,
    /// Each run's share, while something holds it (the agent of the run,
    /// a job of it): an agent restarted while jobs of its predecessor still
    /// run gets the same share.
    runs: Mutex<HashMap<String, Weak<Semaphore>>>,
}

impl Pool {
    pub fn new(threads: usize, per_run: usize) -> Arc<Pool> {
        Arc::new(Pool {
            threads: Arc::new(Semaphore::new(threads.max(1))),
            per_run: per_run.max(1),
            runs: Mutex::default(),
        })
    }

    /// The pool of the daemon: [`THREADS`] and [`PER_RUN`].
    pub fn daemon() -> Arc<Pool> {
        Pool::new(THREADS, PER_RUN)
    }

    /// The share of `run` (`""`: work that belongs to no run).
    pub fn share(self: &Arc<Self>, run: &str) -> Share {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        let sem = match runs.get(run).and_then(Weak::upgrade) {
            Some(sem) => sem,
            None => {
                runs.retain(|_, w| w.strong_count() > 0);
                let sem = Arc::new(Semaphore::new(self.per_run));
                runs.insert(run.to_string(), Arc::downgrade(&sem));
                sem
            }
        };
        Share { pool: self.clone(), run: sem }
    }
}

/// A job that panicked, with its message.
#[derive(Debug, thiserror::Error)]
#[error("a blocking job failed: it panicked ({0})")]
pub struct Panicked(pub String);

/// One run's way into the pool.
#[derive(Clone)]
pub struct Share {
    pool: Arc<Pool>,
    run: Arc<Semaphore>,
}

impl Share {
    /// Runs `job` on a blocking thread once the run and the pool have room
    /// for it, and waits for its result (a panic in `job` is an error, for
    /// the caller to report).
    pub async fn run<T, F>(&self, job: F) -> Result<T, Panicked>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        // Neither semaphore is ever closed.
        let run = self.run.clone().acquire_owned().await.expect("the run's share is never closed");
        let thread = self.pool.threads.clone().acquire_owned().await.expect("the pool is never closed");
        let handle = tokio::task::spawn_blocking(move || {
            let _permits = (run, thread);
            job()
        });
        match handle.await {
            Ok(v) => Ok(v),
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                let text = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(Panicked(text))
            }
            // Cancelled: the runtime is shutting down, and this task with it.
            Err(_) => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// One run saturating its share never takes the others' room, and no
    /// run runs more than its share at once.
    #[tokio::test(flavor = "current_thread")]
    async fn shares_bound_each_run_and_leave_room_for_others() {
        let pool = Pool::new(4, 2);
        let peak = Arc::new(AtomicUsize::new(0));
        let now = Arc::new(AtomicUsize::new(0));
        let a = pool.share("a");
        let mut hogs = Vec::new();
        for _ in 0..8 {
            let (a, peak, now) = (a.clone(), peak.clone(), now.clone());
            hogs.push(tokio::spawn(async move {
                a.run(move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                    now.fetch_sub(1, Ordering::SeqCst);
                })
                .await
                .unwrap()
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Run b gets a thread at once, though a has 6 jobs waiting.
        let t = std::time::Instant::now();
        pool.share("b").run(|| ()).await.unwrap();
        assert!(t.elapsed() < Duration::from_millis(80), "b waited {:?}", t.elapsed());
        for h in hogs {
            h.await.unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 2, "run a ran more than its share at once");
        // The same run's share is the same semaphore while it is held.
        assert!(Arc::ptr_eq(&pool.share("a").run, &a.run));
        // A panic is an error, and its permits come back.
        let e = a.run(|| panic!("boom")).await.unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
        assert_eq!(a.run.available_permits(), 2);
    }
}
