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
//!
//! The daemon inspects instances often (every `sandbox_control inspect`,
//! every inventory), so parsed records are kept in memory and reused while
//! one `statx` of `instance.json` shows the same file: same inode, size,
//! mtime and ctime. Another process may change a record at any time (the
//! CLI's `stop`/`rm` on the same state directory); every save replaces
//! the file by rename, so a change shows up as a new inode or new times.
//! As git does with its racy index entries, a file modified less than
//! [`SETTLE`] before it was read is never trusted from memory: an inode
//! number reused within one coarse timestamp tick cannot hide a change.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::{InstanceConfig, InstanceInfo, InstanceStatus, InvalidError, ProviderError, ProviderKind};

const RECORD_VERSION: u32 = 1;

/// How old a record file must be before its parsed form is reused.
const SETTLE: Duration = Duration::from_secs(2);

/// How long [`Records::info`] reuses its check that an instance's
/// workspace and home still exist.
const DIRS_RECHECK: Duration = Duration::from_secs(1);

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
        self.info_given(kind, self.missing_dir())
    }

    /// Why the instance cannot run anything: its workspace or home is gone.
    fn missing_dir(&self) -> Option<String> {
        [("workspace", &self.workspace), ("home", &self.home)].into_iter().find_map(|(what, dir)| {
            fs::metadata(dir)
                .err()
                .map(|e| format!("{what} {}: {}", dir.display(), sandbox::error::io_error_text(&e)))
        })
    }

    fn info_given(&self, kind: ProviderKind, missing_dir: Option<String>) -> InstanceInfo {
        let mut info = InstanceInfo::missing(kind, &self.config.name);
        info.status = if self.stopped { InstanceStatus::Stopped } else { InstanceStatus::Running };
        info.created_at = Some(self.created_at.clone());
        info.run_id = Some(self.config.run_id.clone());
        info.workspace = Some(self.workspace.clone());
        if let Some(e) = missing_dir {
            info.status = InstanceStatus::Error;
            info.last_error = Some(e);
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
    /// The host pid and start time of the sandbox's PID 1, when the
    /// process is a launcher that reported it: the sandbox has ended only
    /// once that one has too.
    pub sandbox: Option<(i32, u64)>,
}

impl LiveProc {
    /// Sends `signal` through a pidfd that is checked against the recorded
    /// start time after it was opened, so a recycled pid is never hit.
    /// Returns whether the process was signalled.
    pub fn signal(&self, signal: i32) -> bool {
        let Some(fd) = self.pidfd() else { return false };
        crate::pidfd::send_signal(&fd, signal).is_ok()
    }

    /// A pidfd of the process, checked against the recorded start time
    /// after it was opened (so it never refers to a recycled pid); `None`
    /// when the process is gone. It becomes readable when the process exits.
    pub fn pidfd(&self) -> Option<std::os::fd::OwnedFd> {
        let fd = crate::pidfd::open(self.pid)?;
        (start_time(self.pid) == Some(self.start)).then_some(fd)
    }

    /// Still running (a zombie waiting for its parent counts as ended).
    pub fn alive(&self) -> bool {
        matches!(stat(self.pid), Some((state, start)) if start == self.start && state != 'Z' && state != 'X')
    }
}

/// What identifies one version of a record file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileVersion {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileVersion {
    fn of(meta: &fs::Metadata) -> FileVersion {
        FileVersion {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Last modified at least [`SETTLE`] ago (a clock set back counts as
    /// not settled).
    fn settled(&self) -> bool {
        let mtime = SystemTime::UNIX_EPOCH
            + Duration::new(self.mtime.0.max(0) as u64, self.mtime.1.clamp(0, 999_999_999) as u32);
        SystemTime::now().duration_since(mtime).is_ok_and(|age| age >= SETTLE)
    }
}

/// A parsed record and the file version it came from.
#[derive(Debug)]
struct Entry {
    version: FileVersion,
    record: Record,
    /// When the directories were last checked, and what was missing.
    dirs: Mutex<Option<(Instant, Option<String>)>>,
}

/// The records of one provider.
#[derive(Clone, Debug)]
pub(crate) struct Records {
    root: PathBuf,
    /// Settled records by instance name (shared by the clones of this value).
    cache: Arc<Mutex<HashMap<String, Arc<Entry>>>>,
}

impl Records {
    pub fn new(state_dir: &Path, kind: ProviderKind) -> Records {
        Records { root: state_dir.join(kind.cli_name()), cache: Arc::default() }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        // The map holds plain data; a panic elsewhere cannot leave it torn.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
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
            .map_err(|e| ProviderError::File { op: "open", path: path.to_path_buf(), source: e })?;
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| ProviderError::File {
            op: "flock",
            path: path.to_path_buf(),
            source: std::io::Error::from(e),
        })
    }

    /// The record of `name`, to change and [`save`](Self::save).
    pub fn load(&self, name: &str) -> Result<Option<Record>, ProviderError> {
        Ok(self.entry(name)?.map(|entry| entry.record.clone()))
    }

    /// What `inspect` reports for instance `name`. The record is read as
    /// [`load`](Self::load) does; whether its workspace and home still
    /// exist is checked at most once per [`DIRS_RECHECK`] (a burst of
    /// inspects costs one `statx` each, not three), so a directory removed
    /// behind the provider's back shows within a second.
    pub fn info(&self, name: &str, kind: ProviderKind) -> Result<Option<InstanceInfo>, ProviderError> {
        let Some(entry) = self.entry(name)? else { return Ok(None) };
        let missing_dir = {
            let mut dirs = entry.dirs.lock().unwrap_or_else(|p| p.into_inner());
            match &*dirs {
                Some((at, missing)) if at.elapsed() < DIRS_RECHECK => missing.clone(),
                _ => {
                    let missing = entry.record.missing_dir();
                    *dirs = Some((Instant::now(), missing.clone()));
                    missing
                }
            }
        };
        let mut info = entry.record.info_given(kind, missing_dir);
        if entry.record.config.egress.is_some() {
            let counts = crate::egress::read_counts(&self.dir(name).join(crate::egress::COUNTS_FILE));
            info.egress = Some(counts.unwrap_or_default());
        }
        Ok(Some(info))
    }

    /// The current version of the record of `name`: from memory while one
    /// `statx` shows the file unchanged and settled, else read and parsed.
    fn entry(&self, name: &str) -> Result<Option<Arc<Entry>>, ProviderError> {
        let path = self.dir(name).join("instance.json");
        // The version is taken before the read: a file replaced in between
        // is cached under the older version and simply read again next time.
        let version = match fs::metadata(&path) {
            Ok(meta) => FileVersion::of(&meta),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.cache().remove(name);
                return Ok(None);
            }
            Err(e) => return Err(ProviderError::File { op: "stat", path: path.to_path_buf(), source: e }),
        };
        if let Some(entry) = self.cache().get(name)
            && entry.version == version
        {
            return Ok(Some(entry.clone()));
        }
        let Some(record) = self.read(&path)? else {
            self.cache().remove(name);
            return Ok(None);
        };
        let entry = Arc::new(Entry { version, record, dirs: Mutex::new(None) });
        let mut cache = self.cache();
        if version.settled() {
            cache.insert(name.to_string(), entry.clone());
        } else {
            cache.remove(name);
        }
        Ok(Some(entry))
    }

    fn read(&self, path: &Path) -> Result<Option<Record>, ProviderError> {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ProviderError::File { op: "read", path: path.to_path_buf(), source: e }),
        };
        let record: Record = serde_json::from_slice(&bytes)
            .map_err(|e| InvalidError::Record { path: path.to_path_buf(), source: e })?;
        if record.version != RECORD_VERSION {
            return Err(InvalidError::RecordVersion {
                path: path.to_path_buf(),
                version: record.version,
                expected: RECORD_VERSION,
            }
            .into());
        }
        Ok(Some(record))
    }

    /// Writes the record atomically and synced (`hostfs::atomic`), 0600:
    /// the instance env may hold tokens. On failure the old record stays
    /// whole, with nothing beside it.
    pub fn save(&self, record: &Record) -> Result<(), ProviderError> {
        let dir = self.dir(&record.config.name);
        make_private_dir(&dir)?;
        let path = dir.join("instance.json");
        let bytes = serde_json::to_vec_pretty(record).expect("records are plain data");
        crate::hostfs::atomic::write(&path, &bytes, crate::hostfs::atomic::Durability::Synced)
            .map_err(|e| ProviderError::File { op: "write", path, source: e })
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
            Err(e) => {
                return Err(ProviderError::File { op: "read", path: self.root.to_path_buf(), source: e });
            }
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
        self.cache().remove(name);
        let dir = self.dir(name);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ProviderError::File { op: "remove", path: dir.to_path_buf(), source: e }),
        }
    }

    /// Records a live process of the instance.
    pub fn add_proc(&self, name: &str, pid: u32, kind: ProcKind) -> Result<(), ProviderError> {
        let dir = self.dir(name).join("procs");
        make_private_dir(&dir)?;
        let start = start_time(pid as i32).ok_or(InvalidError::NotRecorded { pid })?;
        let path = dir.join(pid.to_string());
        fs::write(&path, format!("{start} {}\n", kind.as_str())).map_err(|e| ProviderError::File {
            op: "write",
            path: path.to_path_buf(),
            source: e,
        })
    }

    /// Adds the sandbox's PID 1 (host pid) to the record of launcher `pid`.
    pub fn note_sandbox(&self, name: &str, pid: u32, kind: ProcKind, pid1: u32) -> Result<(), ProviderError> {
        let path = self.dir(name).join("procs").join(pid.to_string());
        let (Some(start), Some(start1)) = (start_time(pid as i32), start_time(pid1 as i32)) else {
            return Ok(()); // Already gone: nothing to wait for.
        };
        // Only over the existing record: once reaped, the process is forgotten.
        let written =
            fs::OpenOptions::new().write(true).truncate(true).open(&path).and_then(|mut f| {
                f.write_all(format!("{start} {} {pid1} {start1}\n", kind.as_str()).as_bytes())
            });
        match written {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ProviderError::File { op: "write", path: path.to_path_buf(), source: e }),
        }
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
                    let start = it.next()?.parse::<u64>().ok()?;
                    let agent = it.next()? == "agent";
                    let sandbox =
                        it.next().and_then(|p| p.parse().ok()).zip(it.next().and_then(|s| s.parse().ok()));
                    Some((start, agent, sandbox))
                }),
            );
            match parsed {
                Some((pid, (start, agent, sandbox))) if start_time(pid) == Some(start) => {
                    live.push(LiveProc {
                        pid,
                        start,
                        kind: if agent { ProcKind::Agent } else { ProcKind::Exec },
                        sandbox,
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
        Err(e) => Err(ProviderError::File { op: "create", path: dir.to_path_buf(), source: e }),
    }
}

/// Makes sure an existing directory is not readable by others.
pub(crate) fn restrict_dir(dir: &Path) -> Result<(), ProviderError> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|e| ProviderError::File {
        op: "chmod 0700",
        path: dir.to_path_buf(),
        source: e,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn records(dir: &Path) -> Records {
        Records::new(dir, ProviderKind::Native)
    }

    fn record(r: &Records, name: &str, run_id: &str) -> Record {
        r.new_record(&InstanceConfig::new(name, run_id, "/tmp"), PathBuf::from("/tmp"), None)
    }

    fn set_mtime(r: &Records, name: &str, mtime: SystemTime) {
        let file = File::options().write(true).open(r.dir(name).join("instance.json")).unwrap();
        file.set_modified(mtime).unwrap();
    }

    /// Sets the file's mtime far enough back that its parsed form may be
    /// reused from memory.
    fn age(r: &Records, name: &str) {
        set_mtime(r, name, SystemTime::now() - SETTLE * 10);
    }

    /// Two readers of one state directory (the daemon and a CLI process)
    /// and a settled record `tuixiu-a` of run `run-1`.
    fn daemon_and_cli_with_a_settled_record() -> (tempfile::TempDir, Records, Records) {
        let state = tempfile::tempdir().unwrap();
        let (daemon, cli) = (records(state.path()), records(state.path()));
        daemon.save(&record(&daemon, "tuixiu-a", "run-1")).unwrap();
        age(&daemon, "tuixiu-a");
        (state, daemon, cli)
    }

    #[test]
    fn a_settled_record_replaced_by_another_process_is_read_again() {
        let (_state, daemon, cli) = daemon_and_cli_with_a_settled_record();
        assert_eq!(daemon.load("tuixiu-a").unwrap().unwrap().config.run_id, "run-1");
        assert!(daemon.cache().contains_key("tuixiu-a"), "a settled record is kept in memory");

        // Same length, then aged to the very same mtime: only the inode and
        // ctime tell the versions apart.
        let mut changed = cli.load("tuixiu-a").unwrap().unwrap();
        changed.config.run_id = "run-2".into();
        let before = fs::metadata(cli.dir("tuixiu-a").join("instance.json")).unwrap();
        cli.save(&changed).unwrap();
        set_mtime(&cli, "tuixiu-a", before.modified().unwrap());
        assert_eq!(daemon.load("tuixiu-a").unwrap().unwrap().config.run_id, "run-2");
    }

    #[test]
    fn a_fresh_record_is_never_served_from_memory() {
        let state = tempfile::tempdir().unwrap();
        let r = records(state.path());
        r.save(&record(&r, "tuixiu-a", "run-1")).unwrap();
        assert!(r.load("tuixiu-a").unwrap().is_some());
        assert!(!r.cache().contains_key("tuixiu-a"), "modified within SETTLE: read from disk every time");
    }

    #[test]
    fn a_deleted_record_is_gone_for_every_reader() {
        let (_state, daemon, cli) = daemon_and_cli_with_a_settled_record();
        assert!(daemon.load("tuixiu-a").unwrap().is_some());
        cli.delete("tuixiu-a").unwrap();
        assert!(daemon.load("tuixiu-a").unwrap().is_none());
        assert!(!daemon.cache().contains_key("tuixiu-a"));
    }

    #[test]
    fn a_vanished_workspace_shows_as_an_error_within_the_recheck_interval() {
        let state = tempfile::tempdir().unwrap();
        let workspace = tempfile::tempdir().unwrap();
        let r = records(state.path());
        let mut rec = record(&r, "tuixiu-a", "run-1");
        rec.workspace = workspace.path().to_path_buf();
        fs::create_dir_all(&rec.home).unwrap();
        r.save(&rec).unwrap();
        age(&r, "tuixiu-a");
        let info = r.info("tuixiu-a", ProviderKind::Native).unwrap().unwrap();
        assert_eq!(info.status, InstanceStatus::Running, "{info:?}");

        let path = workspace.path().to_path_buf();
        drop(workspace);
        std::thread::sleep(DIRS_RECHECK + Duration::from_millis(50));
        let info = r.info("tuixiu-a", ProviderKind::Native).unwrap().unwrap();
        assert_eq!(info.status, InstanceStatus::Error);
        let error = info.last_error.unwrap();
        assert!(error.starts_with(&format!("workspace {}:", path.display())), "{error}");
    }
}
