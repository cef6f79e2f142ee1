//! Keyed scheduling of one stream's events (`#[change_stream(concurrency = N)]`).
//!
//! Events wait here in receive order. An event may start when:
//!
//! - fewer than `N` events are in flight;
//! - no earlier event of its key is waiting or in flight (same key: strictly in stream order,
//!   one at a time);
//! - no barrier is in flight or waiting before it.
//!
//! A barrier (an event with no document key: `drop`, `rename`, `dropDatabase`, `invalidate`,
//! unknown types) starts only when everything received before it has finished, and nothing
//! received after it starts before it finished.
//!
//! The key is the `documentKey`'s hash ([`EventKey::of_document_key`]) or, when the stream has
//! a `#[key]` method, the hash of its value (decided in `worker/keyed_session.rs`); events
//! without a document key are barriers either way.
//!
//! This module decides only *when* an event may start; the tracker decides what may be
//! checkpointed (the contiguous settled prefix), whatever order events finish in.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};

use bson::{Bson, Document};

/// What orders an event against others: a hash of its key, or a barrier.
///
/// Two different keys with the same 64-bit hash are ordered as one key: a collision can only
/// serialize more, never less.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKey {
    /// Events with the same hash run one at a time, in stream order.
    Key(u64),
    /// Orders against every event.
    Barrier,
}

impl EventKey {
    /// The key of an event with this `documentKey` (the whole key, shard-key fields included);
    /// a barrier when it has none.
    pub(crate) fn of_document_key(document_key: Option<&Document>) -> EventKey {
        match document_key {
            Some(key) => {
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                hash_document(key, &mut hasher);
                EventKey::Key(hasher.finish())
            }
            None => EventKey::Barrier,
        }
    }
}

fn hash_document(doc: &Document, h: &mut impl Hasher) {
    doc.len().hash(h);
    for (k, v) in doc {
        k.hash(h);
        hash_bson(v, h);
    }
}

/// Hashes a value without allocating. Equal values hash equally; the tag keeps `1` and `"1"`
/// apart.
fn hash_bson(v: &Bson, h: &mut impl Hasher) {
    std::mem::discriminant(v).hash(h);
    match v {
        Bson::Double(d) => d.to_bits().hash(h),
        Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => s.hash(h),
        Bson::Array(items) => {
            items.len().hash(h);
            for item in items {
                hash_bson(item, h);
            }
        }
        Bson::Document(d) => hash_document(d, h),
        Bson::Boolean(b) => b.hash(h),
        Bson::Int32(i) => i.hash(h),
        Bson::Int64(i) => i.hash(h),
        Bson::ObjectId(o) => o.bytes().hash(h),
        Bson::DateTime(t) => t.timestamp_millis().hash(h),
        Bson::Timestamp(t) => (t.time, t.increment).hash(h),
        Bson::Binary(b) => {
            u8::from(b.subtype).hash(h);
            b.bytes.hash(h);
        }
        Bson::Decimal128(d) => d.bytes().hash(h),
        Bson::RegularExpression(r) => (&r.pattern, &r.options).hash(h),
        Bson::JavaScriptCodeWithScope(c) => {
            c.code.hash(h);
            hash_document(&c.scope, h);
        }
        Bson::DbPointer(p) => format!("{p:?}").hash(h),
        Bson::Null | Bson::Undefined | Bson::MaxKey | Bson::MinKey => {}
    }
}

struct Waiting<T> {
    /// Receive order.
    order: u64,
    key: EventKey,
    item: T,
}

/// The waiting events of one stream and the keys in flight.
pub(crate) struct KeyedQueue<T> {
    concurrency: usize,
    waiting: VecDeque<Waiting<T>>,
    /// Keys in flight (one event per key at most).
    busy: HashSet<u64>,
    in_flight: usize,
    barrier_in_flight: bool,
    /// The receive order of the latest event started.
    highest_started: Option<u64>,
}

impl<T> KeyedQueue<T> {
    /// A queue that lets at most `concurrency` events run at once.
    pub(crate) fn new(concurrency: usize) -> Self {
        Self {
            concurrency: concurrency.max(1),
            waiting: VecDeque::new(),
            busy: HashSet::new(),
            in_flight: 0,
            barrier_in_flight: false,
            highest_started: None,
        }
    }

    /// Adds a received event behind every event received before it; `order` grows with
    /// every push.
    pub(crate) fn push(&mut self, order: u64, key: EventKey, item: T) {
        self.waiting.push_back(Waiting { order, key, item });
    }

    /// Events started and not finished.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Takes the earliest waiting event that may start now, marking it in flight.
    pub(crate) fn next_ready(&mut self) -> Option<(EventKey, T)> {
        if self.in_flight >= self.concurrency || self.barrier_in_flight {
            return None;
        }
        let mut blocked: Vec<u64> = Vec::new();
        let mut found = None;
        for (i, w) in self.waiting.iter().enumerate() {
            match w.key {
                EventKey::Barrier => {
                    if i == 0 && self.in_flight == 0 {
                        found = Some(i);
                    }
                    // Nothing behind a waiting barrier may start.
                    break;
                }
                EventKey::Key(k) => {
                    if !self.busy.contains(&k) && !blocked.contains(&k) {
                        found = Some(i);
                        break;
                    }
                    blocked.push(k);
                }
            }
        }
        let w = self.waiting.remove(found?)?;
        self.in_flight += 1;
        self.highest_started = Some(self.highest_started.map_or(w.order, |h| h.max(w.order)));
        match w.key {
            EventKey::Barrier => self.barrier_in_flight = true,
            EventKey::Key(k) => {
                self.busy.insert(k);
            }
        }
        Some((w.key, w.item))
    }

