//! Resource limits: a delegated cgroup v2 subtree when one is writable,
//! rlimits otherwise, and a wall-clock timeout kept by the launcher.
//!
//! The launcher decides before `clone` and says on stderr what is in
//! force (info level), and in one warning line what was asked for but
//! could not be applied. Nothing is claimed that is not enforced:
//!
//! | asked       | cgroup v2 (preferred)      | fallback                                  |
//! |-------------|----------------------------|-------------------------------------------|
//! | `memory`    | `memory.max`, `memory.swap.max = 0` | `RLIMIT_AS` per process (address space, not RSS: said in the warning) |
//! | `cpus`      | `cpu.max`                  | none (reported as not applied)             |
//! | `pids`      | `pids.max`                 | `RLIMIT_NPROC` in the sandbox's user namespace; not for a sandbox user that maps onto host root, whom the kernel exempts |
//! | `nofile`    | —                          | `RLIMIT_NOFILE` (always)                   |
//! | `timeout`   | the launcher: SIGTERM, a grace period, then SIGKILL to the whole sandbox |
//!
//! Cgroup: the launcher's own cgroup (from `/proc/self/cgroup`) when its
//! `cgroup.subtree_control` has, or can be given, the controllers; for a
//! root caller also the hierarchy's root. A child group
//! `tuixiu-sandbox-<pid>` is created there, the sandbox's PID 1 is moved
//! into it right after `clone` (before it runs anything), and it is killed
//! and removed when the sandbox ends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{SpecError, SyscallError};

/// Limits asked for; `None` means unlimited.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Limits {
    /// Bytes of memory for the whole sandbox.
    pub memory: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU (1500 = 1.5 CPUs).
    pub cpu_millis: Option<u64>,
    /// Processes and threads in the sandbox.
    pub pids: Option<u64>,
    /// Open file descriptors per process.
    pub nofile: Option<u64>,
    /// Wall-clock limit of the command, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// After the timeout's SIGTERM, how long before SIGKILL (default 5 s).
    pub kill_after_ms: Option<u64>,
    /// Bytes of each private tmpfs that does not give its own size (`/tmp`,
    /// `/dev/shm`, a tmpfs home, `/scratch`, extra tmpfs mounts); `None` for
    /// [`DEFAULT_TMPFS_SIZE`].
    pub tmpfs_size: Option<u64>,
}

/// The default size of each private tmpfs. Without it each could take half
/// of the host's RAM, and a memory limit that falls back to `RLIMIT_AS`
/// does not count tmpfs pages.
pub const DEFAULT_TMPFS_SIZE: u64 = 1 << 30;

/// Bytes per inode a sized tmpfs allows: as many files as pages fit, so
/// empty files cannot exhaust kernel memory past the size either.
const TMPFS_BYTES_PER_INODE: u64 = 4096;

impl Limits {
    /// `(size, nr_inodes)` for a tmpfs without its own size.
    pub(crate) fn tmpfs_options(&self) -> (u64, u64) {
        tmpfs_sized(self.tmpfs_size.unwrap_or(DEFAULT_TMPFS_SIZE))
    }
}

/// `(size, nr_inodes)` of a tmpfs of `size` bytes (at least one page).
pub(crate) fn tmpfs_sized(size: u64) -> (u64, u64) {
    (size.max(TMPFS_BYTES_PER_INODE), (size / TMPFS_BYTES_PER_INODE).max(1024))
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }
}

/// A cgroup created for one sandbox; removed on drop.
pub(crate) struct Cgroup {
    pub dir: PathBuf,
}

impl Cgroup {
    /// Moves `pid` (the sandbox's PID 1, not yet running anything) in.
    pub(crate) fn add(&self, pid: libc::pid_t) -> Result<(), SyscallError> {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).map_err(|e| {
            SyscallError::new(
                "move the sandbox into its cgroup",
                format!("write(\"{}\", \"{pid}\")", procs.display()),
                nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)),
            )
        })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Anything left (the sandbox's PID 1 is gone, so only stragglers
        // that are exiting) is killed, then the group removed.
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        for _ in 0..50 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(_) => return,
            }
        }
    }
}

/// What was decided before clone.
#[derive(Default)]
pub(crate) struct Prepared {
    pub cgroup: Option<Cgroup>,
    pub rlimits: Vec<(libc::c_int, u64)>,
    pub timeout: Option<Duration>,
    pub kill_after: Duration,
}

/// Default grace between the timeout's SIGTERM and SIGKILL.
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(5);

