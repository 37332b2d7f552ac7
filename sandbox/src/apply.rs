//! The apply phase: landing a caller's inputs in the finished sandbox tree,
//! in the caller's order, before the command starts.
//!
//! After the child has built the root and pivoted into it, it tells the
//! launcher it is ready and waits. The launcher then runs the caller's
//! callback with an [`ApplyContext`]:
//!
//! * writes go through [`ApplyContext::root`], a descriptor for the
//!   sandbox's `/` taken from `/proc/<pid>/root`; resolving paths under it
//!   with `RESOLVE_IN_ROOT` sees exactly the sandbox's mounts (including a
//!   private tmpfs home) and keeps symlinks inside;
//! * [`ApplyContext::attach`] asks the child to attach one of the spec's
//!   deferred binds, whose source trees were cloned during setup (they are
//!   unreachable once the host's root is detached).
//!
//! Wire format, launcher → child on the sync pipe: `[op: u8][index: u32 LE]`;
//! child → launcher on the ack pipe: one `READY` byte, then per command
//! `[status: u8][call: u8][errno: i32 LE]`. Each message is one atomic write.

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};

use nix::errno::Errno;

use crate::error::SyscallError;
use crate::mounts::{self, Clones};
use crate::prepare::Plan;
use crate::sys;

pub(crate) const READY: u8 = 0xA5;
const OP_ATTACH: u8 = 1;
const OP_DONE: u8 = 2;
const CALL_RESOLVE: u8 = 1;
const CALL_MOVE_MOUNT: u8 = 2;
const CALL_INDEX: u8 = 3;

/// What an apply callback may do with the sandbox before its command starts.
pub struct ApplyContext<'a> {
    pub(crate) plan: &'a Plan,
    pub(crate) root: OwnedFd,
    pub(crate) commands: RawFd,
    pub(crate) acks: RawFd,
    pub(crate) attached: Vec<bool>,
}

impl ApplyContext<'_> {
    /// The sandbox's `/`, as an `O_PATH` directory descriptor. Resolve paths
    /// under it with `openat2(..., RESOLVE_IN_ROOT)`.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Number of deferred binds in the spec.
    pub fn deferred_binds(&self) -> usize {
        self.plan.deferred.len()
    }

    /// Attaches deferred bind `index` at its destination inside the sandbox
    /// (creating the destination if needed). Each bind attaches once.
    pub fn attach(&mut self, index: usize) -> Result<(), SyscallError> {
        let Some(bind) = self.plan.deferred.get(index) else {
            return Err(SyscallError::new(
                "attach a deferred bind",
                format!("attach(#{index})"),
                Errno::EINVAL,
            )
            .hint("no deferred bind has that index"));
        };
        let step = format!("attach {}", self.plan.host_sources[bind.source].what);
        let dst = format!("\"/{}\"", bind.dst.to_string_lossy());
        if std::mem::replace(&mut self.attached[index], true) {
            return Err(SyscallError::new(step, format!("attach({dst})"), Errno::EBUSY)
                .hint("this bind was already attached"));
        }
        let mut message = [OP_ATTACH, 0, 0, 0, 0];
        message[1..].copy_from_slice(&(index as u32).to_le_bytes());
        sys::write_all(self.commands, &message)
            .map_err(|e| SyscallError::new(step.clone(), "write(sync pipe)", e))?;
        let mut ack = [0u8; 6];
        match read_exact(self.acks, &mut ack) {
            Ok(true) => {}
            Ok(false) => {
                return Err(SyscallError::new(step, "read(ack pipe)", Errno::EPIPE)
                    .hint("the sandbox exited during the apply phase"));
            }
            Err(e) => return Err(SyscallError::new(step, "read(ack pipe)", e)),
        }
        if ack[0] == 0 {
            return Ok(());
        }
        let errno = Errno::from_raw(i32::from_le_bytes([ack[2], ack[3], ack[4], ack[5]]));
        let call = match ack[1] {
            CALL_RESOLVE => format!("openat2/mkdirat({dst})"),
            CALL_MOVE_MOUNT => format!("move_mount({dst})"),
            _ => format!("attach({dst})"),
        };
        Err(SyscallError::new(step, call, errno))
    }

    /// Ends the apply phase; the child goes on to start the command.
    pub(crate) fn finish(self) -> Result<(), SyscallError> {
        sys::write_all(self.commands, &[OP_DONE, 0, 0, 0, 0])
            .map_err(|e| SyscallError::new("start the command", "write(sync pipe)", e))
    }
}

/// Waits for the child's READY byte. `Ok(false)` means the child exited
/// instead (its report says why).
pub(crate) fn wait_ready(acks: RawFd) -> Result<bool, Errno> {
    let mut byte = [0u8; 1];
    Ok(sys::read(acks, &mut byte)? == 1 && byte[0] == READY)
}

fn read_exact(fd: RawFd, buf: &mut [u8]) -> Result<bool, Errno> {
    let mut got = 0;
    while got < buf.len() {
        let n = sys::read(fd, &mut buf[got..])?;
        if n == 0 {
            return Ok(false);
        }
        got += n;
    }
    Ok(true)
}

/// Child side: announce readiness and serve attach requests until DONE.
/// Returns `false` if the launcher went away (the child should exit).
pub(crate) fn serve(plan: &Plan, mut clones: Clones, commands: RawFd, acks: RawFd) -> bool {
    if sys::write_all(acks, &[READY]).is_err() {
        return false;
    }
    let Ok(root) = sys::open(c"/", libc::O_PATH | libc::O_DIRECTORY, 0) else { return false };
    loop {
        let mut message = [0u8; 5];
        match read_exact(commands, &mut message) {
            Ok(true) => {}
            _ => return false,
        }
        match message[0] {
            OP_DONE => return true,
            OP_ATTACH => {
                let index = u32::from_le_bytes([message[1], message[2], message[3], message[4]]) as usize;
                let (call, errno) = match attach(plan, &mut clones, root.as_fd(), index) {
                    Ok(()) => (0, Errno::UnknownErrno),
                    Err(failure) => failure,
                };
                let mut ack = [u8::from(call != 0), call, 0, 0, 0, 0];
                ack[2..].copy_from_slice(&(errno as i32).to_le_bytes());
                if sys::write_all(acks, &ack).is_err() {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

fn attach(plan: &Plan, clones: &mut Clones, root: BorrowedFd<'_>, index: usize) -> Result<(), (u8, Errno)> {
    let bind = plan.deferred.get(index).ok_or((CALL_INDEX, Errno::EINVAL))?;
    let copy = clones.take(bind.source).ok_or((CALL_INDEX, Errno::EBUSY))?;
    let dst: &CStr = &bind.dst;
    let kind = plan.host_sources[bind.source].kind;
    let target = mounts::resolve(root, dst, Some(kind)).map_err(|f| (CALL_RESOLVE, f.errno))?;
    sys::move_mount_fd(copy.as_fd(), target.as_fd()).map_err(|e| (CALL_MOVE_MOUNT, e))
}

/// The launcher's descriptor for the sandbox root.
pub(crate) fn open_root(pid: libc::pid_t) -> Result<OwnedFd, SyscallError> {
    let path = format!("/proc/{pid}/root");
    let cpath = std::ffi::CString::new(path.clone()).expect("no NUL in a /proc path");
    sys::open(&cpath, libc::O_PATH | libc::O_DIRECTORY, 0)
        .map_err(|e| SyscallError::new("open the sandbox root", format!("open(\"{path}\")"), e))
}
