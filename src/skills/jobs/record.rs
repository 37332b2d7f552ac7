//! How a job's record changes: every change is stamped and written to the
//! store in turn with the job's other changes.

use std::path::PathBuf;

use super::{ApiError, ApiResult, Job, Service};
use crate::skills::store::{self, JobRecord};

impl Service {
    /// Applies `change` to the job's record, stamps it and writes it.
    pub(in crate::skills) async fn update(
        &self,
        job: &Job,
        change: impl FnOnce(&mut JobRecord),
    ) -> JobRecord {
        self.update_after(job, change, None).await
    }

    /// As `update`; `first` is synced before the record is written (a
    /// file the new record refers to), after the change is visible.
    pub(in crate::skills) async fn update_after(
        &self,
        job: &Job,
        change: impl FnOnce(&mut JobRecord),
        first: Option<PathBuf>,
    ) -> JobRecord {
        let _order = job.persist.lock().await;
        job.state.send_modify(|r| {
            change(r);
            r.updated_at = store::now();
        });
        self.save_now(job.record(), first).await
    }

    /// Decides on the record in turn with every other change: `decide`
    /// sees the current record and either refuses (nothing changes),
    /// leaves it (`Ok(false)`), or changes it (`Ok(true)`: stamped,
    /// written, then returned). Used where an answer depends on the state
    /// (replies, cancel).
    pub(in crate::skills) async fn update_if(
        &self,
        job: &Job,
        decide: impl FnOnce(&mut JobRecord) -> ApiResult<bool>,
    ) -> ApiResult<JobRecord> {
        let _order = job.persist.lock().await;
        let mut next = job.record();
        if !decide(&mut next)? {
            return Ok(next);
        }
        next.updated_at = store::now();
        job.state.send_replace(next.clone());
        Ok(self.save_now(next, None).await)
    }

    async fn save_now(&self, record: JobRecord, first: Option<PathBuf>) -> JobRecord {
        let (store, copy) = (self.store.clone(), record.clone());
        let save = move || {
            if let Some(first) = first {
                crate::hostfs::beneath::sync_file(&first).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("cannot sync {}: {e}", first.display()))
                })?;
            }
            store.save(&copy)
        };
        match tokio::task::spawn_blocking(save).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!("cannot save job {}: {e}", record.request_id),
            Err(e) => tracing::error!("cannot save job {}: {e}", record.request_id),
        }
        record
    }

    /// Writes a new record (not yet in memory) before it is answered.
    pub(in crate::skills) async fn save_new(&self, record: &JobRecord) -> ApiResult<()> {
        let (store, copy) = (self.store.clone(), record.clone());
        tokio::task::spawn_blocking(move || store.save(&copy))
            .await
            .map_err(|e| ApiError::new(500, e.to_string()))?
            .map_err(|e| ApiError::new(500, format!("cannot record the job: {e}")))
    }
}
