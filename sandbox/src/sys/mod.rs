//! The syscall seam: thin, allocation-free wrappers over every raw syscall
//! of the crate (docs/architecture.md, "Style").
//!
//! Every function takes C strings and raw descriptors prepared by the caller
//! and returns the kernel's `errno` on failure; the callers wrap it in a
//! `SyscallError` that names the step and the call. Nothing here allocates,
//! so the child may use any of it between `clone` and `execve`. This is the
//! only module with `unsafe` syscall invocations, which keeps the code that
//! decides *what* to do readable and the seam narrow. Where `nix` has a call
//! safe and allocation-free, the wrapper uses it.

use std::ffi::CStr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::ptr;

use libc::{c_char, c_int, c_long};
use nix::errno::Errno;

mod files;
mod hardening;
mod memory;
mod mount;
mod process;
mod signal;
mod socket;

pub use files::*;
pub use hardening::*;
pub use memory::*;
pub use mount::*;
pub use process::*;
pub use signal::*;
pub use socket::*;

pub type SysResult<T> = Result<T, Errno>;

fn check(ret: c_int) -> SysResult<c_int> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

fn check_long(ret: c_long) -> SysResult<c_long> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

fn owned(ret: c_long) -> SysResult<OwnedFd> {
    let fd = check_long(ret)? as RawFd;
    // SAFETY: the kernel just returned this descriptor to us and nothing else
    // refers to it, so we are its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn opt_ptr(s: Option<&CStr>) -> *const c_char {
    s.map_or(ptr::null(), CStr::as_ptr)
}