pub(crate) fn prepare(limits: &Limits, user_is_host_root: bool) -> Result<Prepared, SpecError> {
    let mut out = Prepared {
        timeout: limits.timeout_ms.map(Duration::from_millis),
        kill_after: limits.kill_after_ms.map_or(DEFAULT_KILL_AFTER, Duration::from_millis),
        ..Prepared::default()
    };
    if limits.timeout_ms == Some(0) {
        return Err(SpecError::new("--timeout must be more than 0"));
    }
    let mut applied: Vec<String> = Vec::new();
    let mut not_applied: Vec<String> = Vec::new();

    let wanted = wanted_controllers(limits);
    let mut in_cgroup: Vec<&str> = Vec::new();
    if !wanted.is_empty() {
        match create_cgroup(&wanted) {
            Ok((cg, usable)) => {
                let wrote;
                (in_cgroup, wrote) = write_cgroup_limits(&cg, limits, &usable);
                if in_cgroup.is_empty() {
                    drop(cg);
                } else {
                    applied.push(format!("cgroup v2 {} ({})", cg.dir.display(), wrote.join(", ")));
                    out.cgroup = Some(cg);
                }
            }
            Err(why) => tracing::info!("cgroup v2: {why}"),
        }
    }

    let rlimits = rlimit_fallbacks(limits, &in_cgroup, user_is_host_root, &mut applied, &mut not_applied);
    out.rlimits.extend(rlimits);
    if let Some(n) = limits.nofile {
        out.rlimits.push((libc::RLIMIT_NOFILE as libc::c_int, n));
        applied.push(format!("RLIMIT_NOFILE={n}"));
    }
    if let Some(t) = out.timeout {
        applied.push(format!("timeout {:?} (then SIGTERM, SIGKILL after {:?})", t, out.kill_after));
    }
    if !applied.is_empty() {
        tracing::info!("limits in force: {}", applied.join("; "));
    }
    for line in not_applied {
        tracing::warn!("{line}");
    }
    Ok(out)
}

/// The cgroup v2 controllers the limits ask for.
fn wanted_controllers(limits: &Limits) -> Vec<&'static str> {
    let mut wanted = Vec::new();
    if limits.memory.is_some() {
        wanted.push("memory");
    }
    if limits.cpu_millis.is_some() {
        wanted.push("cpu");
    }
    if limits.pids.is_some() {
        wanted.push("pids");
    }
    wanted
}

/// Writes the limits into the sandbox's cgroup `cg`, for the controllers
/// in `usable`: the controllers whose limit was written, and the
/// `file=value` lines written.
fn write_cgroup_limits(cg: &Cgroup, limits: &Limits, usable: &[&str]) -> (Vec<&'static str>, Vec<String>) {
    let mut in_cgroup = Vec::new();
    let mut wrote = Vec::new();
    let mut write = |file: &str, value: String| -> bool {
        let ok = std::fs::write(cg.dir.join(file), &value).is_ok();
        if ok {
            wrote.push(format!("{file}={value}"));
        }
        ok
    };
    if let (Some(bytes), true) = (limits.memory, usable.contains(&"memory"))
        && write("memory.max", bytes.to_string())
    {
        // Without this the limit only moves the excess to swap.
        let _ = write("memory.swap.max", "0".into());
        in_cgroup.push("memory");
    }
    if let (Some(millis), true) = (limits.cpu_millis, usable.contains(&"cpu"))
        && write("cpu.max", format!("{} 100000", millis * 100))
    {
        in_cgroup.push("cpu");
    }
    if let (Some(n), true) = (limits.pids, usable.contains(&"pids"))
        && write("pids.max", n.to_string())
    {
        in_cgroup.push("pids");
    }
    (in_cgroup, wrote)
}

/// The rlimits standing in for the cgroup limits not set (`in_cgroup`
/// says which were), and what is and is not in force because of that.
fn rlimit_fallbacks(
    limits: &Limits,
    in_cgroup: &[&str],
    user_is_host_root: bool,
    applied: &mut Vec<String>,
    not_applied: &mut Vec<String>,
) -> Vec<(libc::c_int, u64)> {
    let mut rlimits = Vec::new();
    if let Some(bytes) = limits.memory
        && !in_cgroup.contains(&"memory")
    {
        rlimits.push((libc::RLIMIT_AS as libc::c_int, bytes));
        not_applied.push(format!(
            "--memory: no writable cgroup v2 with the memory controller; applied RLIMIT_AS={bytes} instead, \
             which limits each process's address space, not the sandbox's total memory \
             (runtimes that reserve large virtual ranges, such as the JVM or Go, may fail to start)"
        ));
        applied.push(format!("RLIMIT_AS={bytes}"));
    }
    if let Some(millis) = limits.cpu_millis
        && !in_cgroup.contains(&"cpu")
    {
        not_applied.push(format!(
            "--cpus {}: NOT applied: no writable cgroup v2 with the cpu controller (there is no rlimit equivalent)",
            millis as f64 / 1000.0
        ));
    }
    if let Some(n) = limits.pids
        && !in_cgroup.contains(&"pids")
    {
        if user_is_host_root {
            not_applied.push(format!(
                "--pids {n}: NOT applied: no writable cgroup v2 with the pids controller, and the kernel exempts \
                 processes of host root (which the sandbox user maps onto) from RLIMIT_NPROC; use --map-uid"
            ));
        } else {
            rlimits.push((libc::RLIMIT_NPROC as libc::c_int, n));
            applied.push(format!("RLIMIT_NPROC={n} (per user, in the sandbox's user namespace)"));
            not_applied.push(format!(
                "--pids {n}: no writable cgroup v2 with the pids controller; applied RLIMIT_NPROC={n} instead"
            ));
        }
    }
    rlimits
}

