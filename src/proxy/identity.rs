//! The daemon's identity (`proxyId`) and the lock that keeps a second
//! daemon off the same state directory.
//!
//! The id comes from `[agent] id` (or `ACP_PROXY_AGENT_ID`); without one it is
//! generated once (`<hostname>-<uuid>`) and kept in `<state>/identity.json`, so
//! it is stable across restarts (docs/protocol.md, "Identity and
//! proxy_id_conflict").
//!
//! The backend keys its connections by this id and misbehaves when two sockets
//! share it (the older one's close marks the newer one offline:
//! docs/protocol.md, "Identity and proxy_id_conflict"). So the daemon takes an
//! exclusive `flock` on `<state>/daemon.lock` for its whole life; a second
//! daemon with the same state directory (hence the same persisted id and the
//! same runs) refuses to start and names the holder.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{context}: {reason}")]
    Io { context: String, reason: String },
    #[error(
        "another tuixiu-sandbox proxy already runs with state directory {state} ({holder}); \
         two daemons must not share a proxy id or a state directory: stop it, or give this one \
         its own [agent] id and state_dir"
    )]
    Locked { state: String, holder: String },
    #[error("{path}: {reason} (delete it to generate a new proxy id)")]
    Corrupt { path: String, reason: String },
}

fn io(context: impl Into<String>, e: &std::io::Error) -> IdentityError {
    IdentityError::Io { context: context.into(), reason: sandbox::error::io_error_text(e) }
}

/// What `identity.json` holds (the Node proxy's shape).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct IdentityFile {
    agent_id: String,
    #[serde(default)]
    hostname: String,
    #[serde(default)]
    created_at: String,
}

/// The id and the held lock. Dropping it releases the lock.
#[derive(Debug)]
pub struct Identity {
    pub proxy_id: String,
    /// Whether the id came from the config rather than `identity.json`.
    pub configured: bool,
    _lock: Flock<File>,
}

/// Creates `dir` 0700 (and parents), and makes an existing one 0700: run
/// state holds `init.env`, which carries tokens.
pub fn private_dir(dir: &Path) -> Result<(), IdentityError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io(format!("create {}", dir.display()), &e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io(format!("chmod 0700 {}", dir.display()), &e))
}

/// Locks the state directory, then resolves the proxy id.
pub fn acquire(state_dir: &Path, configured: Option<&str>) -> Result<Identity, IdentityError> {
    private_dir(state_dir)?;
    let lock_path = state_dir.join("daemon.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| io(format!("open {}", lock_path.display()), &e))?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(IdentityError::Locked {
                state: state_dir.display().to_string(),
                holder: if holder.is_empty() { "holder unknown".into() } else { holder.to_string() },
            });
        }
        Err((_, e)) => return Err(io(format!("flock {}", lock_path.display()), &std::io::Error::from(e))),
    };
    let (proxy_id, from_config) = match configured {
        Some(id) => (id.to_string(), true),
        None => (persisted_id(state_dir)?, false),
    };
    // Who holds the lock, for the next daemon's error message.
    let note = format!("pid {}, proxy id {proxy_id}", std::process::id());
    let _ = lock.set_len(0);
    let _ = lock.rewind();
    let _ = lock.write_all(note.as_bytes());
    Ok(Identity { proxy_id, configured: from_config, _lock: lock })
}

fn identity_path(state_dir: &Path) -> PathBuf {
    state_dir.join("identity.json")
}

/// The id in `identity.json`, created on first use.
fn persisted_id(state_dir: &Path) -> Result<String, IdentityError> {
    let path = identity_path(state_dir);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let file: IdentityFile = serde_json::from_slice(&bytes).map_err(|e| IdentityError::Corrupt {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            crate::provider::names::validate_instance_name(&file.agent_id, "").map_err(|e| {
                IdentityError::Corrupt {
                    path: path.display().to_string(),
                    reason: format!("agentId: {}", e.reason),
                }
            })?;
            Ok(file.agent_id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let host = hostname();
            let id = format!("{host}-{}", uuid::Uuid::new_v4());
            let file = IdentityFile { agent_id: id.clone(), hostname: host, created_at: super::now_iso() };
            write_private(&path, &serde_json::to_vec_pretty(&file).expect("plain data"))?;
            tracing::info!("generated proxy id {id} (kept in {})", path.display());
            Ok(id)
        }
        Err(e) => Err(io(format!("read {}", path.display()), &e)),
    }
}

/// Writes `bytes` to `path` atomically with mode 0600, the data and the
/// rename synced ([`crate::hostfs::atomic`]): a full or failing disk
/// leaves the old file whole, and no temporary file beside it.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), IdentityError> {
    use crate::hostfs::atomic::{Durability, write};
    write(path, bytes, Durability::SyncedRename).map_err(|e| io(format!("write {}", path.display()), &e))
}

/// The host name reduced to `[a-z0-9-]` (as the Node proxy sanitizes it).
fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut out: String =
        raw.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    out = out.trim_matches('-').chars().take(40).collect();
    if out.is_empty() { "proxy".into() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_and_locked() {
        let dir = std::env::temp_dir().join(format!("tuixiu-identity-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = acquire(&dir, None).unwrap();
        assert!(!first.configured);
        let err = acquire(&dir, None).unwrap_err().to_string();
        assert!(err.contains("already runs") && err.contains(&first.proxy_id), "{err}");
        let id = first.proxy_id.clone();
        drop(first);
        let again = acquire(&dir, None).unwrap();
        assert_eq!(again.proxy_id, id);
        let mode = std::fs::metadata(dir.join("identity.json")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        drop(again);
        let configured = acquire(&dir, Some("proxy-prod-01")).unwrap();
        assert_eq!(configured.proxy_id, "proxy-prod-01");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
