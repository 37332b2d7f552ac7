//! The audit trail: one record per item, logged at info level and, with
//! `--audit-log FILE`, appended to FILE as a JSON line. Sources are shown
//! without credentials or query strings; inline text only by its size.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::manifest::Shown;

/// One applied (or failed) item.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// Milliseconds since the Unix epoch.
    pub time_ms: u128,
    pub id: String,
    pub apply: &'static str,
    pub access: &'static str,
    pub source: String,
    /// Where the item landed, as the agent sees it.
    pub target: String,
    pub bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    /// sha256 of a downloaded archive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Size of that archive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive_bytes: Option<u64>,
    /// The archive came from the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached: Option<bool>,
    pub duration_ms: f64,
    /// `applied` or `failed`.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Record {
    pub fn now_ms() -> u128 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
    }

    pub fn millis(d: Duration) -> f64 {
        (d.as_secs_f64() * 1e6).round() / 1e3
    }
}

/// Where records go besides the log.
#[derive(Debug, Default)]
pub struct Audit {
    file: Option<File>,
}

impl Audit {
    /// Records go to the log only.
    pub fn log_only() -> Audit {
        Audit { file: None }
    }

    /// Opens `path` for appending (created 0600). Open it before the sandbox
    /// starts: the apply phase may run with other filesystem ids.
    pub fn open(path: &Path) -> std::io::Result<Audit> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        Ok(Audit { file: Some(file) })
    }

    pub fn record(&mut self, r: &Record) {
        if r.outcome == "applied" {
            tracing::info!(
                id = %Shown(&r.id),
                apply = r.apply,
                access = r.access,
                source = %Shown(&r.source),
                target = %Shown(&r.target),
                bytes = r.bytes,
                sha256 = r.sha256.as_deref().unwrap_or("-"),
                duration_ms = r.duration_ms,
                "input applied"
            );
        } else {
            tracing::info!(
                id = %Shown(&r.id),
                apply = r.apply,
                target = %Shown(&r.target),
                error = %Shown(r.error.as_deref().unwrap_or("")),
                "input failed"
            );
        }
        if let Some(file) = &mut self.file {
            let mut line = serde_json::to_vec(r).expect("a record always serializes");
            line.push(b'\n');
            // One write per record, so concurrent runs sharing a log do
            // not interleave within a line (O_APPEND).
            if let Err(e) = file.write_all(&line) {
                tracing::warn!("--audit-log: {e}");
            }
        }
    }
}