/// The cgroup2 mount point and its root (for cgroup namespaces).
fn cgroup2_mount() -> Option<(PathBuf, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split(' ').next()? != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = left.split(' ').collect();
        Some((PathBuf::from(fields.get(4)?), fields.get(3)?.to_string()))
    })
}

/// This process's cgroup v2 directory.
pub fn own_cgroup_dir() -> Option<PathBuf> {
    let (mount, root) = cgroup2_mount()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let rel = path.strip_prefix(root.trim_end_matches('/')).unwrap_or(path);
    Some(mount.join(rel.trim_start_matches('/')))
}

fn controllers(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// Where a sandbox cgroup with `wanted` controllers could go, and which of
/// them it would get; `Err` says why none.
pub fn delegation(wanted: &[&str]) -> Result<(PathBuf, Vec<String>), String> {
    let Some((mount, _)) = cgroup2_mount() else {
        return Err("no cgroup2 filesystem is mounted".into());
    };
    let mut candidates = Vec::new();
    if let Some(own) = own_cgroup_dir() {
        candidates.push(own);
    }
    if nix::unistd::geteuid().is_root() && !candidates.contains(&mount) {
        candidates.push(mount.clone());
    }
    let mut reasons = Vec::new();
    for dir in candidates {
        let available = controllers(&dir.join("cgroup.controllers"));
        for c in wanted {
            let enabled = controllers(&dir.join("cgroup.subtree_control"));
            if !enabled.iter().any(|e| e == c) && available.iter().any(|a| a == c) {
                let _ = std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}"));
            }
        }
        let enabled = controllers(&dir.join("cgroup.subtree_control"));
        let usable: Vec<String> =
            wanted.iter().filter(|c| enabled.iter().any(|e| e == *c)).map(|c| c.to_string()).collect();
        if usable.is_empty() {
            reasons.push(format!(
                "{}: controllers {:?} not enabled for children (available: {:?})",
                dir.display(),
                wanted,
                available
            ));
            continue;
        }
        if access_w(&dir) {
            return Ok((dir, usable));
        }
        reasons.push(format!("{}: not writable", dir.display()));
    }
    Err(reasons.join("; "))
}

/// Removes the cgroups of killed launchers in `parent`: a
/// `tuixiu-sandbox-<pid>` whose launcher is gone (the pid names no
/// process). The kernel removes only an empty cgroup, so one that still
/// holds a process stays; a live launcher's is never touched, and one of
/// a pid that was reused by another process stays until that ends.
fn remove_stale_cgroups(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) =
            name.to_str().and_then(|n| n.strip_prefix(CGROUP_PREFIX)).and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // Signal 0 only asks whether the pid names a process.
        let gone = pid > 0 && crate::sys::kill(pid, 0) == Err(nix::errno::Errno::ESRCH);
        if gone && std::fs::remove_dir(entry.path()).is_ok() {
            tracing::info!("removed the cgroup {} of a killed sandbox", entry.path().display());
        }
    }
}

fn access_w(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// The name prefix of a sandbox's cgroup; the launcher's pid follows.
const CGROUP_PREFIX: &str = "tuixiu-sandbox-";

fn create_cgroup(wanted: &[&str]) -> Result<(Cgroup, Vec<&'static str>), String> {
    let (parent, usable) = delegation(wanted)?;
    remove_stale_cgroups(&parent);
    let dir = parent.join(format!("{CGROUP_PREFIX}{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    let usable = ["memory", "cpu", "pids"].into_iter().filter(|c| usable.iter().any(|u| u == c)).collect();
    Ok((Cgroup { dir }, usable))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_cgroups_are_those_of_launchers_that_are_gone() {
        let parent = std::env::temp_dir().join(format!("tuixiu-cgroup-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir(&parent).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let names = [
            format!("{CGROUP_PREFIX}{dead}"),
            format!("{CGROUP_PREFIX}{}", std::process::id()),
            format!("{CGROUP_PREFIX}notes"),
            "other".to_string(),
        ];
        for n in &names {
            std::fs::create_dir(parent.join(n)).unwrap();
        }
        remove_stale_cgroups(&parent);
        let mut left: Vec<String> = std::fs::read_dir(&parent)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = names[1..].to_vec();
        want.sort();
        assert_eq!(left, want);
        std::fs::remove_dir_all(&parent).unwrap();
    }
}
