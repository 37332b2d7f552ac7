//! Canceling a job.

use serde_json::{Value, json};

use super::{ApiResult, Family, Service};
use crate::skills::run;
use crate::skills::store::{Profile, Status};

impl Service {
    /// `POST /v1/jobs/{id}/cancel`. A job waiting for its user with no
    /// engine running (resumable) is canceled here; otherwise its task
    /// stops the engine and records the outcome.
    pub async fn cancel(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let (job, r, paths) = self.run_of(family, request_id)?;
        let answer = |status: &str, accepted: bool, message: &str| json!({"request_id": r.request_id, "run_id": r.run_id, "status": status, "accepted": accepted, "message": message});
        let mut already = None;
        let mut now_canceled = false;
        self.update_if(&job, |rec| {
            let status = rec.status.unwrap_or(Status::Queued);
            if status.is_terminal() {
                already = Some((status.as_str(), "Run already in terminal state"));
                return Ok(false);
            }
            if rec.cancel_requested {
                already = Some(("canceled", "Cancel already requested"));
                return Ok(false);
            }
            rec.cancel_requested = true;
            let idle = status == Status::WaitingUser
                && rec.interaction.as_ref().is_some_and(|i| i.profile == Profile::Resumable);
            if idle {
                run::write_canceled(&paths);
                run::cleanup(&paths);
                rec.status = Some(Status::Canceled);
                rec.error = Some(json!({"code": "CANCELED_BY_USER", "message": "Canceled by user request"}));
                if let Some(i) = rec.interaction.as_mut() {
                    i.pending = None;
                    i.wait_deadline_ms = None;
                }
                now_canceled = true;
            }
            Ok(true)
        })
        .await?;
        if let Some((status, message)) = already {
            return Ok(answer(status, false, message));
        }
        if !now_canceled {
            job.cancel.send_replace(true);
        }
        Ok(answer("canceled", true, "Cancel request accepted"))
    }
}
