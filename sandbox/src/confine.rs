//! Keeping the sandbox's PID 1 out of the command's reach.
//!
//! PID 1 is a fork of the launcher: it runs as the command's user, and its
//! memory is a copy of the launcher's, which holds the caller's arguments
//! and whole environment (API keys, tokens). Landlock, when enforced, keeps
//! the command from ptrace-like access to processes outside its domain,
//! but it may be off or unavailable. So, whatever Landlock does:
//!
//! * before the command exists, PID 1 makes itself non-dumpable
//!   ([`make_undumpable`]). Every ptrace-mode access check (`/proc/1/mem`,
//!   `environ`, `maps`, `syscall`, `fd`, `root`, `ns`; `ptrace`,
//!   `process_vm_readv/writev`, `pidfd_getfd`, `setns` through a pidfd)
//!   then also needs `CAP_SYS_PTRACE` in the user namespace PID 1's memory
//!   belongs to, the launcher's, which the command never has. A root or
//!   nested-root owner has it; an unprivileged owner does not, and reaches
//!   the sandbox through the command's process instead ([`crate::reach`]).
//!   The launcher's apply phase opened the sandbox's root before this.
//! * once the command has executed (PID 2 no longer shares this memory),
//!   PID 1 wipes what it no longer needs ([`forget`]): the argument and
//!   environment block it inherited (where `/proc/self/stat` says it is),
//!   the command's prepared environment, PID 2's stack (unmapped), and the
//!   allocator's free pages (glibc's `malloc_trim`);
//! * then the reaper installs its own seccomp filter
//!   ([`crate::seccomp::reaper`]), an allowlist of what its loop calls.
//!
//! The nested-sandbox portal's server is a copy of the launcher too, and
//! so is every process it forks, down to a nested sandbox's PID 1 (never
//! dumpable) and the helper that makes its user namespace (dumpable, under
//! its own allowlist filter: child.rs): the server wipes the caller's
//! environment from its copy first ([`forget_inherited`]).

use std::ffi::c_char;
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use zeroize::Zeroize;

use crate::sys;

/// The name `/proc/1/cmdline` shows once the arguments are wiped.
const INIT_NAME: &[u8] = b"tuixiu-sandbox-init";

/// `PR_SET_DUMPABLE 0`: from here on only a holder of `CAP_SYS_PTRACE` over
/// the launcher's user namespace may look into this process. Set after the
/// last credential change (which would reset it) and inherited by PID 2
/// until its `execve` (this flag belongs to the memory).
pub(crate) fn make_undumpable() -> Result<(), Errno> {
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map(drop)
}

/// PID 1, once PID 2 has executed: forget what only setup needed.
/// Allocates nothing; best effort, as nothing can read this memory any more
/// (the process is not dumpable): this is depth, not the barrier.
/// `env` and `stack` are the command's environment block and the stack
/// PID 2 started on.
pub(crate) fn forget(env: &EnvBlock, stack: &sys::ChildStack) {
    forget_inherited(Some(INIT_NAME));
    // SAFETY: PID 2 has executed; nothing reads its environment block in
    // this process any more.
    unsafe { env.wipe() };
    // SAFETY: nothing runs on or reads PID 2's stack any more, and PID 1
    // never drops its plan, so the stack is never dropped after this.
    unsafe { stack.release() };
    trim_heap();
}

/// Wipes the environment block this process inherited from the caller
/// (every copy of the launcher has it) and, given a `name` for
/// `/proc/PID/cmdline`, the arguments too. Nothing may read the process's
/// environment (or arguments) afterwards: `std::env::var` finds nothing.
pub(crate) fn forget_inherited(name: Option<&[u8]>) {
    match inherited_block() {
        Some(block) => wipe_inherited(block, name),
        None => wipe_environ(),
    }
}

/// Returns the allocator's free pages (best effort).
pub(crate) fn trim_heap() {
    sys::malloc_trim();
}

