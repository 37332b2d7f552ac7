//! How much of what the link wrote the backend has not read yet, and the
//! window that keeps it small.
//!
//! A control's answer is queued ahead of the bulk in the outbox, but once
//! bulk updates are written they sit in the kernel's socket buffers (the
//! backend's receive buffer grows to several MiB), and the answer reaches
//! the backend only after all of them. So the link keeps at most
//! [`WINDOW`] bytes unread by the backend: the rest of the bulk waits in
//! the outbox, where an answer can still overtake it.
//!
//! "Read" is learnt from the WebSocket itself, with no change to the
//! protocol: after a batch the link sends a ping carrying a sequence
//! number (when none is unanswered, or 32 KiB were written since the
//! last), and a WebSocket peer answers a ping with a pong of the same
//! payload when it reads the ping, which is after every frame before it.
//! A backend that never answers pings (none we know of; every WebSocket
//! library answers them) is found out after [`PROBE`] with the window
//! closed and nothing answered, and the window is then off for the rest
//! of the connection: the link sends as before, never stalls.
//! docs/proxy.md, "The link", says what operators see.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Bytes the backend may have left to read before bulk messages wait.
/// At the ~250 MB/s a backend reads updates here, 256 KiB is ~1 ms.
pub const WINDOW: u64 = 256 * 1024;
/// A batch goes out only with at least this much room (so a backend
/// that reads one frame at a time does not get one frame per write).
const MIN_ROOM: u64 = 64 * 1024;
/// While a ping is unanswered, the next goes out only after this many more
/// bytes (pings are not free for either side). Less than `WINDOW -
/// MIN_ROOM`, so a closed window always has a ping outstanding to reopen
/// it: bytes written since the last ping are fewer than this.
const PING_EVERY: u64 = 32 * 1024;
/// How long a closed window waits for the first pong of a connection
/// before the backend is taken to ignore pings.
pub const PROBE: Duration = Duration::from_secs(2);

/// Whether the backend answers window pings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answers {
    /// No pong yet on this connection.
    Unknown,
    Yes,
    /// The window is off ([`PROBE`] passed without a pong).
    No,
}

/// One connection's count (a new connection starts a new one).
#[derive(Debug)]
pub struct Unread {
    /// Bytes of frames written.
    sent: u64,
    /// `sent` when the backend read the last answered ping.
    read: u64,
    /// Unanswered pings: (id, `sent` when it went out, when).
    pings: VecDeque<(u64, u64, Instant)>,
    next_id: u64,
    answers: Answers,
}

impl Default for Unread {
    fn default() -> Self {
        Unread { sent: 0, read: 0, pings: VecDeque::new(), next_id: 1, answers: Answers::Unknown }
    }
}

impl Unread {
    /// Counts a frame of `len` bytes written.
    pub fn wrote(&mut self, len: usize) {
        self.sent += len as u64;
    }

