//! Instance records of the providers that have no daemon of their own to
//! remember instances (native and host), kept in the state directory:
//!
//! ```text
//! <state>/<provider>/            0700
//!   .lock                        flock while an instance is created, stopped or removed
//!   <name>/instance.json         0600: the InstanceConfig and the life-cycle state
//!   <name>/home/                 the default home (when the caller gave none)
//!   <name>/procs/<pid>           one per live process: "<start time> <agent|exec>"
//! ```
//!
//! Process records let `stop` and `rm` find processes that another
//! `tuixiu-sandbox` process started; the start time (field 22 of
//! `/proc/<pid>/stat`) guards against recycled pids.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::{InstanceConfig, InstanceInfo, InstanceStatus, ProviderError, ProviderKind};

const RECORD_VERSION: u32 = 1;

/// What is persisted for one instance.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub version: u32,
    pub created_at: String,
    pub stopped: bool,
    /// The canonical host workspace.
    pub workspace: PathBuf,
    /// The host home: the caller's directory or `<name>/home`.
    pub home: PathBuf,
    /// Whether `home` belongs to the record (and goes with it).
    pub owns_home: bool,
    pub config: InstanceConfig,
}

impl Record {
    pub fn info(&self, kind: ProviderKind) -> InstanceInfo {
        let mut info = InstanceInfo::missing(kind, &self.config.name);
        info.status = if self.stopped { InstanceStatus::Stopped } else { InstanceStatus::Running };
        info.created_at = Some(self.created_at.clone());
        info.run_id = Some(self.config.run_id.clone());
        info.workspace = Some(self.workspace.clone());
        // A record whose directories vanished cannot run anything.
        for (what, dir) in [("workspace", &self.workspace), ("home", &self.home)] {
            if let Err(e) = fs::metadata(dir) {
                info.status = InstanceStatus::Error;
                info.last_error =
                    Some(format!("{what} {}: {}", dir.display(), sandbox::error::io_error_text(&e)));
                break;
            }
        }
        info
    }
}

/// The kind of a recorded process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProcKind {
    Agent,
    Exec,
}

impl ProcKind {
    fn as_str(self) -> &'static str {
        match self {
            ProcKind::Agent => "agent",
            ProcKind::Exec => "exec",
        }
    }
}

/// A recorded process that is still alive.
pub(crate) struct LiveProc {
    pub pid: i32,
    pub start: u64,
    pub kind: ProcKind,
}

impl LiveProc {
    /// Sends `signal` through a pidfd that is checked against the recorded
    /// start time after it was opened, so a recycled pid is never hit.
    /// Returns whether the process was signalled.
    pub fn signal(&self, signal: i32) -> bool {
        // SAFETY: pidfd_open returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, 0) };
        if fd < 0 {
            return false;
        }
        // SAFETY: the kernel just gave us this descriptor; dropping closes it.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
        if start_time(self.pid) != Some(self.start) {
            return false;
        }
        // SAFETY: a valid pidfd, no siginfo, no flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        rc == 0
    }

    /// Still running (a zombie waiting for its parent counts as ended).
    pub fn alive(&self) -> bool {
        matches!(stat(self.pid), Some((state, start)) if start == self.start && state != 'Z' && state != 'X')
    }
}

/// The records of one provider.
#[derive(Clone, Debug)]
pub(crate) struct Records {
    root: PathBuf,
}

impl Records {
    pub fn new(state_dir: &Path, kind: ProviderKind) -> Records {
        Records { root: state_dir.join(kind.cli_name()) }
    }

    /// The directory of instance `name` (which has been validated: no `/`,
    /// no leading `.`).
    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn ensure_root(&self) -> Result<(), ProviderError> {
        make_private_dir(&self.root)
    }