    /// Records that an event started by [`Self::next_ready`] finished.
    pub(crate) fn finish(&mut self, key: EventKey) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match key {
            EventKey::Barrier => self.barrier_in_flight = false,
            EventKey::Key(k) => {
                self.busy.remove(&k);
            }
        }
    }

    /// Forgets every waiting event (they were never started; they will be delivered again).
    pub(crate) fn clear_waiting(&mut self) {
        self.waiting.clear();
    }

    /// Forgets the waiting events received after the latest started one, and keeps those
    /// before it: once they settle, the settled prefix reaches every started event, so a
    /// graceful stop does not leave handled events behind an unsettled one (to be handled
    /// again after the restart).
    pub(crate) fn keep_gaps_before_started(&mut self) {
        match self.highest_started {
            Some(h) => self.waiting.retain(|w| w.order < h),
            None => self.waiting.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn key(n: i32) -> EventKey {
        EventKey::of_document_key(Some(&doc! {"_id": n}))
    }

    /// Pushes in receive order.
    fn push<T>(q: &mut KeyedQueue<T>, key: EventKey, item: T) {
        let last = q.waiting.back().map(|w| w.order).max(q.highest_started);
        let order = last.map_or(100, |o| o + 1);
        q.push(order, key, item);
    }

    fn drain<T>(q: &mut KeyedQueue<T>) -> Vec<T> {
        let mut out = Vec::new();
        while let Some((_, item)) = q.next_ready() {
            out.push(item);
        }
        out
    }

    #[test]
    fn same_key_waits_for_the_previous_one() {
        let mut q = KeyedQueue::new(8);
        push(&mut q, key(1), "a1");
        push(&mut q, key(2), "b1");
        push(&mut q, key(1), "a2");
        push(&mut q, key(3), "c1");
        assert_eq!(drain(&mut q), vec!["a1", "b1", "c1"], "a2 waits behind a1");
        q.finish(key(1));
        assert_eq!(drain(&mut q), vec!["a2"]);
    }

    #[test]
    fn a_later_event_of_a_key_never_overtakes_an_earlier_waiting_one() {
        // Room to run three, but a2 and a3 wait behind a1, one at a time.
        let mut q = KeyedQueue::new(2);
        push(&mut q, key(1), "a1");
        push(&mut q, key(1), "a2");
        push(&mut q, key(1), "a3");
        assert_eq!(drain(&mut q), vec!["a1"]);
        q.finish(key(1));
        assert_eq!(drain(&mut q), vec!["a2"]);
    }

    #[test]
    fn the_bound_holds() {
        let mut q = KeyedQueue::new(2);
        for n in 0..5 {
            push(&mut q, key(n), n);
        }
        assert_eq!(drain(&mut q), vec![0, 1]);
        assert_eq!(q.in_flight(), 2);
        q.finish(key(0));
        assert_eq!(drain(&mut q), vec![2]);
    }

    #[test]
    fn a_barrier_waits_for_everything_before_and_blocks_everything_after() {
        let mut q = KeyedQueue::new(8);
        push(&mut q, key(1), "a");
        push(&mut q, EventKey::Barrier, "drop");
        push(&mut q, key(2), "b");
        assert_eq!(drain(&mut q), vec!["a"], "nothing passes a waiting barrier");
        q.finish(key(1));
        assert_eq!(drain(&mut q), vec!["drop"]);
        assert_eq!(drain(&mut q), Vec::<&str>::new(), "b waits for the barrier");
        q.finish(EventKey::Barrier);
        assert_eq!(drain(&mut q), vec!["b"]);
    }

    #[test]
    fn a_graceful_end_keeps_only_what_fills_the_gaps_before_started_events() {
        let mut q = KeyedQueue::new(8);
        push(&mut q, key(1), "a1");
        push(&mut q, key(1), "a2");
        push(&mut q, key(2), "b1");
        push(&mut q, key(3), "c1");
        assert_eq!(drain(&mut q), vec!["a1", "b1", "c1"]);
        push(&mut q, key(4), "d1");
        // d1 pushed after c1 started: dropped; a2 lies before c1: kept.
        q.keep_gaps_before_started();
        q.finish(key(1));
        assert_eq!(drain(&mut q), vec!["a2"]);
        assert_eq!(drain(&mut q), Vec::<&str>::new());
    }

    #[test]
    fn keys_are_the_whole_document_key() {
        let a = EventKey::of_document_key(Some(&doc! {"region": "eu", "_id": 1}));
        let b = EventKey::of_document_key(Some(&doc! {"region": "us", "_id": 1}));
        assert_ne!(a, b, "shard-key fields count");
        assert_eq!(
            a,
            EventKey::of_document_key(Some(&doc! {"region": "eu", "_id": 1}))
        );
        assert_ne!(key(1), EventKey::of_document_key(Some(&doc! {"_id": "1"})));
        assert_eq!(EventKey::of_document_key(None), EventKey::Barrier);
    }
}