/// `(arg_start, arg_end, env_start, env_end)` from `/proc/self/stat`: the
/// strings the kernel put on the initial stack.
fn inherited_block() -> Option<[usize; 4]> {
    let fd = sys::open(c"/proc/self/stat", libc::O_RDONLY | libc::O_CLOEXEC, 0).ok()?;
    let mut buf = [0u8; 2048];
    let mut len = 0;
    while len < buf.len() {
        match sys::read(fd.as_raw_fd(), &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
    parse_stat(&buf[..len])
}

/// Fields 48-51 of a `/proc/PID/stat` line; the command name (field 2) may
/// hold spaces and parentheses, so counting starts after its last `)`.
fn parse_stat(stat: &[u8]) -> Option<[usize; 4]> {
    let after = stat.iter().rposition(|&b| b == b')')? + 1;
    // Field 3 (state) is the first after the name.
    let mut fields = stat[after..].split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty()).skip(48 - 3);
    let mut out = [0usize; 4];
    for slot in &mut out {
        *slot = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    }
    let [arg_start, arg_end, env_start, env_end] = out;
    (arg_start < arg_end && arg_end <= env_start && env_start <= env_end).then_some(out)
}

fn wipe_inherited([arg_start, arg_end, env_start, env_end]: [usize; 4], name: Option<&[u8]>) {
    if let Some(name) = name {
        // SAFETY: the kernel's bounds of the argument strings it copied
        // onto this process's initial stack (writable memory that stays
        // mapped). Nothing in the caller reads them again, and no Rust
        // reference to these bytes is alive here.
        let args = unsafe { std::slice::from_raw_parts_mut(arg_start as *mut u8, arg_end - arg_start) };
        args.zeroize();
        // A name for `ps`; the last byte stays NUL, so the kernel shows
        // exactly this area as the command line.
        let n = name.len().min(args.len() - 1);
        args[..n].copy_from_slice(&name[..n]);
    }
    // SAFETY: as above, for the environment strings.
    unsafe { std::slice::from_raw_parts_mut(env_start as *mut u8, env_end - env_start) }.zeroize();
}

unsafe extern "C" {
    static environ: *const *const c_char;
}

/// Without `/proc`: the strings `environ` points to.
fn wipe_environ() {
    // SAFETY: reads the C library's `environ` pointer; nothing changes the
    // environment meanwhile (the callers are single-threaded).
    let mut entry = unsafe { environ };
    while !entry.is_null() {
        // SAFETY: `entry` points into `environ`'s NULL-terminated array
        // (libc's contract), at or before its NULL.
        let s = unsafe { *entry } as *mut u8;
        if s.is_null() {
            break;
        }
        // SAFETY: each entry is a NUL-terminated string.
        let len = unsafe { std::ffi::CStr::from_ptr(s as *const c_char) }.count_bytes();
        // SAFETY: the string's `len` bytes, writable (the initial stack's
        // or the allocator's); nothing in this process reads the
        // environment again, and no reference to them is alive.
        unsafe { std::slice::from_raw_parts_mut(s, len) }.zeroize();
        // SAFETY: `entry` is not the array's NULL, so the next one is in it.
        entry = unsafe { entry.add(1) };
    }
}

/// The command's `KEY=VALUE` strings in one allocation reached only through
/// raw pointers (the `envp` array and this), so that PID 1 may wipe it once
/// the command has executed without writing through a shared reference.
pub(crate) struct EnvBlock {
    ptr: *mut u8,
    len: usize,
}

impl EnvBlock {
    /// Copies `strings` (each without its NUL) into one block; returns it and
    /// a pointer to each copy, NUL-terminated.
    pub(crate) fn new(strings: &[Vec<u8>]) -> (EnvBlock, Vec<*const c_char>) {
        let mut bytes = Vec::with_capacity(strings.iter().map(|s| s.len() + 1).sum());
        let mut offsets = Vec::with_capacity(strings.len());
        for s in strings {
            offsets.push(bytes.len());
            bytes.extend_from_slice(s);
            bytes.push(0);
        }
        let len = bytes.len();
        let ptr = Box::into_raw(bytes.into_boxed_slice()) as *mut u8;
        // SAFETY: every offset lies inside the `len` bytes just allocated.
        let ptrs = offsets.iter().map(|&o| unsafe { ptr.add(o) } as *const c_char).collect();
        (EnvBlock { ptr, len }, ptrs)
    }

    /// Zeroes the whole block.
    ///
    /// # Safety
    /// Nothing may read the block afterwards (PID 2 has executed).
    pub(crate) unsafe fn wipe(&self) {
        // SAFETY: our own allocation of `len` bytes, reached only through
        // raw pointers; the caller guarantees nobody reads it any more.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len).zeroize() }
    }
}

impl Drop for EnvBlock {
    fn drop(&mut self) {
        // SAFETY: dropped, the block is read by nobody any more.
        unsafe { self.wipe() };
        // SAFETY: `ptr`/`len` come from `Box::into_raw` of a boxed slice of
        // exactly this length, freed once, here.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_spaces_and_parentheses() {
        let mut line = b"42 (a b) c)) S".to_vec();
        for n in 4..=52 {
            line.extend_from_slice(format!(" {}", n * 10).as_bytes());
        }
        line.push(b'\n');
        assert_eq!(parse_stat(&line), Some([480, 490, 500, 510]));
        assert_eq!(parse_stat(b"42 (x) S 1 2"), None);
    }

    #[test]
    fn env_block_holds_each_string_nul_terminated_and_wipes() {
        let (block, ptrs) = EnvBlock::new(&[b"A=1".to_vec(), b"LONGER=value".to_vec()]);
        // SAFETY: pointers into the live block, each NUL-terminated.
        let read = |p: *const c_char| unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes().to_vec();
        assert_eq!(read(ptrs[0]), b"A=1");
        assert_eq!(read(ptrs[1]), b"LONGER=value");
        // SAFETY: nothing reads the block but the check below.
        unsafe { block.wipe() };
        assert_eq!(read(ptrs[1]), b"");
    }
}
