//! Reaching a running sandbox from outside: its root directory and a
//! process whose namespaces to join.
//!
//! The sandbox's PID 1 is not dumpable (confine.rs), so `/proc/<pid1>/root`,
//! its `ns/*` and `setns` through its pidfd need `CAP_SYS_PTRACE` in the
//! launcher's user namespace. The owner has it when it is root, or root of
//! a user namespace it launched from (nested). An unprivileged owner does
//! not; it goes through PID 1's oldest child instead, the command, which is
//! dumpable, runs as the owner's uid and has the same root and namespaces
//! (the default seccomp profile denies it `unshare`, `setns`, `chroot` and
//! `pivot_root`). Even when the command could change its own root or
//! namespaces (`--seccomp unconfined`), what the owner then reaches is a
//! view the command made of the sandbox, as the command's own uid: nothing
//! the command could not reach itself.
//!
//! The child is taken from `/proc/<pid1>/task/<pid1>/children` (or a scan
//! of `/proc` without `CONFIG_PROC_CHILDREN`), pinned with a pidfd, and
//! checked to be PID 1's child after the pidfd exists; a caller that opened
//! something through its pid confirms with [`Entry::still_alive`] that the
//! pid still named that process.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;

use crate::error::SyscallError;
use crate::sys;

/// A process of the sandbox to go through: PID 1, or its oldest child.
pub struct Entry {
    pub pid: i32,
    pub pidfd: OwnedFd,
}

impl Entry {
    /// Whether the process the pidfd pins is still alive, i.e. whether
    /// `/proc/<pid>/...` opened since [`entry`] was its.
    pub fn still_alive(&self) -> bool {
        // Signal 0 through our pidfd only checks existence and permission.
        sys::pidfd_send_signal(self.pidfd.as_fd(), 0).is_ok()
    }
}

/// Whether this process may look into `pid` through `/proc` (its
/// namespaces, root, memory): the ptrace access check.
fn may_inspect(pid: i32) -> bool {
    std::fs::metadata(format!("/proc/{pid}/ns/user")).is_ok()
}

/// The process of the sandbox whose PID 1 is host pid `pid1` to open or
/// join the sandbox through.
pub fn entry(pid1: i32) -> Result<Entry, SyscallError> {
    let find = format!("find the sandbox (pid {pid1})");
    let pidfd = sys::pidfd_open(pid1).map_err(|e| SyscallError::new(find.clone(), "pidfd_open", e))?;
    if may_inspect(pid1) {
        return Ok(Entry { pid: pid1, pidfd });
    }
    for child in children(pid1) {
        let Ok(pidfd) = sys::pidfd_open(child) else { continue };
        // The pidfd pins the process; if `child` is PID 1's child now, it
        // is the process the pidfd refers to (pids are not reused while the
        // process lives, and `still_alive` tells whether it still does).
        if parent_of(child) == Some(pid1) {
            return Ok(Entry { pid: child, pidfd });
        }
    }
    Err(SyscallError::new(find, format!("open(\"/proc/{pid1}/ns/user\")"), Errno::EACCES).hint(
        "the sandbox's PID 1 is not dumpable and no process of the command was found to go through \
         (it has ended); only root may look into PID 1 itself",
    ))
}

/// Children of `pid`, oldest first.
fn children(pid: i32) -> Vec<i32> {
    let parse = |text: &str| text.split_whitespace().filter_map(|c| c.parse().ok()).collect();
    match std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
        Ok(text) => parse(&text),
        // Without CONFIG_PROC_CHILDREN: every process whose parent is `pid`,
        // by start time.
        Err(_) => {
            let mut found: Vec<(u64, i32)> = std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter_map(|p| {
                    let (ppid, start) = stat_fields(p)?;
                    (ppid == pid).then_some((start, p))
                })
                .collect();
            found.sort();
            found.into_iter().map(|(_, p)| p).collect()
        }
    }
}

fn parent_of(pid: i32) -> Option<i32> {
    stat_fields(pid).map(|(ppid, _)| ppid)
}

/// `(ppid, starttime)` from `/proc/<pid>/stat` (fields 4 and 22).
fn stat_fields(pid: i32) -> Option<(i32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// An `O_PATH` descriptor of the sandbox's `/`, as its processes see it.
pub fn open_root(pid1: i32) -> Result<OwnedFd, SyscallError> {
    let entry = entry(pid1)?;
    let path = format!("/proc/{}/root", entry.pid);
    let cpath = CString::new(path.clone()).expect("no NUL in a /proc path");
    let root = crate::sys::open(&cpath, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)
        .map_err(|e| SyscallError::new("open the sandbox's root", format!("open(\"{path}\")"), e))?;
    if !entry.still_alive() {
        return Err(SyscallError::new("open the sandbox's root", format!("open(\"{path}\")"), Errno::ESRCH)
            .hint("the process went away while its root was opened"));
    }
    Ok(root)
}
