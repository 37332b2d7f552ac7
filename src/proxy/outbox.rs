//! The outbox: every reply and status message the daemon produces goes
//! through one FIFO queue, which the link drains while it is connected and
//! registered. Messages produced while the link is down wait here and go
//! out, in order, after the next `register_agent` (the Node proxy threw
//! them away: docs/protocol.md, "Connection lifecycle").
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
//! ([`Outbox::peek_batch`], then [`Outbox::pop_sent`] once the batch
//! was written), so a send that fails keeps it for the next connection.
//!
//! **Two lanes.** The answers to controls (`sandbox_control_result`,
//! `session_control_result`: [`URGENT`]) queue in a lane of their own that
//! every batch takes first, so a control never waits behind the updates of
//! relaying runs (thousands of them while the backend reads slower than
//! the agents write). Everything else keeps one FIFO: a run's updates, its
//! `prompt_result` and its status reports are never reordered among
//! themselves; a control's answer may overtake what was queued before it.
//! (Heartbeats and `register_agent` never queue here: the link writes them
//! itself, ahead of the next batch.) The bounds count both lanes; an
//! overflow drops the oldest bulk message first.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Utf8Bytes;

/// One queued message: its JSON text and what to say about it if dropped.
#[derive(Clone, Debug)]
struct Item {
    seq: u64,
    /// Shared with the frame that sends it (no copy per send attempt).
    text: Utf8Bytes,
    kind: Cow<'static, str>,
    run_id: Option<Arc<str>>,
}

/// Message types that go ahead of the bulk (see the module doc).
pub const URGENT: &[&str] = &["sandbox_control_result", "session_control_result"];

#[derive(Default)]
struct State {
    /// The bulk lane, in order.
    queue: VecDeque<Item>,
    /// The control answers' lane, in order.
    urgent: VecDeque<Item>,
    bytes: usize,
    next_seq: u64,
    /// Dropped messages per run id ("" for messages without one).
    dropped: BTreeMap<String, u64>,
    /// Every message dropped since the start.
    dropped_total: u64,
}

impl State {
    fn len(&self) -> usize {
        self.queue.len() + self.urgent.len()
    }
}

/// Messages taken for one write ([`Outbox::peek_batch`]): the urgent
/// lane's first, then the bulk's, in the order to send them.
#[derive(Debug, Default)]
pub struct Batch {
    texts: Vec<Utf8Bytes>,
    /// The last message taken from each lane.
    urgent_through: Option<u64>,
    bulk_through: Option<u64>,
}

impl Batch {
    /// The messages, in the order to send them.
    pub fn texts(&self) -> &[Utf8Bytes] {
        &self.texts
    }

    pub fn into_texts(self) -> Vec<Utf8Bytes> {
        self.texts
    }
}

pub struct Outbox {
    state: Mutex<State>,
    /// A message was queued.
    notify: Notify,
    /// Messages left the queue, or the link went down.
    room: Notify,
    /// The link is registered and draining the queue.
    connected: AtomicBool,
    max_messages: usize,
    max_bytes: usize,
}

/// The two fields of a message the outbox reports drops by.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    run_id: Option<Cow<'a, str>>,
}

