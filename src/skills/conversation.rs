//! Interactive jobs at the service: the pending question, replies, and
//! the end of a wait (docs/skills.md, "Interactive jobs").
//!
//! A resumable job that asked has no engine running: its record holds
//! the question, the session and the wait's deadline, and a timer task
//! ends the wait. A reply queues the job again (it needs a place in the
//! queue, 429 otherwise) with the reply as its next turn's prompt. A
//! sticky job's engine keeps running in its sandbox: its task registered
//! where replies go ([`super::jobs::Job`]'s `sticky`) and watches the
//! deadline itself; a reply is handed to the engine's stdin at once.
//!
//! When a wait runs out: with `interactive_require_user_reply: false` the
//! server replies itself (upstream's auto-decision payload) and the job
//! goes on; otherwise the job fails with `INTERACTION_WAIT_TIMEOUT`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::interaction::{self, Verdict, session_timeout};
use super::jobs::{ApiError, ApiResult, Family, Job, Service};
use super::protocol::ReplyRequest;
use super::run;
use super::store::{self, InteractionState, JobRecord, Profile, Status, TakenReply};

/// How a sticky engine's wait ended.
pub(super) enum WaitEnd {
    /// The server replied for the user.
    Reply(TakenReply),
    /// Nobody replied: the job failed.
    Expired,
    /// A reply came in just before the deadline: it is on its way.
    Replied,
}

impl Service {
    /// `GET /v1/jobs/{id}/interaction/pending`.
    pub fn pending(&self, family: Family, request_id: &str) -> ApiResult<Value> {
        let (_, r, _) = self.run_of(family, request_id)?;
        ensure_interactive(&r)?;
        let status = r.status.unwrap_or(Status::Queued);
        let pending = match status {
            Status::WaitingUser => r.interaction.and_then(|i| i.pending),
            _ => None,
        };
        Ok(json!({"request_id": r.request_id, "status": status.as_str(), "pending": pending}))
    }

    /// `POST /v1/jobs/{id}/interaction/reply`.
    pub async fn reply(
        self: &Arc<Self>,
        family: Family,
        request_id: &str,
        reply: ReplyRequest,
    ) -> ApiResult<Value> {
        let (job, r, _) = self.run_of(family, request_id)?;
        ensure_interactive(&r)?;
        let mut verdict = Verdict::Replay;
        let record = self
            .update_if(&job, |r| {
                let code =
                    r.error.as_ref().and_then(|e| e.get("code")).and_then(Value::as_str).map(str::to_string);
                let Some(state) = r.interaction.as_mut() else {
                    return Err(ApiError::new(409, "Run is not waiting for user interaction"));
                };
                // A job being canceled takes no more replies.
                let status = if r.cancel_requested { Some(Status::Canceled) } else { r.status };
                verdict = interaction::judge(status, code.as_deref(), state, &reply)?;
                if verdict == Verdict::Replay {
                    return Ok(false);
                }
                let taken = TakenReply {
                    interaction_id: reply.interaction_id,
                    idempotency_key: reply.idempotency_key.clone(),
                    response: reply.response.clone(),
                    resolution_mode: "user_reply".into(),
                    resolved_at: store::now(),
                };
                r.status = Some(self.continue_with(&job, state, taken)?);
                Ok(true)
            })
            .await?;
        if verdict == Verdict::Take && record.status == Some(Status::Queued) {
            tokio::spawn(Arc::clone(self).run_job(job, None));
        }
        let status = record.status.unwrap_or(Status::Queued).as_str();
        Ok(json!({"request_id": record.request_id, "status": status, "accepted": true}))
    }

    /// Takes `taken` as the answer to the pending question: a sticky
    /// engine gets it on its stdin (the job is `running`), a resumable
    /// job is admitted to the queue for its next turn (`queued`). Called
    /// with the job's record being changed, in turn with other changes.
    fn continue_with(&self, job: &Job, state: &mut InteractionState, taken: TakenReply) -> ApiResult<Status> {
        let status = match state.profile {
            Profile::StickyProcess => {
                let sent =
                    job.sticky.lock().unwrap().as_ref().is_some_and(|tx| tx.try_send(taken.clone()).is_ok());
                if !sent {
                    return Err(ApiError::new(409, "sticky process lost"));
                }
                Status::Running
            }
            Profile::Resumable => {
                self.admit()?;
                state.next = Some(taken.clone());
                Status::Queued
            }
        };
        state.pending = None;
        state.wait_deadline_ms = None;
        state.replies.push(taken);
        Ok(status)
    }

    /// A sticky engine asked: the job waits for its user, with `replies`
    /// where the replies go. Returns when the wait ends.
    pub(super) async fn enter_wait(
        &self,
        job: &Job,
        pending: Value,
        replies: mpsc::Sender<TakenReply>,
    ) -> Instant {
        let record = job.record();
        let timeout = session_timeout(&record);
        if let Some(run_id) = &record.run_id {
            let profile = run::profile_json(Some(Profile::StickyProcess), &record);
            run::write_waiting(&self.run_paths(run_id), &pending, profile);
        }
        *job.sticky.lock().unwrap() = Some(replies);
        let deadline_ms = store::now_ms().saturating_add(timeout.as_millis() as u64);
        self.update(job, |r| {
            r.status = Some(Status::WaitingUser);
            let i = r.interaction.get_or_insert_with(|| InteractionState::new(Profile::StickyProcess));
            i.pending = Some(pending);
            i.asked += 1;
            i.wait_deadline_ms = Some(deadline_ms);
        })
        .await;
        Instant::now() + timeout
    }

