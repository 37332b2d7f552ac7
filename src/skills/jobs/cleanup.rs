//! Removing finished requests, their runs and the result cache.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use super::{ApiError, ApiResult, Service};
use crate::skills::store::Status;

impl Service {
    /// `POST /v1/jobs/cleanup`: removes every request that is finished
    /// or still waiting for its upload (its record, its request
    /// directory, its run unless a kept request shares it), and every
    /// result-cache entry. Jobs queued, running or waiting for their
    /// user are kept: their engines may be using their directories
    /// (upstream deletes those too).
    pub async fn cleanup(self: &Arc<Self>) -> ApiResult<Value> {
        let cache_entries = self.cache.clear();
        let mut removed = Vec::new();
        {
            let mut jobs = self.jobs.lock().unwrap();
            jobs.retain(|_, job| {
                let r = job.record();
                let finished = r.status.is_some_and(Status::is_terminal);
                // Claimed, so that no upload can start it meanwhile.
                let idle = r.run_id.is_none() && !job.started.swap(true, Ordering::SeqCst);
                if finished || idle {
                    removed.push(r);
                    return false;
                }
                true
            });
        }
        let kept: std::collections::HashSet<String> =
            self.jobs.lock().unwrap().values().filter_map(|j| j.record().run_id).collect();
        let (store, data_dir) = (self.store.clone(), self.cfg.data_dir.clone());
        let counts = tokio::task::spawn_blocking(move || {
            let mut runs = std::collections::HashSet::new();
            for r in &removed {
                if let Err(e) = store.remove(&r.request_id) {
                    tracing::warn!("cleanup: job record {}: {e}", r.request_id);
                }
                remove_tree(&data_dir.join("requests").join(&r.request_id));
                if let Some(run_id) = &r.run_id
                    && !kept.contains(run_id)
                    && runs.insert(run_id.clone())
                {
                    remove_tree(&data_dir.join("runs").join(run_id));
                }
            }
            (runs.len(), removed.len())
        })
        .await
        .map_err(|e| ApiError::new(500, e.to_string()))?;
        Ok(
            json!({"runs_deleted": counts.0, "requests_deleted": counts.1, "cache_entries_deleted": cache_entries}),
        )
    }
}

fn remove_tree(path: &Path) {
    if let Err(e) = std::fs::remove_dir_all(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("cleanup: {}: {e}", path.display());
    }
}
