//! Admitting a job and starting it: its run directory, then a free slot
//! or the queue.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::{ApiError, ApiResult, Direct, Job, Service};
use crate::skills::store::{InteractionState, JobRecord, Profile, Status};

impl Service {
    /// Counts a job in, or refuses it when the queue is full.
    pub(in crate::skills) fn admit(&self) -> ApiResult<()> {
        let limit = self.cfg.max_concurrent + self.cfg.max_queue;
        let admitted = self
            .active
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < limit).then_some(n + 1))
            .is_ok();
        if admitted { Ok(()) } else { Err(ApiError::new(429, "Job queue is full")) }
    }

    /// Creates the run (moving in `uploads` when given), records it and
    /// starts its task; returns once the record is on disk. The job was
    /// admitted. With a free slot the job is recorded once, as `running`,
    /// by its task, while the run is prepared (the engine waits for that
    /// record); otherwise as `queued` here, and as `running` once a slot
    /// frees. Either way the answer follows a synced record, and a restart
    /// requeues only a job whose engine cannot have started.
    pub(in crate::skills) async fn start(
        self: &Arc<Self>,
        job: Arc<Job>,
        uploads: Option<PathBuf>,
    ) -> ApiResult<()> {
        let run_id = uuid::Uuid::new_v4().to_string();
        let paths = self.run_paths(&run_id);
        // The rest of the run directory is made by `run::prepare`.
        let prepared = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&paths.workspace)?;
            if let Some(src) = uploads {
                std::fs::rename(&src, &paths.uploads)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| ApiError::new(500, e.to_string()));
        if let Err(e) =
            prepared.and_then(|r| r.map_err(|e| ApiError::new(500, format!("cannot create the run: {e}"))))
        {
            self.active.fetch_sub(1, Ordering::SeqCst);
            job.started.store(false, Ordering::SeqCst);
            return Err(e);
        }
        let interaction = self.profile_of(&job.record()).map(InteractionState::new);
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => {
                job.state.send_modify(|r| {
                    r.run_id = Some(run_id);
                    r.status = Some(Status::Running);
                    r.error = None;
                    r.interaction = interaction;
                });
                let (saved, recorded) = oneshot::channel();
                tokio::spawn(Arc::clone(self).run_job(job, Some(Direct { permit, saved })));
                // Dropped unsent only when the job ended first (a cancel
                // recorded it).
                let _ = recorded.await;
            }
            Err(_) => {
                self.update(&job, |r| {
                    r.run_id = Some(run_id);
                    r.status = Some(Status::Queued);
                    r.error = None;
                    r.interaction = interaction;
                })
                .await;
                tokio::spawn(Arc::clone(self).run_job(job, None));
            }
        }
        Ok(())
    }

    /// How the engine of an interactive job continues after a question
    /// (`None` for an auto job): resumable when the engine has a resume
    /// command, else sticky.
    pub(in crate::skills) fn profile_of(&self, record: &JobRecord) -> Option<Profile> {
        if !crate::skills::protocol::is_interactive(&record.runtime_options) {
            return None;
        }
        let resumable = self.cfg.engines.get(&record.engine).is_some_and(|e| e.resumable().is_some());
        Some(if resumable { Profile::Resumable } else { Profile::StickyProcess })
    }
}
