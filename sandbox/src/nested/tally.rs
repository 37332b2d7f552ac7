//! How a sandbox's nested requests ended, counted in memory shared between
//! the portal's workers and whoever started the sandbox (the daemon reads
//! it for its metrics).
//!
//! The daemon makes one sealed in-memory file and hands it to every
//! launcher it starts (`__exec --nested-counts-fd`); a launcher maps it
//! before it forks its portal's server, so every worker of every sandbox
//! adds to the same counters, and the daemon reads them when it is
//! scraped. The file is never open inside a sandbox, and the workers that
//! hold the mapping are not dumpable: the agent cannot reach it. A worker
//! is our code, so the counts are as right as the portal; nothing decides
//! anything on them.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::SyscallError;
use crate::sys;

/// How one nested request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The nested sandbox started (its COMMAND's status was relayed).
    Started = 0,
    /// Refused before anything started: a malformed or refused request,
    /// a source outside the sandbox's view, a limit reached.
    Refused = 1,
    /// Accepted, but building the nested sandbox failed (a mount, an exec).
    Failed = 2,
}

const SLOTS: usize = 3;
/// One page: the mapping's whole length.
const LEN: usize = 4096;
const STEP: &str = "nested sandboxes' counters";

/// The counters, as read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NestedCounts {
    pub started: u64,
    pub refused: u64,
    pub failed: u64,
}

/// The shared counters, mapped.
pub struct Tally {
    base: NonNull<libc::c_void>,
}

// SAFETY: the mapping is only ever touched through atomics, from any thread.
unsafe impl Send for Tally {}
// SAFETY: as above.
unsafe impl Sync for Tally {}

impl Tally {
    /// New counters, at zero, and the file to hand to launchers.
    pub fn create() -> Result<(Tally, OwnedFd), SyscallError> {
        let fd = sys::memfd_sealable(c"tuixiu-nested-counts")
            .map_err(|e| SyscallError::new(STEP, "memfd_create", e))?;
        sys::ftruncate(fd.as_fd(), LEN as u64).map_err(|e| SyscallError::new(STEP, "ftruncate", e))?;
        // Never shorter than the mapping (a read past a shrunk file is
        // SIGBUS), in every process that maps it.
        sys::add_seals(fd.as_fd(), libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL)
            .map_err(|e| SyscallError::new(STEP, "fcntl(F_ADD_SEALS)", e))?;
        Ok((Tally::map(fd.as_fd())?, fd))
    }

    /// Maps counters made by [`Tally::create`]: anything else (a file that
    /// could shrink under the mapping, one too short) is refused.
    pub fn map(fd: BorrowedFd<'_>) -> Result<Tally, SyscallError> {
        let seals = sys::get_seals(fd).map_err(|e| SyscallError::new(STEP, "fcntl(F_GET_SEALS)", e))?;
        let size = nix::sys::stat::fstat(fd).map_err(|e| SyscallError::new(STEP, "fstat", e))?.st_size;
        if seals & libc::F_SEAL_SHRINK == 0 || size < LEN as libc::off_t {
            return Err(SyscallError::new(STEP, "fcntl(F_GET_SEALS)", nix::errno::Errno::EINVAL)
                .hint("not the daemon's sealed counters file"));
        }
        let base = sys::mmap_shared(fd, LEN).map_err(|e| SyscallError::new(STEP, "mmap", e))?;
        Ok(Tally { base })
    }

    fn slots(&self) -> &[AtomicU64; SLOTS] {
        // SAFETY: `base` is a live, page-aligned shared mapping of LEN
        // bytes (until drop), at least SLOTS u64s; every process that maps
        // it uses it only through atomics.
        unsafe { &*self.base.as_ptr().cast::<[AtomicU64; SLOTS]>() }
    }

    pub fn add(&self, outcome: Outcome) {
        self.slots()[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn counts(&self) -> NestedCounts {
        let [started, refused, failed] = self.slots().each_ref().map(|c| c.load(Ordering::Relaxed));
        NestedCounts { started, refused, failed }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        // SAFETY: our own mapping; `slots` borrows end with `self`.
        let _ = unsafe { sys::munmap(self.base, LEN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mapping_sees_the_same_counts() {
        let (tally, fd) = Tally::create().unwrap();
        let other = Tally::map(fd.as_fd()).unwrap();
        tally.add(Outcome::Started);
        other.add(Outcome::Refused);
        other.add(Outcome::Refused);
        tally.add(Outcome::Failed);
        let want = NestedCounts { started: 1, refused: 2, failed: 1 };
        assert_eq!(tally.counts(), want);
        assert_eq!(other.counts(), want);
    }

    #[test]
    fn a_file_that_could_shrink_is_refused() {
        let file = tempfile_memfd();
        let err = Tally::map(file.as_fd()).err().expect("refused");
        assert!(err.to_string().contains("EINVAL"), "{err}");
        let plain = std::fs::File::open("/proc/self/status").unwrap();
        assert!(Tally::map(plain.as_fd()).is_err());
    }

    fn tempfile_memfd() -> OwnedFd {
        let fd = sys::memfd_sealable(c"test").unwrap();
        sys::ftruncate(fd.as_fd(), LEN as u64).unwrap();
        fd
    }
}
