//! The daemon's liveness, for health checks: `<state_dir>/status.json`.
//!
//! While the daemon's thread runs, a task rewrites the file every
//! `heartbeat_seconds` (at most every 10 s): pid, proxy id, whether the
//! backend has registered it, the number of runs, and the time. A check
//! (`tuixiu-sandbox check --daemon DIR`, the image's HEALTHCHECK, the
//! Kubernetes probes) reads it: the daemon is alive when its pid exists and
//! the file is younger than three intervals plus five seconds. Being
//! registered is reported, not required: a daemon that waits for its
//! backend is healthy, and restarting it would not bring the backend back.
//! Nothing is listening anywhere for this, and nothing in the file is
//! secret (it is 0644 in the 0700 state directory).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::Daemon;

/// The file's name in the state directory.
pub const FILE: &str = "status.json";

/// What the file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub pid: u32,
    pub proxy_id: String,
    /// Registered with the backend right now.
    pub connected: bool,
    pub runs: usize,
    /// Unix seconds of this write.
    pub updated_at: u64,
    /// Seconds between writes.
    pub interval_seconds: u64,
    /// What the daemon warned about at startup that an operator should
    /// fix (private directories where sandboxes see: `exposed.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Rewrites the status file until the daemon's runtime stops.
pub async fn keep_writing(daemon: Arc<Daemon>) {
    let interval = daemon.cfg().heartbeat_seconds.clamp(1, 10);
    let path = daemon.cfg().state_dir.join(FILE);
    loop {
        let status = Status {
            pid: std::process::id(),
            proxy_id: daemon.proxy_id().to_string(),
            connected: daemon.connected(),
            runs: daemon.run_context().runs().len(),
            updated_at: now(),
            interval_seconds: interval,
            warnings: daemon.path_warnings().to_vec(),
        };
        // A few hundred bytes on the local state directory, without fsync:
        // cheaper than a hop to the blocking pool. A failure shows up as a
        // stale file, which is what a health check should see.
        if let Err(e) = write(&path, &status) {
            tracing::warn!("status file {}: {e}", path.display());
        }
        tokio::time::sleep(Duration::from_secs(interval)).await;
    }
}

fn write(path: &Path, status: &Status) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(status).expect("plain data");
    crate::hostfs::atomic::write(path, &bytes, crate::hostfs::atomic::Durability::Unsynced)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Why there is no live daemon.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(
        "{}: {} (no daemon has run with this state directory, or it cannot be read)",
        .path.display(),
        sandbox::error::io_error_text(.source)
    )]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: not a status file: {source}", .path.display())]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("{}: bad pid", .0.display())]
    BadPid(PathBuf),
    #[error("the daemon (pid {pid}) is gone; its last status is {age} s old")]
    Gone { pid: libc::pid_t, age: u64 },
    #[error(
        "the daemon (pid {pid}) has not updated its status for {age} s (limit {limit} s): its thread is stuck"
    )]
    Stuck { pid: libc::pid_t, age: u64, limit: u64 },
}

/// A live daemon's status, or why there is none.
pub fn check(state_dir: &Path) -> Result<(Status, u64), StatusError> {
    let path = state_dir.join(FILE);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(source) => return Err(StatusError::Read { path, source }),
    };
    let status: Status = match serde_json::from_slice(&text) {
        Ok(s) => s,
        Err(source) => return Err(StatusError::Parse { path, source }),
    };
    let age = now().saturating_sub(status.updated_at);
    let Ok(pid) = libc::pid_t::try_from(status.pid) else { return Err(StatusError::BadPid(path)) };
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return Err(StatusError::Gone { pid, age });
    }
    let limit = 3 * status.interval_seconds + 5;
    if age > limit {
        return Err(StatusError::Stuck { pid, age, limit });
    }
    Ok((status, age))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_status_of_a_live_process_is_healthy_and_stale_or_dead_is_not() {
        let dir = std::env::temp_dir().join(format!("tuixiu-status-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut status = Status {
            pid: std::process::id(),
            proxy_id: "p".into(),
            connected: true,
            runs: 2,
            updated_at: now(),
            interval_seconds: 10,
            warnings: vec!["w".into()],
        };
        assert!(check(&dir).unwrap_err().to_string().contains("ENOENT"));
        write(&dir.join(FILE), &status).unwrap();
        assert_eq!(check(&dir).unwrap().0, status);

        status.updated_at -= 60;
        write(&dir.join(FILE), &status).unwrap();
        assert!(check(&dir).unwrap_err().to_string().contains("has not updated its status for 60 s"));

        // A pid that cannot exist (above pid_max's ceiling).
        status.updated_at = now();
        status.pid = 4_194_304 + 1;
        write(&dir.join(FILE), &status).unwrap();
        assert!(check(&dir).unwrap_err().to_string().contains("is gone"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
