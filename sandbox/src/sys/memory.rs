//! Shared memory: an in-memory file sized and sealed, mapped shared.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use super::{SysResult, check, check_long, owned};

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)`.
pub fn memfd_sealable(name: &CStr) -> SysResult<OwnedFd> {
    // SAFETY: a C string and plain flags.
    owned(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) }
        as libc::c_long)
}

pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> SysResult<()> {
    // SAFETY: a valid descriptor and a length.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) }).map(drop)
}

/// `fcntl(fd, F_ADD_SEALS, seals)`.
pub fn add_seals(fd: BorrowedFd<'_>, seals: libc::c_int) -> SysResult<()> {
    // SAFETY: a valid descriptor and plain flags.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }).map(drop)
}

/// `fcntl(fd, F_GET_SEALS)`.
pub fn get_seals(fd: BorrowedFd<'_>) -> SysResult<libc::c_int> {
    // SAFETY: a valid descriptor.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)`.
pub fn mmap_shared(fd: BorrowedFd<'_>, len: usize) -> SysResult<NonNull<libc::c_void>> {
    // SAFETY: the kernel picks the address; nothing of ours is replaced.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(nix::errno::Errno::last());
    }
    NonNull::new(addr).ok_or(nix::errno::Errno::EINVAL)
}

/// `munmap(addr, len)`.
///
/// # Safety
/// `addr..addr+len` is a mapping of the caller's that nothing uses any more.
pub unsafe fn munmap(addr: NonNull<libc::c_void>, len: usize) -> SysResult<()> {
    // SAFETY: the caller's promise above.
    check_long(unsafe { libc::munmap(addr.as_ptr(), len) } as libc::c_long).map(drop)
}