    /// A sticky engine's wait for question `id` ran out.
    pub(super) async fn wait_over(&self, job: &Job, id: i64) -> WaitEnd {
        let mut end = WaitEnd::Replied;
        let _ = self
            .update_if(job, |r| {
                let require = require_reply(r);
                let Some(state) = r.interaction.as_mut().filter(|i| i.pending_id() == Some(id)) else {
                    return Ok(false);
                };
                if r.status != Some(Status::WaitingUser) {
                    return Ok(false);
                }
                let pending = state.pending.take().unwrap_or_default();
                state.wait_deadline_ms = None;
                if require {
                    // Failed once its engine is gone (the job's task
                    // records it); replies are refused from now on.
                    r.status = Some(Status::Running);
                    r.error = Some(wait_timeout_error());
                    end = WaitEnd::Expired;
                } else {
                    let auto = interaction::auto_reply(&pending, store::now());
                    state.replies.push(auto.clone());
                    r.status = Some(Status::Running);
                    end = WaitEnd::Reply(auto);
                }
                Ok(true)
            })
            .await;
        end
    }

    /// Arms the timer of a resumable job that waits for its user.
    pub(super) fn arm_wait(self: &Arc<Self>, job: Arc<Job>) {
        let record = job.record();
        let Some(state) = record.interaction.as_ref() else { return };
        let (Some(id), Some(deadline)) = (state.pending_id(), state.wait_deadline_ms) else { return };
        let svc = Arc::clone(self);
        tokio::spawn(async move {
            let left = deadline.saturating_sub(store::now_ms());
            let mut stopping = svc.stopping.subscribe();
            tokio::select! {
                () = tokio::time::sleep(std::time::Duration::from_millis(left)) => {}
                _ = async { stopping.wait_for(|s| *s).await.is_ok() } => return,
            }
            svc.resumable_wait_over(job, id, deadline).await;
        });
    }

    /// A resumable job's wait for question `id` (until `deadline`) ran
    /// out: the server's reply queues the next turn, or the job fails.
    async fn resumable_wait_over(self: Arc<Self>, job: Arc<Job>, id: i64, deadline: u64) {
        let mut acted = false;
        let paths = job.record().run_id.as_deref().map(|id| self.run_paths(id));
        let record = self
            .update_if(&job, |r| {
                let require = require_reply(r);
                let Some(state) = r.interaction.as_mut() else { return Ok(false) };
                if r.status != Some(Status::WaitingUser)
                    || state.pending_id() != Some(id)
                    || state.wait_deadline_ms != Some(deadline)
                {
                    return Ok(false);
                }
                if require {
                    state.pending = None;
                    state.wait_deadline_ms = None;
                    r.status = Some(Status::Failed);
                    r.error = Some(wait_timeout_error());
                    if let Some(paths) = &paths {
                        run::write_failed(paths, &wait_timeout_error());
                        run::cleanup(paths);
                    }
                } else {
                    // The server's own reply is not refused for a full
                    // queue: the job was admitted once already.
                    self.active.fetch_add(1, Ordering::SeqCst);
                    let auto =
                        interaction::auto_reply(state.pending.as_ref().unwrap_or(&Value::Null), store::now());
                    state.next = Some(auto.clone());
                    state.replies.push(auto);
                    state.pending = None;
                    state.wait_deadline_ms = None;
                    r.status = Some(Status::Queued);
                }
                acted = true;
                Ok(true)
            })
            .await;
        let Ok(record) = record else { return };
        if !acted {
            return;
        }
        if record.status == Some(Status::Queued) {
            tracing::info!("job {}: no reply in time; the server replied for the user", record.request_id);
            tokio::spawn(Arc::clone(&self).run_job(job, None));
        } else {
            tracing::info!("job {}: no reply in time; failed", record.request_id);
        }
    }
}

/// 400 unless the request asked for an interactive job (upstream's text).
fn ensure_interactive(record: &JobRecord) -> ApiResult<()> {
    if super::protocol::is_interactive(&record.runtime_options) {
        Ok(())
    } else {
        Err(ApiError::new(400, "Interaction endpoints require runtime_options.execution_mode=interactive"))
    }
}

/// `interactive_require_user_reply` (default true).
fn require_reply(record: &JobRecord) -> bool {
    record.runtime_options.get("interactive_require_user_reply").and_then(Value::as_bool).unwrap_or(true)
}

fn wait_timeout_error() -> Value {
    json!({"code": "INTERACTION_WAIT_TIMEOUT", "message": "INTERACTION_WAIT_TIMEOUT: the user did not reply in time"})
}
