//! A terminal's output: the tail `terminal/output` returns, kept within
//! the run's memory budget (docs/acp.md, "terminal/*").
//!
//! ACP keeps the **tail** of the output, at most `outputByteLimit` bytes
//! of text, cut forward to a character boundary. Invalid UTF-8 becomes
//! U+FFFD, which only ever lengthens the text, so the last `limit + 3`
//! bytes of raw output always hold that tail (the 3: a character that
//! straddles the cut). That many bytes are kept, in a ring: written once,
//! never moved, never more. A terminal of the run's default limit lives in
//! memory while the run's [`Budget`] has room for its whole ring; the
//! others keep their ring in an anonymous file (`O_TMPFILE`, in the
//! daemon's state directory: nothing is left behind, whatever happens),
//! written and read on the blocking pool. The daemon's memory then holds
//! at most the budget per run, whatever limits the agent asks for; its
//! disk at most the limits' sum (`run_max_terminals` × 64 MiB).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Raw bytes kept for a limit: the limit and a straddling character.
pub fn ring_size(limit: usize) -> usize {
    if limit == 0 { 0 } else { limit.saturating_add(3) }
}

/// A run's memory for terminal output: what its terminals' rings in
/// memory may take together.
#[derive(Debug)]
pub struct Budget {
    left: AtomicUsize,
}

impl Budget {
    pub fn new(bytes: usize) -> Arc<Budget> {
        Arc::new(Budget { left: AtomicUsize::new(bytes) })
    }

    /// `bytes` of it, if it has them.
    fn take(self: &Arc<Self>, bytes: usize) -> Option<Reserved> {
        self.left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(bytes))
            .ok()
            .map(|_| Reserved { budget: self.clone(), bytes })
    }

    /// What is left.
    pub fn left(&self) -> usize {
        self.left.load(Ordering::SeqCst)
    }
}

/// Part of a [`Budget`], given back when dropped.
#[derive(Debug)]
struct Reserved {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.left.fetch_add(self.bytes, Ordering::SeqCst);
    }
}

/// Where the ring's bytes are.
#[derive(Debug)]
enum Store {
    /// Grows to the ring's size as output comes, then wraps.
    Memory { bytes: Vec<u8>, _reserved: Reserved },
    /// An anonymous file of the ring's size (sparse until written).
    File(File),
}

/// The last [`ring_size`] bytes of a terminal's output.
#[derive(Debug)]
pub struct Tail {
    store: Store,
    /// The ring's size.
    size: usize,
    limit: usize,
    /// Where the next byte goes in the ring.
    pos: usize,
    /// Bytes the ring holds (its size once it is full).
    kept: usize,
    /// Bytes pushed in all.
    total: u64,
}

/// Why a terminal's output could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("terminal output: a file in {}: {}", .dir.display(), sandbox::error::io_error_text(.source))]
    Spill { dir: std::path::PathBuf, source: std::io::Error },
    #[error("terminal output: {}", sandbox::error::io_error_text(.0))]
    Io(#[source] std::io::Error),
    #[error("terminal output: {0}")]
    Panicked(#[from] crate::blocking::Panicked),
}

impl Tail {
    /// A tail for `limit` bytes of text: in memory when `budget` has room
    /// for its whole ring, else in an anonymous file in `spill_dir`.
    pub fn new(limit: usize, budget: &Arc<Budget>, spill_dir: &Path) -> Result<Tail, OutputError> {
        let size = ring_size(limit);
        let store = match budget.take(size) {
            Some(reserved) => Store::Memory { bytes: Vec::new(), _reserved: reserved },
            None => Store::File(anonymous_file(spill_dir)?),
        };
        Ok(Tail { store, size, limit, pos: 0, kept: 0, total: 0 })
    }

    /// Whether pushing and reading touch a file (then: on the blocking pool).
    pub fn in_file(&self) -> bool {
        matches!(self.store, Store::File(_))
    }

    /// Adds output. Only the last [`ring_size`] bytes are ever written.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), OutputError> {
        let size = self.size;
        self.total += chunk.len() as u64;
        let mut chunk = &chunk[chunk.len().saturating_sub(size)..];
        while !chunk.is_empty() {
            let (at, n) = (self.pos, chunk.len().min(size - self.pos));
            match &mut self.store {
                Store::Memory { bytes, .. } => {
                    if bytes.len() < at + n {
                        bytes.resize(at + n, 0);
                    }
                    bytes[at..at + n].copy_from_slice(&chunk[..n]);
                }
                Store::File(f) => f.write_all_at(&chunk[..n], at as u64).map_err(OutputError::Io)?,
            }
            chunk = &chunk[n..];
            self.pos = (at + n) % size;
            self.kept = (self.kept + n).min(size);
        }
        Ok(())
    }

    /// The raw bytes kept, oldest first.
    fn raw(&self) -> Result<Vec<u8>, OutputError> {
        let kept = self.kept;
        // Where the oldest kept byte is.
        let start = if kept < self.size { 0 } else { self.pos };
        let mut out = vec![0u8; kept];
        let first = kept.min(self.size - start);
        match &self.store {
            Store::Memory { bytes, .. } => {
                out[..first].copy_from_slice(&bytes[start..start + first]);
                out[first..].copy_from_slice(&bytes[..kept - first]);
            }
            Store::File(f) => {
                f.read_exact_at(&mut out[..first], start as u64).map_err(OutputError::Io)?;
                f.read_exact_at(&mut out[first..], 0).map_err(OutputError::Io)?;
            }
        }
        Ok(out)
    }

    /// The output as the agent gets it: valid UTF-8 (invalid bytes become
    /// U+FFFD), at most `limit` bytes, the tail, starting on a character;
    /// and whether anything was cut.
    pub fn snapshot(&self) -> Result<(String, bool), OutputError> {
        let raw = self.raw()?;
        let dropped = self.total > raw.len() as u64;
        let text = match String::from_utf8(raw) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        if text.len() <= self.limit {
            return Ok((text, dropped));
        }
        let mut cut = text.len() - self.limit;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        Ok((text[cut..].to_string(), true))
    }
}

