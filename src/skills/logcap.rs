//! An engine's stdout and stderr on disk, capped.
//!
//! The engine writes into a pipe; [`relay`] copies it to `logs/stdout.txt`
//! (or `stderr.txt`), appending, and keeps at most `max` bytes of each
//! engine process: the start up to `max` less the tail's share, then a
//! one-line marker saying how much was left out, then the end (the last
//! [`TAIL_MAX`] bytes, or half of `max` when that is smaller), which is
//! held in memory until the process closes the pipe. The end is kept
//! because that is where an engine prints its answer; the start because
//! that is where a failure usually shows first. A stream that stays
//! within `max` is written whole and unchanged.
//!
//! The relay also hands on, for a sticky interactive job, every complete
//! line that mentions `ask_user` (at most [`MAX_LINE`] bytes): the job's
//! task reads the engine's question from them while the engine keeps
//! running.

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

/// Most bytes of a stream's end held back for after the marker.
pub const TAIL_MAX: u64 = 1 << 20;
/// Longest line handed on as a possible question.
pub const MAX_LINE: usize = 1 << 20;

/// What a relay wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The file's length before the relay started (earlier turns).
    pub base: u64,
    /// Bytes the engine wrote.
    pub total: u64,
    /// Bytes kept from the start.
    pub head: u64,
    /// Length of the marker (0 when nothing was left out).
    pub marker: u64,
    /// Bytes kept from the end, after the marker.
    pub tail: u64,
}

impl Summary {
    /// Where byte `pos` of the engine's output is in the file; a byte
    /// that was left out maps to the start of the kept end.
    pub fn file_offset(&self, pos: u64) -> u64 {
        if self.marker == 0 || pos <= self.head {
            return self.base + pos.min(self.total);
        }
        let tail_start = self.total - self.tail;
        self.base + self.head + self.marker + pos.saturating_sub(tail_start).min(self.tail)
    }

    /// Bytes left out.
    pub fn dropped(&self) -> u64 {
        self.total - self.head - self.tail
    }
}

/// A complete line of the engine's output and where it ends (the byte
/// after its newline, counted in the engine's output).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub text: Vec<u8>,
    pub end: u64,
}

/// Copies `from` to `file` (opened for appending) with the cap `max`;
/// `name` goes into the marker. Complete lines mentioning `ask_user` are
/// sent to `asks` when given.
pub async fn relay<R: AsyncRead + Unpin>(
    mut from: R,
    mut file: std::fs::File,
    max: u64,
    name: &str,
    asks: Option<mpsc::Sender<Line>>,
) -> std::io::Result<Summary> {
    use std::io::Write;
    let base = file.metadata()?.len();
    let tail_max = TAIL_MAX.min(max / 2);
    let head_max = max - tail_max;
    let mut sum = Summary { base, ..Summary::default() };
    let mut tail = std::collections::VecDeque::<u8>::new();
    let mut lines = LineSplitter::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        if let Some(asks) = &asks {
            for line in lines.push(chunk, sum.total) {
                // The job's task stops listening once it is done with
                // the engine; its lines are then only logged.
                let _ = asks.send(line).await;
            }
        }
        sum.total += n as u64;
        let room = usize::try_from(head_max - sum.head).unwrap_or(usize::MAX).min(n);
        if room > 0 {
            file.write_all(&chunk[..room])?;
            sum.head += room as u64;
        }
        tail.extend(&chunk[room..]);
        let excess = tail.len().saturating_sub(tail_max as usize);
        tail.drain(..excess);
    }
    sum.tail = tail.len() as u64;
    if sum.dropped() > 0 {
        let marker = format!(
            "\n[tuixiu-sandbox: {} bytes of {name} left out here; each engine process's {name} is kept to {max} bytes (skills serve --max-log)]\n",
            sum.dropped()
        );
        file.write_all(marker.as_bytes())?;
        sum.marker = marker.len() as u64;
    }
    let (a, b) = tail.as_slices();
    file.write_all(a)?;
    file.write_all(b)?;
    Ok(sum)
}

/// Splits a stream into lines, keeping only those that mention `ask_user`.
#[derive(Default)]
struct LineSplitter {
    partial: Vec<u8>,
    /// The current line passed [`MAX_LINE`]: dropped up to its newline.
    overlong: bool,
}

impl LineSplitter {
    /// The complete lines `chunk` ends, `at` being the stream position of
    /// its first byte.
    fn push(&mut self, chunk: &[u8], at: u64) -> Vec<Line> {
        let mut out = Vec::new();
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', chunk) {
            self.take(&chunk[start..nl]);
            if !self.overlong && memchr::memmem::find(&self.partial, b"ask_user").is_some() {
                out.push(Line { text: std::mem::take(&mut self.partial), end: at + nl as u64 + 1 });
            }
            self.partial.clear();
            self.overlong = false;
            start = nl + 1;
        }
        self.take(&chunk[start..]);
        out
    }

    fn take(&mut self, bytes: &[u8]) {
        if self.overlong {
            return;
        }
        if self.partial.len() + bytes.len() > MAX_LINE {
            self.partial.clear();
            self.overlong = true;
            return;
        }
        self.partial.extend_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(data: &[u8], max: u64, asks: Option<mpsc::Sender<Line>>) -> (Summary, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, b"earlier\n").unwrap();
        let file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        let sum = relay(data, file, max, "stdout", asks).await.unwrap();
        (sum, std::fs::read(&path).unwrap())
    }

    #[tokio::test]
    async fn within_the_cap_the_log_is_whole() {
        let (sum, file) = run(b"hello\nworld\n", 100, None).await;
        assert_eq!(file, b"earlier\nhello\nworld\n");
        assert_eq!(sum, Summary { base: 8, total: 12, head: 12, marker: 0, tail: 0 });
        assert_eq!(sum.file_offset(6), 14);
    }

    #[tokio::test]
    async fn past_the_cap_the_start_and_the_end_are_kept() {
        let data: Vec<u8> = (0..1000u32).flat_map(|i| format!("{i:04}\n").into_bytes()).collect();
        let (sum, file) = run(&data, 100, None).await;
        assert_eq!((sum.head, sum.tail, sum.dropped()), (50, 50, 4900));
        let text = String::from_utf8(file).unwrap();
        assert!(text.starts_with("earlier\n0000\n0001\n"), "{text}");
        assert!(text.contains("[tuixiu-sandbox: 4900 bytes of stdout left out here;"), "{text}");
        assert!(text.ends_with("0998\n0999\n"), "{text}");
        assert_eq!(text.len() as u64, 8 + 100 + sum.marker);
        // The last line's start, in the file.
        let last = sum.file_offset(data.len() as u64 - 5);
        assert_eq!(&text[last as usize..], "0999\n");
        // A byte that was left out maps to the kept end.
        assert_eq!(sum.file_offset(500), 8 + 50 + sum.marker);
    }

    #[tokio::test]
    async fn questions_are_handed_on_by_line() {
        let (tx, mut rx) = mpsc::channel(8);
        let long = format!("{}ask_user\n", "x".repeat(MAX_LINE + 1));
        let data = format!("noise\n{{\"ask_user\": 1}}\n{long}tail ask_user no newline");
        let (_, _) = run(data.as_bytes(), 1 << 30, Some(tx)).await;
        let line = rx.recv().await.unwrap();
        assert_eq!(line.text, b"{\"ask_user\": 1}");
        assert_eq!(line.end, 6 + 16);
        assert!(rx.recv().await.is_none(), "the overlong line and the unfinished one are not handed on");
    }
}
