//! The outbox: every reply and status message the daemon produces goes
//! through one FIFO queue, which the link drains while it is connected and
//! registered. Messages produced while the link is down wait here and go
//! out, in order, after the next `register_agent` (the Node proxy threw
//! them away: reference §1.2 [QUIRK]).
//!
//! The queue is bounded by `outbox_max_messages` and `outbox_max_bytes`
//! (defaults 10 000 and 64 MiB). When a new message would exceed either,
//! the **oldest** messages are dropped to make room — the newest state is
//! worth more than the oldest — and never silently: each drop is logged as
//! an error with its type and run, and the first thing sent after the next
//! registration is, per affected run, a `proxy_update` text
//! `[proxy:error] outbox overflow: …` saying how many were lost (messages
//! that belong to no run are reported in the log only).
//!
//! A message leaves the queue only after the WebSocket flushed it
//! ([`Outbox::peek_batch`], then [`Outbox::pop_through`] once the batch
//! was written), so a send that fails keeps it for the next connection.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::Notify;

/// One queued message: its JSON text and what to say about it if dropped.
#[derive(Clone, Debug)]
pub struct Item {
    pub seq: u64,
    pub text: Arc<str>,
    pub kind: String,
    pub run_id: Option<String>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Item>,
    bytes: usize,
    next_seq: u64,
    /// Dropped messages per run id ("" for messages without one).
    dropped: BTreeMap<String, u64>,
}

pub struct Outbox {
    state: Mutex<State>,
    notify: Notify,
    max_messages: usize,
    max_bytes: usize,
}

impl Outbox {
    pub fn new(max_messages: usize, max_bytes: usize) -> Outbox {
        Outbox { state: Mutex::new(State::default()), notify: Notify::new(), max_messages, max_bytes }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a message. Never blocks; may drop the oldest (see the module doc).
    pub fn push<T: Serialize>(&self, msg: &T) {
        let value = match serde_json::to_value(msg) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!("outbox: a message could not be serialized: {e}");
                return;
            }
        };
        let kind = value.get("type").and_then(|v| v.as_str()).unwrap_or("?").to_string();
        let run_id = value.get("run_id").and_then(|v| v.as_str()).map(str::to_string);
        let text: Arc<str> = Arc::from(value.to_string());
        let mut st = self.lock();
        let seq = st.next_seq;
        st.next_seq += 1;
        while !st.queue.is_empty()
            && (st.queue.len() + 1 > self.max_messages || st.bytes + text.len() > self.max_bytes)
        {
            let old = st.queue.pop_front().expect("not empty");
            st.bytes -= old.text.len();
            tracing::error!(
                "outbox full ({} messages, {} bytes max): dropped the oldest message, {} for run {}",
                self.max_messages,
                self.max_bytes,
                old.kind,
                old.run_id.as_deref().unwrap_or("-")
            );
            *st.dropped.entry(old.run_id.unwrap_or_default()).or_default() += 1;
        }
        st.bytes += text.len();
        st.queue.push_back(Item { seq, text, kind, run_id });
        drop(st);
        self.notify.notify_one();
    }

    /// The oldest message, waiting until there is one.
    pub async fn peek(&self) -> Item {
        loop {
            let notified = self.notify.notified();
            if let Some(item) = self.lock().queue.front().cloned() {
                return item;
            }
            notified.await;
        }
    }

    /// Up to `max` of the oldest messages, waiting until there is one.
    pub async fn peek_batch(&self, max: usize) -> Vec<Item> {
        loop {
            let notified = self.notify.notified();
            {
                let st = self.lock();
                if !st.queue.is_empty() {
                    return st.queue.iter().take(max).cloned().collect();
                }
            }
            notified.await;
        }
    }

    /// Removes every message up to and including `seq` once they were sent.
    pub fn pop_through(&self, seq: u64) {
        let mut st = self.lock();
        while st.queue.front().is_some_and(|i| i.seq <= seq) {
            let item = st.queue.pop_front().expect("front exists");
            st.bytes -= item.text.len();
        }
    }

    /// Removes message `seq` once it was sent (a no-op if it was dropped meanwhile).
    pub fn pop(&self, seq: u64) {
        let mut st = self.lock();
        if st.queue.front().is_some_and(|i| i.seq == seq) {
            let item = st.queue.pop_front().expect("front exists");
            st.bytes -= item.text.len();
        }
    }

    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The overflow report, per run, to send before the queue; clears it.
    pub fn take_overflow_notices(&self) -> Vec<serde_json::Value> {
        let dropped = std::mem::take(&mut self.lock().dropped);
        dropped
            .into_iter()
            // A proxy_update needs a run; drops of run-less messages
            // (inventories, results of run-less controls) were logged.
            .filter(|(run_id, _)| !run_id.is_empty())
            .map(|(run_id, n)| {
                let text = format!(
                    "outbox overflow: {n} message(s) produced while disconnected were dropped \
                     (bound: {} messages / {} bytes)",
                    self.max_messages, self.max_bytes
                );
                super::protocol::proxy_error_text(&run_id, &text)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn fifo_and_pop_after_send() {
        let o = Outbox::new(10, 1 << 20);
        o.push(&json!({"type":"a","run_id":"r"}));
        o.push(&json!({"type":"b"}));
        let first = o.peek().await;
        assert_eq!(first.kind, "a");
        // Not popped yet: a failed send keeps it.
        assert_eq!(o.peek().await.seq, first.seq);
        o.pop(first.seq);
        assert_eq!(o.peek().await.kind, "b");
    }

    #[test]
    fn overflow_drops_oldest_and_reports() {
        let o = Outbox::new(2, 1 << 20);
        for i in 0..5 {
            o.push(&json!({"type":"prompt_result","run_id":"r1","i":i}));
        }
        assert_eq!(o.len(), 2);
        let notices = o.take_overflow_notices();
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0]["run_id"], "r1");
        assert!(notices[0]["content"]["text"].as_str().unwrap().contains("3 message(s)"));
        assert!(o.take_overflow_notices().is_empty());
    }
}
