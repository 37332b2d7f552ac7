//! Opening the data directory, and what a restart does with the jobs an
//! earlier server left unfinished.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::sync::{Semaphore, watch};

use super::{Config, Job, Service};
use crate::skills::cache::Cache;
use crate::skills::install::Installs;
use crate::skills::run::{self, RunPaths};
use crate::skills::store::{self, JobRecord, Profile, Status, Store};

/// Why the service could not open its data directory.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("data dir {}: {}", .dir.display(), sandbox::error::io_error_text(.source))]
    DataDir { dir: PathBuf, source: std::io::Error },
    #[error("data dir {}: {source}", .dir.display())]
    Store { dir: PathBuf, source: std::io::Error },
    #[error("loading jobs: {0}")]
    Load(std::io::Error),
    #[error("saving job {id}: {source}")]
    Save { id: String, source: std::io::Error },
}

/// What a restart does with a job found in the store.
enum Recovery {
    Keep,
    Requeue,
    /// Waiting for its user across the restart: the wait timer again.
    Rewait,
}

impl Service {
    /// Opens the data directory and loads the jobs of an earlier server
    /// (see [`Service::recover`] for what happens to those that were not
    /// finished).
    pub async fn open(cfg: Config) -> Result<Arc<Service>, OpenError> {
        // Uploads, artifacts and logs are private to the server's user
        // (and the sandbox user, which maps onto it).
        for d in ["jobs", "requests", "runs", "tmp", "installs"] {
            let dir = cfg.data_dir.join(d);
            std::fs::create_dir_all(&dir)
                .and_then(|()| {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                })
                .map_err(|source| OpenError::DataDir { dir: dir.clone(), source })?;
        }
        // Leftovers of interrupted uploads.
        clear_dir(&cfg.data_dir.join("tmp"));
        let store_error = |source| OpenError::Store { dir: cfg.data_dir.clone(), source };
        let store = Store::open(&cfg.data_dir).map_err(store_error)?;
        let cache = Cache::open(store.dir(), &cfg.data_dir, cfg.cache_entries).map_err(store_error)?;
        let installs = Arc::new(Installs::open(&cfg.data_dir.join("installs")).map_err(store_error)?);
        let records = store.load_all().map_err(OpenError::Load)?;
        let svc = Arc::new(Service {
            slots: Arc::new(Semaphore::new(cfg.max_concurrent.max(1))),
            cfg,
            store,
            cache,
            jobs: Mutex::new(HashMap::new()),
            active: AtomicUsize::new(0),
            stopping: watch::Sender::new(false),
            installs,
        });
        let mut again = Vec::new();
        for mut record in records {
            let recovery = svc.recover(&mut record)?;
            let id = record.request_id.clone();
            svc.jobs.lock().unwrap().insert(id.clone(), Job::new(record));
            again.push((id, recovery));
        }
        for (id, recovery) in again {
            let job = svc.job(&id).expect("just inserted");
            match recovery {
                Recovery::Keep => {}
                Recovery::Requeue => {
                    svc.active.fetch_add(1, Ordering::SeqCst);
                    tracing::info!("job {id} was queued when the server stopped: queued again");
                    tokio::spawn(Arc::clone(&svc).run_job(job, None));
                }
                Recovery::Rewait => {
                    tracing::info!(
                        "job {id} was waiting for its user when the server stopped: still waiting"
                    );
                    svc.arm_wait(job);
                }
            }
        }
        Ok(svc)
    }

    /// A job found at start that was not finished:
    ///
    /// * `queued`: its engine never started; queued again.
    /// * `running`: its sandbox died with the server, and running the
    ///   engine again could repeat what it already did outside (model
    ///   calls, partial artifacts): `failed`,
    ///   `ORCHESTRATOR_RESTART_INTERRUPTED`.
    /// * `waiting_user`, resumable: nothing runs while it waits, and its
    ///   session and home are on disk: still waiting
    ///   (`recovered_waiting`), its wait timer armed for what is left.
    /// * `waiting_user`, sticky: its engine died with the server:
    ///   `failed`, `INTERACTION_PROCESS_LOST` (as upstream).
    fn recover(&self, record: &mut JobRecord) -> Result<Recovery, OpenError> {
        let profile = record.interaction.as_ref().map(|i| i.profile);
        let (code, reason) = match (record.status, profile) {
            (Some(Status::Queued), _) => return Ok(Recovery::Requeue),
            (Some(Status::WaitingUser), Some(Profile::Resumable)) => {
                record.recovery_state = Some("recovered_waiting".into());
                record.recovery_reason = Some("resumable_waiting_preserved".into());
                record.recovered_at = Some(store::now());
                self.store
                    .save(record)
                    .map_err(|source| OpenError::Save { id: record.request_id.clone(), source })?;
                return Ok(Recovery::Rewait);
            }
            (Some(Status::WaitingUser), _) => {
                ("INTERACTION_PROCESS_LOST", "sticky process context cannot survive orchestrator restart")
            }
            (Some(Status::Running), _) => (
                "ORCHESTRATOR_RESTART_INTERRUPTED",
                "the server stopped while the engine was running; the sandbox was killed with it",
            ),
            _ => return Ok(Recovery::Keep),
        };
        let now = store::now();
        record.status = Some(Status::Failed);
        record.error = Some(json!({"code": code, "message": format!("{code}: {reason}")}));
        record.recovery_state = Some("failed_reconciled".into());
        record.recovery_reason = Some(reason.into());
        record.recovered_at = Some(now.clone());
        record.updated_at = now;
        if let Some(i) = record.interaction.as_mut() {
            i.pending = None;
            i.wait_deadline_ms = None;
        }
        self.store
            .save(record)
            .map_err(|source| OpenError::Save { id: record.request_id.clone(), source })?;
        if let Some(run_id) = &record.run_id {
            run::cleanup(&RunPaths::new(&self.cfg.data_dir, run_id));
        }
        tracing::warn!("job {} was not finished when the server stopped: {code}", record.request_id);
        Ok(Recovery::Keep)
    }
}

fn clear_dir(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        }
    }
}