/// An anonymous file in `dir` (made 0700 if missing): no name, so nothing
/// to clean up after a crash.
fn anonymous_file(dir: &Path) -> Result<File, OutputError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let spill = |source| OutputError::Spill { dir: dir.to_path_buf(), source };
    match std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(spill(e)),
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir)
        .map_err(spill)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The naive answer: the whole output kept, converted, cut.
    fn reference(all: &[u8], limit: usize) -> (String, bool) {
        let text = String::from_utf8_lossy(all);
        if text.len() <= limit {
            return (text.into_owned(), false);
        }
        let mut cut = text.len() - limit;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        (text[cut..].to_string(), true)
    }

    /// Memory and file rings give exactly what keeping everything would,
    /// for any chunking, limits around character sizes, and invalid bytes.
    #[test]
    fn rings_agree_with_keeping_everything() {
        let dir = tempfile::tempdir().unwrap();
        let samples: [&[u8]; 4] =
            ["ab".as_bytes(), "cdé€".as_bytes(), b"\xff\xfe x \xe2\x82", "€€€\n\u{10348}z".as_bytes()];
        let mut seed = 7u64;
        for limit in [0usize, 1, 2, 3, 4, 5, 6, 7, 11, 64] {
            for memory in [true, false] {
                let budget = Budget::new(if memory { 1 << 20 } else { 0 });
                let mut tail = Tail::new(limit, &budget, dir.path()).unwrap();
                assert_eq!(tail.in_file(), !memory && limit > 0);
                let mut all = Vec::new();
                for round in 0..60 {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let s = samples[(seed >> 33) as usize % samples.len()];
                    let reps = 1 + (seed >> 40) as usize % 9;
                    let chunk: Vec<u8> = s.iter().copied().cycle().take(s.len() * reps).collect();
                    tail.push(&chunk).unwrap();
                    all.extend_from_slice(&chunk);
                    assert_eq!(
                        tail.snapshot().unwrap(),
                        reference(&all, limit),
                        "limit {limit}, memory {memory}, round {round}"
                    );
                }
            }
        }
    }

    /// The memory budget: rings in memory while it has room, files after,
    /// and the room given back when a terminal goes.
    #[test]
    fn the_budget_decides_memory_or_file() {
        let dir = tempfile::tempdir().unwrap();
        let budget = Budget::new(2 * ring_size(1000));
        let a = Tail::new(1000, &budget, dir.path()).unwrap();
        let b = Tail::new(1000, &budget, dir.path()).unwrap();
        let c = Tail::new(1000, &budget, dir.path()).unwrap();
        assert!(!a.in_file() && !b.in_file() && c.in_file());
        assert_eq!(budget.left(), 0);
        drop(a);
        assert_eq!(budget.left(), ring_size(1000));
        // Large output stays at the ring's size, in memory or on disk.
        let mut big = Tail::new(64 << 20, &Budget::new(0), dir.path()).unwrap();
        for _ in 0..100 {
            big.push(&[b'x'; 1 << 20]).unwrap();
        }
        let Store::File(f) = &big.store else { panic!("in memory") };
        assert_eq!(f.metadata().unwrap().len(), ring_size(64 << 20) as u64);
        let (text, cut) = big.snapshot().unwrap();
        assert_eq!((text.len(), cut), (64 << 20, true));
        // Nothing named is left in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