impl Outbox {
    pub fn new(max_messages: usize, max_bytes: usize) -> Outbox {
        Outbox {
            state: Mutex::new(State::default()),
            notify: Notify::new(),
            room: Notify::new(),
            connected: AtomicBool::new(false),
            max_messages,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a message. Never blocks; may drop the oldest (see the module doc).
    pub fn push<T: Serialize + ?Sized>(&self, msg: &T) {
        let text = match serde_json::to_string(msg) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!("outbox: a message could not be serialized: {e}");
                return;
            }
        };
        let (kind, run_id) = match serde_json::from_str::<Head<'_>>(&text) {
            Ok(h) => {
                (Cow::Owned(h.kind.as_deref().unwrap_or("?").to_string()), h.run_id.as_deref().map(Arc::from))
            }
            Err(_) => (Cow::Borrowed("?"), None),
        };
        self.enqueue(text, kind, run_id);
    }

    /// Queues a message already serialized by the caller (the relay of
    /// agent updates, which copies the agent's JSON text as it is):
    /// `text` must be one JSON object of type `kind`.
    pub fn push_text(&self, text: String, kind: &'static str, run_id: &Arc<str>) {
        self.enqueue(text, Cow::Borrowed(kind), Some(run_id.clone()));
    }

    fn enqueue(&self, text: String, kind: Cow<'static, str>, run_id: Option<Arc<str>>) {
        let text = Utf8Bytes::from(text);
        let urgent = URGENT.contains(&kind.as_ref());
        let mut st = self.lock();
        let seq = st.next_seq;
        st.next_seq += 1;
        while st.len() > 0 && (st.len() + 1 > self.max_messages || st.bytes + text.len() > self.max_bytes) {
            let old = match st.queue.pop_front() {
                Some(old) => old,
                None => st.urgent.pop_front().expect("not empty"),
            };
            st.bytes -= old.text.len();
            tracing::error!(
                "outbox full ({} messages, {} bytes max): dropped the oldest message, {} for run {}",
                self.max_messages,
                self.max_bytes,
                old.kind,
                old.run_id.as_deref().unwrap_or("-")
            );
            *st.dropped.entry(old.run_id.as_deref().unwrap_or_default().to_string()).or_default() += 1;
            st.dropped_total += 1;
        }
        st.bytes += text.len();
        let item = Item { seq, text, kind, run_id };
        if urgent {
            st.urgent.push_back(item)
        } else {
            st.queue.push_back(item)
        }
        drop(st);
        self.notify.notify_one();
    }

    /// The link is registered (and drains the queue) or not.
    pub fn set_connected(&self, on: bool) {
        self.connected.store(on, Ordering::SeqCst);
        if !on {
            // Producers waiting for room go on: while disconnected the
            // queue keeps what it can and drops the oldest (module doc).
            self.room.notify_waiters();
        }
    }

    fn over_high_water(&self) -> bool {
        let st = self.lock();
        st.len() >= self.max_messages / 2 || st.bytes >= self.max_bytes / 2
    }

    /// Whether [`Outbox::wait_for_room`] would wait now.
    pub fn is_backed_up(&self) -> bool {
        self.connected.load(Ordering::SeqCst) && self.over_high_water()
    }

    /// Backpressure for a producer that can wait (an agent's stdout):
    /// while the link is up and the queue is over half its bounds, waits
    /// until the link has sent some. A fast agent is then slowed to the
    /// backend's pace instead of having its oldest updates dropped.
    pub async fn wait_for_room(&self) {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if !self.connected.load(Ordering::SeqCst) || !self.over_high_water() {
                return;
            }
            room.await;
        }
    }

    /// The next messages to send: the urgent lane's, then the bulk's
    /// oldest, at most `max` of them and about `max_bytes` (always at
    /// least one), waiting until there is one. `bulk_room`: how many
    /// bytes of bulk messages the link may write now (at least one
    /// message when `Some`); `None` takes urgent messages only.
    pub async fn peek_batch(&self, max: usize, max_bytes: usize, bulk_room: Option<usize>) -> Batch {
        loop {
            let notified = self.notify.notified();
            {
                let st = self.lock();
                if !st.urgent.is_empty() || (bulk_room.is_some() && !st.queue.is_empty()) {
                    let mut batch = Batch::default();
                    let mut bytes = 0;
                    // The first message goes whatever its size, the rest
                    // within `limit` bytes in all.
                    fn fits(bytes: &mut usize, i: &Item, limit: usize) -> bool {
                        let first = *bytes == 0;
                        *bytes += i.text.len().max(1);
                        first || *bytes <= limit
                    }
                    for i in st.urgent.iter().take(max).take_while(|i| fits(&mut bytes, i, max_bytes)) {
                        batch.texts.push(i.text.clone());
                        batch.urgent_through = Some(i.seq);
                    }
                    if let Some(bulk_room) = bulk_room {
                        let left = max - batch.texts.len();
                        let limit = max_bytes.min(bytes.saturating_add(bulk_room));
                        for i in st.queue.iter().take(left).take_while(|i| fits(&mut bytes, i, limit)) {
                            batch.texts.push(i.text.clone());
                            batch.bulk_through = Some(i.seq);
                        }
                    }
                    return batch;
                }
            }
            notified.await;
        }
    }

    /// Removes the messages of `batch` once they were sent.
    pub fn pop_sent(&self, batch: &Batch) {
        let mut st = self.lock();
        let st = &mut *st;
        for (lane, through) in [(&mut st.urgent, batch.urgent_through), (&mut st.queue, batch.bulk_through)] {
            let Some(through) = through else { continue };
            while lane.front().is_some_and(|i| i.seq <= through) {
                let item = lane.pop_front().expect("front exists");
                st.bytes -= item.text.len();
            }
        }
        self.room.notify_waiters();
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Messages and bytes queued now, and messages dropped since the start.
    pub fn stats(&self) -> (usize, usize, u64) {
        let st = self.lock();
        (st.queue.len(), st.bytes, st.dropped_total)
    }

    /// Waits until every queued message was sent, at most `bound`; true
    /// when the queue is empty (used at shutdown).
    pub async fn drained(&self, bound: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if self.is_empty() {
                return true;
            }
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                return self.is_empty();
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The overflow report, per run, to send before the queue (as
    /// sent); clears it.
    pub fn take_overflow_notices(&self) -> Vec<String> {
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
                let notice = super::protocol::ProxyUpdate::error(&run_id, &text);
                serde_json::to_string(&notice).expect("plain data")
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
        o.push_text(r#"{"type":"b","run_id":"r"}"#.into(), "b", &Arc::from("r"));
        let first = o.peek_batch(1, 1 << 20, Some(1 << 20)).await;
        let text: serde_json::Value = serde_json::from_str(first.texts()[0].as_str()).unwrap();
        assert_eq!(text, json!({"type":"a","run_id":"r"}));
        // Not popped yet: a failed send keeps it.
        assert_eq!(o.peek_batch(5, 1 << 20, Some(1 << 20)).await.texts().len(), 2);
        o.pop_sent(&first);
        assert_eq!(
            o.peek_batch(5, 1 << 20, Some(1 << 20)).await.texts()[0].as_str(),
            r#"{"type":"b","run_id":"r"}"#
        );
    }

    /// Queues updates of run `r` numbered by `range`; returns the run id.
    fn push_updates(o: &Outbox, range: std::ops::Range<usize>) -> Arc<str> {
        let run: Arc<str> = Arc::from("r");
        for i in range {
            o.push_text(format!(r#"{{"type":"acp_update","run_id":"r","i":{i}}}"#), "acp_update", &run);
        }
        run
    }

    /// Control answers go out ahead of the queued updates; the updates
    /// keep their order, and a batch cut short leaves the rest queued.
    #[tokio::test]
    async fn control_answers_overtake_the_bulk() {
        let o = Outbox::new(100, 1 << 20);
        let run = push_updates(&o, 0..5);
        o.push(&json!({"type":"sandbox_control_result","request_id":"q1"}));
        o.push_text(r#"{"type":"acp_update","run_id":"r","i":5}"#.into(), "acp_update", &run);
        o.push(&json!({"type":"session_control_result","control_id":"c1"}));
        let types = |b: &Batch| -> Vec<String> {
            b.texts()
                .iter()
                .map(|t| {
                    let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                    v.get("i").map_or_else(|| v["type"].as_str().unwrap().to_string(), |i| i.to_string())
                })
                .collect()
        };
        let b = o.peek_batch(4, 1 << 20, Some(1 << 20)).await;
        assert_eq!(types(&b), ["sandbox_control_result", "session_control_result", "0", "1"]);
        o.pop_sent(&b);
        // An answer queued meanwhile still goes first.
        o.push(&json!({"type":"sandbox_control_result","request_id":"q2"}));
        let b = o.peek_batch(100, 1 << 20, Some(1 << 20)).await;
        assert_eq!(types(&b), ["sandbox_control_result", "2", "3", "4", "5"]);
        o.pop_sent(&b);
        assert!(o.is_empty());
        // Overflow drops the oldest bulk message, not an answer.
        let o = Outbox::new(2, 1 << 20);
        o.push(&json!({"type":"sandbox_control_result","request_id":"q3"}));
        o.push(&json!({"type":"acp_update","run_id":"r","i":0}));
        o.push(&json!({"type":"acp_update","run_id":"r","i":1}));
        assert_eq!(types(&o.peek_batch(5, 1 << 20, Some(1 << 20)).await), ["sandbox_control_result", "1"]);
    }

    /// With the link's read window closed only answers go out; with a
    /// little room, bulk messages up to it (and always one).
    #[tokio::test]
    async fn a_closed_window_holds_the_bulk_but_not_the_answers() {
        let o = Outbox::new(100, 1 << 20);
        push_updates(&o, 0..3);
        let waiting = o.peek_batch(10, 1 << 20, None);
        tokio::pin!(waiting);
        use futures_util::FutureExt;
        assert!((&mut waiting).now_or_never().is_none(), "bulk only, window closed: nothing to take");
        o.push(&json!({"type":"sandbox_control_result","request_id":"q"}));
        let b = waiting.await;
        assert_eq!(b.texts().len(), 1);
        assert!(b.texts()[0].as_str().contains("sandbox_control_result"));
        o.pop_sent(&b);
        // One byte of room still takes one message; 80 bytes take two.
        assert_eq!(o.peek_batch(10, 1 << 20, Some(1)).await.texts().len(), 1);
        assert_eq!(o.peek_batch(10, 1 << 20, Some(80)).await.texts().len(), 2);
    }

    #[tokio::test]
    async fn producers_wait_for_room_while_connected() {
        let o = Arc::new(Outbox::new(4, 1 << 20));
        for i in 0..2 {
            o.push(&json!({"type":"u","i":i}));
        }
        // Disconnected: never waits (the queue drops the oldest instead).
        o.wait_for_room().await;
        o.set_connected(true);
        let waiting = {
            let o = o.clone();
            tokio::spawn(async move { o.wait_for_room().await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "half full: the producer waits");
        let batch = o.peek_batch(1, 1 << 20, Some(1 << 20)).await;
        o.pop_sent(&batch);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting).await.unwrap().unwrap();
        // Going down releases a waiter too.
        o.push(&json!({"type":"u"}));
        let waiting = {
            let o = o.clone();
            tokio::spawn(async move { o.wait_for_room().await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        o.set_connected(false);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting).await.unwrap().unwrap();
    }

    #[test]
    fn overflow_drops_oldest_and_reports() {
        let o = Outbox::new(2, 1 << 20);
        for i in 0..5 {
            o.push(&json!({"type":"prompt_result","run_id":"r1","i":i}));
        }
        assert_eq!(o.len(), 2);
        let notices: Vec<serde_json::Value> =
            o.take_overflow_notices().iter().map(|t| serde_json::from_str(t).unwrap()).collect();
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0]["run_id"], "r1");
        assert!(notices[0]["content"]["text"].as_str().unwrap().contains("3 message(s)"));
        assert!(o.take_overflow_notices().is_empty());
    }
}