    /// The payload of the ping to send after what was just written, if
    /// one is due (none when nothing new was written since the last one).
    pub fn ping(&mut self, now: Instant) -> Option<[u8; 8]> {
        if self.answers == Answers::No {
            return None;
        }
        let since = self.pings.back().map_or(self.read, |&(_, at, _)| at);
        if self.sent == since || (!self.pings.is_empty() && self.sent - since < PING_EVERY) {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.pings.push_back((id, self.sent, now));
        Some(id.to_be_bytes())
    }

    /// A pong arrived. Pongs that answer no window ping (the heartbeat's
    /// empty one) change nothing.
    pub fn pong(&mut self, payload: &[u8]) {
        let Ok(id) = <[u8; 8]>::try_from(payload).map(u64::from_be_bytes) else { return };
        if !self.pings.iter().any(|&(p, _, _)| p == id) {
            return;
        }
        while let Some(&(p, at, _)) = self.pings.front() {
            self.pings.pop_front();
            self.read = at;
            if p == id {
                break;
            }
        }
        if self.answers == Answers::Unknown {
            self.answers = Answers::Yes;
        }
    }

    /// Bytes the bulk may add now: `None` while it must wait. Urgent
    /// messages never wait for the window.
    pub fn room(&mut self, now: Instant) -> Option<u64> {
        if self.answers == Answers::No {
            return Some(u64::MAX);
        }
        let unread = self.sent - self.read;
        let room = WINDOW.saturating_sub(unread);
        if room >= MIN_ROOM || unread == 0 {
            return Some(room.max(1));
        }
        if self.answers == Answers::Unknown && self.probe_deadline().is_some_and(|at| now >= at) {
            tracing::warn!(
                "link: the backend answers no WebSocket ping; sending without its read window on this connection"
            );
            self.answers = Answers::No;
            self.pings.clear();
            return Some(u64::MAX);
        }
        None
    }

    /// While the window is closed and no pong was ever seen: when to give
    /// up waiting for one ([`Unread::room`] decides then).
    pub fn probe_deadline(&self) -> Option<Instant> {
        match self.answers {
            Answers::Unknown => self.pings.front().map(|&(_, _, at)| at + PROBE),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Unread {
        /// Bytes written and not yet known to be read.
        fn unread(&self) -> u64 {
            self.sent - self.read
        }
    }

    #[test]
    fn the_window_closes_when_the_backend_has_not_read_and_opens_on_its_pong() {
        let now = Instant::now();
        let mut u = Unread::default();
        assert_eq!(u.room(now), Some(WINDOW));
        u.wrote(100 * 1024);
        let first = u.ping(now).expect("a ping after new bytes");
        assert_eq!(u.ping(now), None, "nothing new written since");
        u.wrote(100 * 1024);
        let second = u.ping(now).expect("a second ping");
        // 200 KiB unread: 56 KiB left, under the least batch's room.
        assert_eq!(u.room(now), None);
        u.pong(&first);
        assert_eq!(u.unread(), 100 * 1024);
        assert_eq!(u.room(now), Some(WINDOW - 100 * 1024));
        u.pong(&second);
        assert_eq!(u.unread(), 0);
    }

    #[test]
    fn a_later_pong_answers_the_pings_before_it_and_foreign_pongs_change_nothing() {
        let now = Instant::now();
        let mut u = Unread::default();
        let mut last = [0; 8];
        for _ in 0..3 {
            u.wrote(90 * 1024);
            last = u.ping(now).unwrap();
        }
        u.pong(&[]);
        u.pong(&99u64.to_be_bytes());
        assert_eq!(u.unread(), 270 * 1024);
        u.pong(&last);
        assert_eq!(u.unread(), 0);
        assert!(u.pings.is_empty());
    }

    #[test]
    fn a_backend_that_answers_no_ping_turns_the_window_off_after_the_probe() {
        let now = Instant::now();
        let mut u = Unread::default();
        u.wrote(300 * 1024);
        u.ping(now).unwrap();
        assert_eq!(u.room(now), None);
        assert_eq!(u.probe_deadline(), Some(now + PROBE));
        assert_eq!(u.room(now + PROBE), Some(u64::MAX));
        u.wrote(300 * 1024);
        assert_eq!(u.ping(now + PROBE), None, "no more window pings");
        assert_eq!(u.room(now + PROBE), Some(u64::MAX));
    }

    #[test]
    fn once_a_pong_was_seen_a_slow_backend_keeps_the_window_closed() {
        let now = Instant::now();
        let mut u = Unread::default();
        u.wrote(10);
        let p = u.ping(now).unwrap();
        u.pong(&p);
        u.wrote(300 * 1024);
        u.ping(now).unwrap();
        assert_eq!(u.probe_deadline(), None);
        assert_eq!(u.room(now + PROBE * 10), None);
    }

    /// Many small batches, the backend answering late: whenever the
    /// window is closed a ping is outstanding (else nothing would ever
    /// reopen it), and pings come at most one per `PING_EVERY` bytes.
    #[test]
    fn a_closed_window_always_has_a_ping_to_reopen_it() {
        let now = Instant::now();
        let mut u = Unread::default();
        let mut sent_pings = Vec::new();
        let mut answered = 0;
        for step in 0..20_000u64 {
            if u.room(now).is_some() {
                u.wrote(200 + (step % 7) as usize * 300);
                if let Some(p) = u.ping(now) {
                    sent_pings.push(p);
                }
            } else {
                assert!(!u.pings.is_empty(), "closed with no ping outstanding at step {step}");
                // The backend reads a little: one ping's worth, late.
                u.pong(&sent_pings[answered]);
                answered += 1;
            }
            assert!(u.pings.len() as u64 <= WINDOW / PING_EVERY + 1, "{} pings outstanding", u.pings.len());
        }
        assert!(answered > 10, "the window closed and reopened");
    }
}
