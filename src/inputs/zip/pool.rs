//! Files extracted by a few workers at once, failing as one would.
//!
//! Entries are handed out in archive order from one counter. When an entry
//! fails, its position is published; no worker takes a later entry after
//! that, and one already at work on a later entry abandons it, while the
//! entries before it (all handed out already) are finished. The error
//! returned is the one of the earliest failing entry: the error the
//! one-at-a-time extraction would have returned. Every worker has ended
//! before `run` returns, so the caller may remove what was written (the
//! callers extract into a staging directory they remove on failure).
//! Memory: each worker has its own buffers and inflate state (`Scratch`),
//! so the bound is the worker count times one worker's.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use nix::errno::Errno;

use super::entry::{ArchiveAt, Failed, Scratch, write_entry};
use super::{Entry, ZipError, fsx};

/// What the workers share.
struct Shared<'a, 'z> {
    files: &'a [&'a Entry],
    into: BorrowedFd<'a>,
    dirs: &'a HashMap<String, OwnedFd>,
    next: AtomicUsize,
    /// Position (in `files`) of the earliest failure, `usize::MAX` if none.
    stop: AtomicUsize,
    first: Mutex<Option<(usize, ZipError)>>,
    bytes: AtomicU64,
    zip: &'a ::zip::ZipArchive<ArchiveAt<'z>>,
}

/// Extracts `files` (in archive order) with `workers` threads, the calling
/// one included; their parent directories exist in `dirs` (or are `into`).
/// Returns the bytes written.
pub(super) fn run(
    zip: &::zip::ZipArchive<ArchiveAt<'_>>,
    files: &[&Entry],
    into: BorrowedFd<'_>,
    dirs: &HashMap<String, OwnedFd>,
    workers: usize,
) -> Result<u64, ZipError> {
    let shared = Shared {
        files,
        into,
        dirs,
        next: AtomicUsize::new(0),
        stop: AtomicUsize::new(usize::MAX),
        first: Mutex::new(None),
        bytes: AtomicU64::new(0),
        zip,
    };
    std::thread::scope(|scope| {
        for _ in 1..workers {
            // A thread that cannot be started leaves its share to the others.
            let started =
                std::thread::Builder::new().name("zip-extract".into()).spawn_scoped(scope, || work(&shared));
            if started.is_err() {
                break;
            }
        }
        work(&shared);
    });
    match shared.first.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(shared.bytes.into_inner()),
    }
}

fn work(shared: &Shared<'_, '_>) {
    let mut zip = shared.zip.clone();
    let mut scratch = Scratch::new();
    loop {
        let position = shared.next.fetch_add(1, Ordering::Relaxed);
        if position >= shared.files.len() || position > shared.stop.load(Ordering::Acquire) {
            return;
        }
        let entry = shared.files[position];
        match one(shared, &mut zip, entry, position, &mut scratch) {
            Ok(bytes) => {
                shared.bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            Err(Failed::Stopped) => {}
            Err(Failed::Error(e)) => {
                let mut first = shared.first.lock().unwrap_or_else(|p| p.into_inner());
                if first.as_ref().is_none_or(|(at, _)| position < *at) {
                    *first = Some((position, e));
                    shared.stop.fetch_min(position, Ordering::Release);
                }
            }
        }
    }
}

fn one(
    shared: &Shared<'_, '_>,
    zip: &mut ::zip::ZipArchive<ArchiveAt<'_>>,
    entry: &Entry,
    position: usize,
    scratch: &mut Scratch,
) -> Result<u64, Failed> {
    let (parent, name) = match entry.path.rsplit_once('/') {
        Some((parent, name)) => (shared.dirs[parent].as_fd(), name),
        None => (shared.into, entry.path.as_str()),
    };
    let name = CString::new(name).expect("names were checked for NUL");
    let mode = if entry.executable { 0o755 } else { 0o644 };
    let mut file: File = fsx::create_file(parent, &name, mode).map_err(|e| match e.errno {
        Errno::EEXIST | Errno::ENOTDIR | Errno::EISDIR => {
            ZipError::Unsafe(format!("zip entry conflicts with another entry: {}", entry.shown))
        }
        _ => ZipError::Fs(fsx::FsError { path: entry.path.clone(), ..e }),
    })?;
    write_entry(zip, entry, position, &mut file, scratch, &shared.stop)
}
