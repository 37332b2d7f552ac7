//! How the sandbox child tells the launcher what went wrong.
//!
//! The child renders one line into a fixed buffer on its stack (no heap
//! allocation after clone) and writes it as a single record on the report
//! pipe: `[exit code: u8][length: u16 LE][message]`. One `write` of at most
//! `PIPE_BUF` bytes is atomic, so the launcher reads either a whole record or
//! none. The pipe is close-on-exec, so end-of-file without a record means the
//! command was executed.

use std::fmt;
use std::os::fd::RawFd;

use crate::sys;

const MAX_MESSAGE: usize = 1024;
const HEADER: usize = 3;
/// The code of a notice: a record the launcher logs as a warning before
/// the failure record, if any (failures carry 125, 126 or 127).
pub(crate) const NOTICE: u8 = 0;

/// A message under construction in a fixed-size buffer.
pub(crate) struct Report {
    buf: [u8; HEADER + MAX_MESSAGE],
    len: usize,
}

impl Report {
    pub(crate) fn new() -> Self {
        Report { buf: [0; HEADER + MAX_MESSAGE], len: 0 }
    }

    /// Appends raw bytes (paths may not be UTF-8), truncating at the limit.
    pub(crate) fn push_bytes(&mut self, bytes: &[u8]) {
        let room = MAX_MESSAGE - self.len;
        let n = bytes.len().min(room);
        self.buf[HEADER + self.len..HEADER + self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    /// The message so far.
    pub(crate) fn text(&self) -> &[u8] {
        &self.buf[HEADER..HEADER + self.len]
    }

    /// Sends the record with `code` on `fd`. Errors are ignored: the only
    /// reader is the launcher, and if it is gone there is nobody to tell.
    pub(crate) fn send(&mut self, fd: RawFd, code: u8) {
        self.buf[0] = code;
        self.buf[1..3].copy_from_slice(&(self.len as u16).to_le_bytes());
        let _ = sys::write_all(fd, &self.buf[..HEADER + self.len]);
    }
}

impl fmt::Write for Report {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_bytes(s.as_bytes());
        Ok(())
    }
}

/// Removes the complete notice records at the front of `bytes` (what the
/// launcher has read so far) and logs each one as a warning.
pub(crate) fn take_notices(bytes: &mut Vec<u8>) {
    while bytes.len() >= HEADER && bytes[0] == NOTICE {
        let end = HEADER + u16::from_le_bytes([bytes[1], bytes[2]]) as usize;
        if bytes.len() < end {
            return;
        }
        tracing::warn!("{}", String::from_utf8_lossy(&bytes[HEADER..end]));
        bytes.drain(..end);
    }
}

/// Parses what the launcher read from the report pipe: `None` for an empty
/// read (the command was executed), else the code and the message.
pub(crate) fn parse(bytes: &[u8]) -> Option<(u8, String)> {
    if bytes.is_empty() {
        return None;
    }
    if bytes.len() < HEADER {
        return Some((crate::error::EXIT_SETUP_FAILED, "sandbox child sent a truncated report".into()));
    }
    let len = u16::from_le_bytes([bytes[1], bytes[2]]) as usize;
    let message = &bytes[HEADER..bytes.len().min(HEADER + len)];
    Some((bytes[0], String::from_utf8_lossy(message).into_owned()))
}

/// Displays bytes as text without allocating: invalid UTF-8 becomes U+FFFD.
pub(crate) struct Lossy<'a>(pub &'a [u8]);

impl fmt::Display for Lossy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            f.write_str(chunk.valid())?;
            if !chunk.invalid().is_empty() {
                f.write_str("\u{FFFD}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write;

    #[test]
    fn record_round_trips() {
        let (r, w) = sys::pipe().unwrap();
        let mut rep = Report::new();
        write!(rep, "mount(\"{}\") => EPERM", Lossy(b"/x\xff")).unwrap();
        use std::os::fd::AsRawFd;
        rep.send(w.as_raw_fd(), 125);
        drop(w);
        let mut buf = [0u8; 2048];
        let n = sys::read(r.as_raw_fd(), &mut buf).unwrap();
        let (code, msg) = parse(&buf[..n]).unwrap();
        assert_eq!(code, 125);
        assert_eq!(msg, "mount(\"/x\u{FFFD}\") => EPERM");
    }

    #[test]
    fn long_messages_are_truncated_not_overflowed() {
        let mut rep = Report::new();
        for _ in 0..100 {
            rep.push_bytes(&[b'a'; 100]);
        }
        assert_eq!(rep.len, MAX_MESSAGE);
    }

    #[test]
    fn notices_are_taken_before_the_failure() {
        let mut bytes = Vec::new();
        for (code, text) in [(NOTICE, "a notice"), (125, "the failure")] {
            bytes.push(code);
            bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
            bytes.extend_from_slice(text.as_bytes());
        }
        let whole = bytes.clone();
        // A partial notice stays until the rest is read.
        let mut partial = whole[..5].to_vec();
        take_notices(&mut partial);
        assert_eq!(partial, whole[..5]);
        take_notices(&mut bytes);
        assert_eq!(parse(&bytes), Some((125, "the failure".into())));
    }

    #[test]
    fn empty_read_means_exec_happened() {
        assert!(parse(&[]).is_none());
    }
}
