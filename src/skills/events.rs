//! `GET /v1/jobs/{id}/events`: a job's logs and status as server-sent
//! events, with upstream's event names (docs/skills.md, "Live events").
//!
//! `snapshot` first (`status`, the offsets the stream starts from, the
//! pending question's id); then `stdout` / `stderr` chunks (`from`, `to`,
//! `chunk`: byte offsets into `logs/stdout.txt` / `stderr.txt`, at most
//! 8 KiB each, cut at a character boundary), `status` when it changes,
//! `heartbeat` after 5 s without anything else; `end` with `reason`
//! `waiting_user` (after the status that says so) or `terminal` (after
//! the last of the logs and the final status). A client resumes with the
//! last `to` of each log as `stdout_from` / `stderr_from`. The logs are
//! looked at every 200 ms; a status change is sent at once.
//!
//! A client that goes away ends its stream (`client_closed`, in the
//! server's log: nobody is left to read it); so does the server stopping,
//! without an `end`.

use std::collections::VecDeque;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::Duration;

use axum::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use super::jobs::{ApiResult, Family, Service};
use super::protocol::EventsQuery;
use super::store::{JobRecord, Status};

/// Largest `chunk` of one log event.
const CHUNK: u64 = 8 * 1024;
/// How often the logs are looked at.
const POLL: Duration = Duration::from_millis(200);
/// Quiet time before a `heartbeat`.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// The event stream of `request_id`, as frames of `text/event-stream`.
pub fn stream(
    svc: &Service,
    family: Family,
    request_id: &str,
    from: EventsQuery,
) -> ApiResult<impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> + use<>> {
    let (job, _, paths) = svc.run_of(family, request_id)?;
    let feed = Feed {
        record: job.watch(),
        stopping: svc.stopping.subscribe(),
        logs: [paths.logs.join("stdout.txt"), paths.logs.join("stderr.txt")],
        at: [from.stdout_from, from.stderr_from],
        last_status: None,
        frames: VecDeque::new(),
        quiet_since: Instant::now(),
        ended: false,
        request_id: request_id.to_string(),
    };
    Ok(futures_util::stream::unfold(feed, |mut feed| async move {
        loop {
            if let Some(frame) = feed.frames.pop_front() {
                return Some((Ok(frame), feed));
            }
            if feed.ended {
                return None;
            }
            feed.step().await;
        }
    }))
}

struct Feed {
    record: watch::Receiver<JobRecord>,
    stopping: watch::Receiver<bool>,
    /// stdout, stderr.
    logs: [PathBuf; 2],
    at: [u64; 2],
    last_status: Option<&'static str>,
    frames: VecDeque<Bytes>,
    quiet_since: Instant,
    ended: bool,
    request_id: String,
}

impl Drop for Feed {
    fn drop(&mut self) {
        if !self.ended {
            tracing::debug!("events of {}: end (client_closed)", self.request_id);
        }
    }
}

impl Feed {
    fn push(&mut self, event: &str, data: Value) {
        self.frames.push_back(Bytes::from(format!("event: {event}\ndata: {data}\n\n")));
        self.quiet_since = Instant::now();
    }

    /// One look at the job: the snapshot first, then new log bytes and
    /// the status; waits when there is nothing to send.
    async fn step(&mut self) {
        let record = self.record.borrow_and_update().clone();
        let status = record.status.unwrap_or(Status::Queued);
        let pending = pending_id(&record);
        let Some(last) = self.last_status else {
            let mut snapshot =
                json!({"status": status.as_str(), "stdout_offset": self.at[0], "stderr_offset": self.at[1]});
            if let Some(id) = pending {
                snapshot["pending_interaction_id"] = json!(id);
            }
            self.push("snapshot", snapshot);
            self.last_status = Some(status.as_str());
            return;
        };
        let finished = status.is_terminal();
        let ending = finished || status == Status::WaitingUser;
        // At an end, everything the logs hold; until then, a chunk each.
        let read = self.read_logs(if ending { usize::MAX } else { 1 });
        if status.as_str() != last || status == Status::WaitingUser || finished {
            let mut event = json!({"status": status.as_str(), "updated_at": record.updated_at});
            if let Some(code) = record.error.as_ref().and_then(|e| e.get("code")).filter(|c| c.is_string()) {
                event["error_code"] = code.clone();
            }
            if let Some(id) = pending {
                event["pending_interaction_id"] = json!(id);
            }
            self.push("status", event);
            self.last_status = Some(status.as_str());
            if status == Status::WaitingUser || finished {
                let reason = if finished { "terminal" } else { "waiting_user" };
                self.push("end", json!({"reason": reason}));
                self.ended = true;
                return;
            }
        }
        if read {
            return;
        }
        if self.quiet_since.elapsed() >= HEARTBEAT {
            self.push("heartbeat", json!({"ts": super::store::now()}));
            return;
        }
        tokio::select! {
            changed = self.record.changed() => self.ended = changed.is_err(),
            _ = async { self.stopping.wait_for(|s| *s).await.is_ok() } => self.ended = true,
            () = tokio::time::sleep(POLL) => {}
        }
    }

    /// Queues what the logs gained, up to `chunks` chunks of each;
    /// whether anything was.
    fn read_logs(&mut self, chunks: usize) -> bool {
        let mut any = false;
        for (i, event) in ["stdout", "stderr"].into_iter().enumerate() {
            for _ in 0..chunks {
                let Some((to, chunk)) = read_chunk(&self.logs[i], self.at[i]) else { break };
                let from = self.at[i];
                self.at[i] = to;
                self.push(event, json!({"from": from, "to": to, "chunk": chunk}));
                any = true;
            }
        }
        any
    }
}

/// The pending question's id while the job waits for its user.
fn pending_id(record: &JobRecord) -> Option<i64> {
    if record.status != Some(Status::WaitingUser) {
        return None;
    }
    record.interaction.as_ref()?.pending_id()
}

/// The bytes of `path` from `from` (at most [`CHUNK`], ending at a
/// character boundary unless that would leave nothing), with the offset
/// after them; `None` when there is nothing new.
fn read_chunk(path: &PathBuf, from: u64) -> Option<(u64, String)> {
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    if from >= len {
        return None;
    }
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut buf = Vec::with_capacity(CHUNK.min(len - from) as usize);
    file.take(CHUNK.min(len - from)).read_to_end(&mut buf).ok()?;
    if buf.is_empty() {
        return None;
    }
    let more = from + (buf.len() as u64) < len;
    if more && let Err(e) = std::str::from_utf8(&buf) {
        // A character cut at the end comes whole in the next chunk.
        if e.error_len().is_none() && e.valid_up_to() > 0 {
            buf.truncate(e.valid_up_to());
        }
    }
    Some((from + buf.len() as u64, String::from_utf8_lossy(&buf).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_end_at_character_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut text = "a".repeat(CHUNK as usize - 1);
        text.push('é');
        text.push_str("tail");
        std::fs::write(&path, &text).unwrap();
        let (to, chunk) = read_chunk(&path, 0).unwrap();
        assert_eq!((to, chunk.len()), (CHUNK - 1, CHUNK as usize - 1));
        let (to, chunk) = read_chunk(&path, to).unwrap();
        assert_eq!(chunk, "étail");
        assert_eq!(to, text.len() as u64);
        assert!(read_chunk(&path, to).is_none());
        assert!(read_chunk(&dir.path().join("none"), 0).is_none());
    }
}
