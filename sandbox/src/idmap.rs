//! The system view as an unprivileged host user sees it, for sandboxes
//! whose user maps onto host root.
//!
//! Host root owns nearly everything in `/usr` and `/etc`. When the sandbox
//! user maps onto host root (the default for a root caller), every such
//! file is *its own* file inside, so `/etc/shadow` (0640 root:shadow) is
//! readable. An idmapped mount fixes this at the source, for every file at
//! once and with no scan: the system binds are cloned in the launcher with
//! `MOUNT_ATTR_IDMAP` and a user namespace that maps on-disk uid/gid 0 to
//! host `nobody` (65534) and nothing else. Inside, root's files then belong
//! to an id the sandbox user is not, so only their "other" permission bits
//! apply, exactly as for an unprivileged host user; files of other host
//! users were never readable beyond their "other" bits either.
//!
//! Creating an idmapped mount of a host filesystem needs `CAP_SYS_ADMIN` in
//! the initial user namespace, which is exactly the case that needs it
//! (a root caller). Where it is not possible (a filesystem without idmap
//! support), the caller falls back to masking what a scan of `/etc` finds
//! ([`crate::secrets`]).

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;

use crate::sys;

/// Test-only, debug builds only: pretend idmapped mounts are impossible,
/// so the tests can check the masking fallback on a host where they work
/// (`test_only.rs`).
pub const TEST_NO_IDMAP_ENV: &str = crate::test_only::NO_IDMAP;

/// The host id root's files are shown as.
const NOBODY: u32 = 65534;

/// Whether `id` (in the launcher's user namespace) is id 0 of the initial
/// user namespace, according to `map` (the contents of `/proc/self/uid_map`).
fn is_host_root(id: u32, map: &str) -> bool {
    map.lines().any(|line| {
        let f: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        matches!(f.as_slice(), [inside, outside, count]
            if u64::from(id) >= *inside && u64::from(id) < inside + count && outside + (u64::from(id) - inside) == 0)
    })
}

/// Whether `uid` and `gid` (in the launcher's user namespace) are host
/// root's, from `/proc/self/{uid,gid}_map` (which also answers for nested
/// user namespaces).
pub fn host_root(uid: u32, gid: u32) -> (bool, bool) {
    let read = |f| std::fs::read_to_string(f).unwrap_or_default();
    (is_host_root(uid, &read("/proc/self/uid_map")), is_host_root(gid, &read("/proc/self/gid_map")))
}

/// Stack of the helper whose user namespace we take. It shares our memory
/// (`CLONE_VM`: no page tables to copy) and never needs to run: the
/// namespace exists once `clone` returns, and we kill the helper as soon as
/// we hold the namespace's descriptor. If it does run, it only blocks.
static HELPER_STACK: std::sync::Mutex<[u8; 4096]> = std::sync::Mutex::new([0; 4096]);

extern "C" fn helper(launcher: *mut libc::c_void) -> libc::c_int {
    use crate::sys::shared_task;
    // Die with the launcher: killed between this clone and its kill, it
    // would otherwise be orphaned, blocked for good. After setting the
    // signal, check the parent is still the launcher (it may have died
    // before). Only `shared_task` calls: nothing touches the errno this
    // shares with the launcher's thread.
    shared_task::die_with_parent();
    if shared_task::parent_pid() != launcher as usize as libc::c_long {
        // SAFETY: this is the task `nobody_userns` started; it leaves
        // nothing behind that the launcher uses.
        unsafe { shared_task::exit(0) }
    }
    // Only SIGKILL is ever sent.
    shared_task::block_forever()
}

/// The helper process behind [`nobody_userns`]: killed at once, reaped on
/// drop. The launcher drops it once the sandbox's child is released, while
/// the child builds its root (the helper has long been killed by then, and
/// the launcher has nothing else to do), so it is neither a zombie for the
/// sandbox's whole life nor a wait on the way to the command.
pub(crate) struct Helper {
    pid: libc::pid_t,
    _stack: std::sync::MutexGuard<'static, [u8; 4096]>,
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = sys::kill(self.pid, libc::SIGKILL);
        let _ = sys::waitpid(self.pid, 0);
    }
}

/// A user namespace mapping 0 → 65534 (uid and gid), held by its fd.
pub(crate) fn nobody_userns() -> Result<(OwnedFd, Helper), (&'static str, Errno)> {
    let mut stack = HELPER_STACK.lock().unwrap_or_else(|e| e.into_inner());
    let launcher = nix::unistd::getpid().as_raw() as usize as *mut libc::c_void;
    // SAFETY: the helper runs `helper` on its own stack (the static buffer,
    // locked until the helper is reaped) in our address space; it touches
    // nothing else and calls only `shared_task` functions.
    let pid = unsafe { sys::spawn_shared(&mut stack[..], libc::CLONE_NEWUSER, helper, launcher) }
        .map_err(|e| ("clone(CLONE_NEWUSER|CLONE_VM)", e))?;
    let helper = Helper { pid, _stack: stack };
    let line = format!("0 {NOBODY} 1");
    for (file, what) in [("uid_map", "write uid_map"), ("gid_map", "write gid_map")] {
        std::fs::write(format!("/proc/{pid}/{file}"), &line)
            .map_err(|e| (what, Errno::from_raw(e.raw_os_error().unwrap_or(0))))?;
    }
    let path = std::ffi::CString::new(format!("/proc/{pid}/ns/user")).expect("no NUL");
    let ns = sys::open(&path, libc::O_RDONLY, 0).map_err(|e| ("open(/proc/PID/ns/user)", e))?;
    // The namespace lives on through `ns`; the helper can go (reaped later).
    let _ = sys::kill(pid, libc::SIGKILL);
    Ok((ns, helper))
}

/// A detached, read-only, nosuid, nodev, idmapped copy of the host tree at
/// `path` (absolute), ready to be attached in the sandbox.
pub(crate) fn clone_idmapped(path: &CStr, userns: &OwnedFd) -> Result<OwnedFd, (&'static str, Errno)> {
    // The path is canonical: a symlink in its place now means a swap.
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | (libc::AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW) as u32;
    let cwd = sys::open(c"/", libc::O_PATH | libc::O_DIRECTORY, 0).map_err(|e| ("open", e))?;
    let tree = sys::open_tree(cwd.as_fd(), path, flags).map_err(|e| ("open_tree", e))?;
    let attrs = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    sys::mount_setattr_idmap(tree.as_fd(), attrs, userns.as_raw_fd())
        .map_err(|e| ("mount_setattr(MOUNT_ATTR_IDMAP)", e))?;
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_root_detection() {
        let init = "         0          0 4294967295\n";
        assert!(is_host_root(0, init));
        assert!(!is_host_root(1000, init));
        let nested = "         0      65534          1\n";
        assert!(!is_host_root(0, nested));
        let shifted = "0 100000 65536\n";
        assert!(!is_host_root(0, shifted));
        assert!(is_host_root(5, "5 0 1\n"));
    }
}
