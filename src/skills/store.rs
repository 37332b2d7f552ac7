//! Job state that survives a restart of the server.
//!
//! One JSON file per request, `<data>/jobs/<request_id>.json`, replaced
//! atomically (temporary file, `fsync`, `rename`) on every change, so a
//! crash leaves each job as it was before or after a change, never torn.
//! Files rather than a database: a job changes a handful of times, the
//! records are small and independent, and an operator can read them.
//!
//! At start every record is loaded. A job that was `running` when the
//! server stopped is marked `failed` with code
//! `ORCHESTRATOR_RESTART_INTERRUPTED`: its sandbox died with the server
//! (the launcher has a parent-death signal, and the sandbox's PID 1 dies
//! with the launcher), and running it again could repeat whatever the
//! engine already did outside (API calls, partial artifacts). A `queued`
//! job never started its engine, so it is queued again.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::hostfs::beneath as fsio;

/// Run status, as upstream names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Queued,
    Running,
    WaitingUser,
    Succeeded,
    Failed,
    Canceled,
}

impl Status {
    /// Every status, in the order a job may pass through them.
    pub const ALL: [Status; 6] = [
        Status::Queued,
        Status::Running,
        Status::WaitingUser,
        Status::Succeeded,
        Status::Failed,
        Status::Canceled,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed | Status::Canceled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::WaitingUser => "waiting_user",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Canceled => "canceled",
        }
    }
}

/// Everything known about one request and its run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub request_id: String,
    pub skill_id: String,
    pub engine: String,
    pub input: Map<String, Value>,
    pub parameter: Map<String, Value>,
    pub model: Option<String>,
    pub runtime_options: Map<String, Value>,
    pub created_at: String,
    pub updated_at: String,
    /// Set when the run is created (at create, or at upload).
    pub run_id: Option<String>,
    /// `None` while the request waits for its upload.
    pub status: Option<Status>,
    #[serde(default)]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub error: Option<Value>,
    #[serde(default)]
    pub cancel_requested: bool,
    /// A temporary skill run (`/v1/temp-skill-runs`): its package is
    /// staged under its request directory; `skill_id` is empty until then.
    #[serde(default)]
    pub temp: bool,
    /// `failed_reconciled` for a job that was running when the server stopped.
    #[serde(default)]
    pub recovery_state: Option<String>,
    #[serde(default)]
    pub recovered_at: Option<String>,
    #[serde(default)]
    pub recovery_reason: Option<String>,
    /// The request was answered with another request's succeeded run
    /// (the result cache): `run_id` is that run's.
    #[serde(default)]
    pub cache_hit: bool,
    /// The result-cache key of this request's inputs (absent for
    /// interactive jobs, temporary runs and `skills run`).
    #[serde(default)]
    pub cache_key: Option<String>,
    /// Interactive jobs only.
    #[serde(default)]
    pub interaction: Option<InteractionState>,
}

/// How an interactive job's engine continues after the user's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// The engine exits after asking and is run again with the reply
    /// (and the session it named).
    Resumable,
    /// The engine keeps running in its sandbox while it waits and reads
    /// the reply on its standard input.
    StickyProcess,
}

impl Profile {
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Resumable => "resumable",
            Profile::StickyProcess => "sticky_process",
        }
    }
}

/// A reply the job took, kept to answer a replay of it
/// (`idempotency_key`) and to resume the engine with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TakenReply {
    pub interaction_id: i64,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    pub response: Value,
    /// `user_reply`, or `auto_decide_timeout` for the server's own reply
    /// when the wait ended without one.
    pub resolution_mode: String,
    pub resolved_at: String,
}

/// An interactive job's conversation state, written with its record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InteractionState {
    pub profile: Profile,
    /// The question waiting for its answer (upstream's
    /// `PendingInteraction`), while the job is `waiting_user`.
    #[serde(default)]
    pub pending: Option<Value>,
    /// When the wait ends, milliseconds since the epoch.
    #[serde(default)]
    pub wait_deadline_ms: Option<u64>,
    /// The session a resumable engine named in its last turn.
    #[serde(default)]
    pub session: Option<String>,
    /// Every reply taken, oldest first.
    #[serde(default)]
    pub replies: Vec<TakenReply>,
    /// A resumable job's reply that its next turn starts with (the job
    /// is queued for that turn).
    #[serde(default)]
    pub next: Option<TakenReply>,
    /// Questions asked so far.
    #[serde(default)]
    pub asked: u32,
}

impl InteractionState {
    pub fn new(profile: Profile) -> InteractionState {
        InteractionState {
            profile,
            pending: None,
            wait_deadline_ms: None,
            session: None,
            replies: Vec::new(),
            next: None,
            asked: 0,
        }
    }

    /// The id of the pending question, if any.
    pub fn pending_id(&self) -> Option<i64> {
        self.pending.as_ref()?.get("interaction_id")?.as_i64()
    }

    /// Replies the server made itself when a wait ran out.
    pub fn auto_decisions(&self) -> impl Iterator<Item = &TakenReply> {
        self.replies.iter().filter(|r| r.resolution_mode == "auto_decide_timeout")
    }
}

/// The directory of job records.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    pub fn open(data_dir: &Path) -> std::io::Result<Store> {
        let dir = data_dir.join("jobs");
        std::fs::create_dir_all(&dir)?;
        Ok(Store { dir })
    }

    fn path(&self, request_id: &str) -> PathBuf {
        self.dir.join(format!("{request_id}.json"))
    }

    pub fn save(&self, record: &JobRecord) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(record).expect("a record is plain data");
        fsio::write_atomic(&self.path(&record.request_id), &bytes)
    }

    /// Removes the record of `request_id` (synced: a cleanup that
    /// answered must not come back after a crash).
    pub fn remove(&self, request_id: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.path(request_id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::File::open(&self.dir)?.sync_all()
    }

    /// The directory of the records (the result cache keeps its entries
    /// in `cache/` below it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every readable record. Leftover temporary files are removed; a record
    /// that does not parse is reported and left in place.
    pub fn load_all(&self) -> std::io::Result<Vec<JobRecord>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".tmp-") {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            let parsed = std::fs::read(entry.path())
                .and_then(|b| serde_json::from_slice::<JobRecord>(&b).map_err(std::io::Error::from));
            match parsed {
                Ok(r) if format!("{}.json", r.request_id) == name => out.push(r),
                Ok(_) => {
                    tracing::warn!("job record {name}: its request_id does not match the file name; ignored")
                }
                Err(e) => tracing::warn!("job record {name}: unreadable ({e}); ignored"),
            }
        }
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        Ok(out)
    }
}

/// Now as RFC 3339 UTC with milliseconds, e.g. `2026-11-01T12:00:00.123Z`.
pub fn now() -> String {
    rfc3339_ms(now_ms())
}

/// Now in milliseconds since the epoch.
pub fn now_ms() -> u64 {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `ms` since the epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339_ms(ms: u64) -> String {
    rfc3339(i64::try_from(ms / 1000).unwrap_or(i64::MAX), (ms % 1000) as u32)
}

fn rfc3339(secs: i64, millis: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_793_534_400, 123), "2026-11-01T12:00:00.123Z");
    }
}