    /// Serializes creations, stops and removals across processes.
    pub fn lock(&self) -> Result<Flock<File>, ProviderError> {
        self.ensure_root()?;
        let path = self.root.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| ProviderError::io(format!("open {}", path.display()), &e))?;
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| {
            ProviderError::io(format!("flock {}", path.display()), &std::io::Error::from(e))
        })
    }

    pub fn load(&self, name: &str) -> Result<Option<Record>, ProviderError> {
        let path = self.dir(name).join("instance.json");
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ProviderError::io(format!("read {}", path.display()), &e)),
        };
        let record: Record = serde_json::from_slice(&bytes)
            .map_err(|e| ProviderError::Invalid(format!("instance record {}: {e}", path.display())))?;
        if record.version != RECORD_VERSION {
            return Err(ProviderError::Invalid(format!(
                "instance record {}: version {} is not supported (expected {RECORD_VERSION})",
                path.display(),
                record.version
            )));
        }
        Ok(Some(record))
    }

    /// Writes the record atomically (temporary file, then rename), 0600:
    /// the instance env may hold tokens.
    pub fn save(&self, record: &Record) -> Result<(), ProviderError> {
        let dir = self.dir(&record.config.name);
        make_private_dir(&dir)?;
        let path = dir.join("instance.json");
        let tmp = dir.join(".instance.json.tmp");
        let bytes = serde_json::to_vec_pretty(record).expect("records are plain data");
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|e| ProviderError::io(format!("write {}", path.display()), &e))
    }

    pub fn new_record(&self, config: &InstanceConfig, workspace: PathBuf, home: Option<PathBuf>) -> Record {
        let owns_home = home.is_none();
        let home = home.unwrap_or_else(|| self.dir(&config.name).join("home"));
        Record {
            version: RECORD_VERSION,
            created_at: super::now_rfc3339(),
            stopped: false,
            workspace,
            home,
            owns_home,
            config: config.clone(),
        }
    }

    /// The names of every recorded instance, sorted.
    pub fn names(&self) -> Result<Vec<String>, ProviderError> {
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ProviderError::io(format!("read {}", self.root.display()), &e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("instance.json").exists())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Deletes the instance's directory (its default home included).
    pub fn delete(&self, name: &str) -> Result<(), ProviderError> {
        let dir = self.dir(name);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ProviderError::io(format!("remove {}", dir.display()), &e)),
        }
    }

    /// Records a live process of the instance.
    pub fn add_proc(&self, name: &str, pid: u32, kind: ProcKind) -> Result<(), ProviderError> {
        let dir = self.dir(name).join("procs");
        make_private_dir(&dir)?;
        let start = start_time(pid as i32).ok_or_else(|| {
            ProviderError::Invalid(format!("process {pid} ended before it could be recorded"))
        })?;
        let path = dir.join(pid.to_string());
        fs::write(&path, format!("{start} {}\n", kind.as_str()))
            .map_err(|e| ProviderError::io(format!("write {}", path.display()), &e))
    }

    pub fn remove_proc(&self, name: &str, pid: u32) {
        let _ = fs::remove_file(self.dir(name).join("procs").join(pid.to_string()));
    }

    /// The recorded processes that are still alive; stale records are removed.
    pub fn live_procs(&self, name: &str) -> Vec<LiveProc> {
        let dir = self.dir(name).join("procs");
        let Ok(entries) = fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut live = Vec::new();
        for entry in entries.filter_map(|e| e.ok()) {
            let path = entry.path();
            let parsed = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()).zip(
                fs::read_to_string(&path).ok().and_then(|text| {
                    let mut it = text.split_whitespace();
                    Some((it.next()?.parse::<u64>().ok()?, it.next()? == "agent"))
                }),
            );
            match parsed {
                Some((pid, (start, agent))) if start_time(pid) == Some(start) => {
                    live.push(LiveProc {
                        pid,
                        start,
                        kind: if agent { ProcKind::Agent } else { ProcKind::Exec },
                    });
                }
                _ => {
                    let _ = fs::remove_file(&path);
                }
            }
        }
        live
    }
}

/// Creates `dir` (and parents) with mode 0700 for the last component.
pub(crate) fn make_private_dir(dir: &Path) -> Result<(), ProviderError> {
    match fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) => Err(ProviderError::io(format!("create {}", dir.display()), &e)),
    }
}

/// Makes sure an existing directory is not readable by others.
pub(crate) fn restrict_dir(dir: &Path) -> Result<(), ProviderError> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| ProviderError::io(format!("chmod 0700 {}", dir.display()), &e))
}

/// Field 22 of `/proc/<pid>/stat`: the start time in clock ticks since boot.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// The state (field 3) and start time (field 22) of a process.
fn stat(pid: i32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and ')'; fields after
    // the last ')' start at field 3.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.nth(18)?.parse().ok()?))
}
