//! A bounded memory of the tokens settled in this process, to count redeliveries.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use bson::Timestamp;

use crate::event::ResumeToken;

/// The identity of a token in the memory: a 64-bit hash of its `_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RecentKey(u64);

impl RecentKey {
    /// The key of `token`; `None` for a token without a `_data` string (not remembered).
    ///
    /// FNV-1a's step over eight bytes at a time (a token's `_data` is tens of hex digits, hashed
    /// for every event received), then a final mix so that the index's buckets, chosen by the
    /// low bits, spread whatever digits differ.
    pub(super) fn of(token: &ResumeToken) -> Option<Self> {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let data = token.data()?.as_bytes();
        let mut words = data.chunks_exact(8);
        let mut hash = OFFSET ^ data.len() as u64;
        for word in &mut words {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(word);
            hash = (hash ^ u64::from_le_bytes(bytes))
                .wrapping_mul(PRIME)
                .rotate_left(31);
        }
        let mut last = [0u8; 8];
        last[..words.remainder().len()].copy_from_slice(words.remainder());
        hash = (hash ^ u64::from_le_bytes(last)).wrapping_mul(PRIME);
        // MurmurHash3's finalizer.
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^= hash >> 33;
        Some(Self(hash))
    }
}

/// The index's hasher: its keys are hashes already, so they are used as they are.
#[derive(Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A bounded memory of tokens settled in this process, to count redeliveries. Keeps hashes of
/// the tokens' data, not the tokens: a collision can only miscount a redelivery, never change
/// what is processed.
///
/// Most events are new, and an event whose cluster time is later than that of every event
/// received before cannot have been settled before: it is answered without a lookup. So a busy
/// stream only appends each settled key to a ring; the index lookups use is brought up to date
/// from the ring when an event could be a redelivery (after a resume, or a source that delivers
/// again), and only then.
pub(super) struct RecentlySettled {
    /// The keys settled, oldest first, at most `capacity` (a key settled twice is there twice).
    order: VecDeque<u64>,
    /// The sequence number of `order[0]`: each settled key takes the next one.
    first: u64,
    /// The keys of `order` with sequence numbers below `indexed`, each with the number of its
    /// latest copy (so forgetting an older copy keeps the key).
    index: HashMap<u64, u64, BuildHasherDefault<PreHashed>>,
    indexed: u64,
    /// The latest cluster time of the events received.
    latest_time: Option<Timestamp>,
    capacity: usize,
}

impl RecentlySettled {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            order: VecDeque::with_capacity(capacity),
            first: 0,
            index: HashMap::default(),
            indexed: 0,
            latest_time: None,
            capacity: capacity.max(1),
        }
    }

    /// Whether an event just received, with this key and cluster time, was settled recently.
    /// Called once per event received: it notes the event's cluster time.
    pub(super) fn delivered_again(
        &mut self,
        key: Option<RecentKey>,
        cluster_time: Option<Timestamp>,
    ) -> bool {
        let later = match (cluster_time, self.latest_time) {
            (Some(time), Some(latest)) => time > latest,
            // The first event with a time: whatever was received before had none.
            (Some(_), None) => true,
            (None, _) => false,
        };
        if later {
            self.latest_time = cluster_time;
            return false;
        }
        let Some(RecentKey(key)) = key else {
            return false;
        };
        self.catch_up();
        self.index.contains_key(&key)
    }

    /// Remembers a settled token by its key, forgetting the oldest past the capacity.
    pub(super) fn insert(&mut self, key: Option<RecentKey>) {
        let Some(RecentKey(key)) = key else { return };
        if self.order.len() == self.capacity {
            if let Some(old) = self.order.pop_front() {
                let seq = self.first;
                self.first += 1;
                if seq < self.indexed && self.index.get(&old) == Some(&seq) {
                    self.index.remove(&old);
                }
            }
        }
        self.order.push_back(key);
    }

    /// Brings the index up to date with the ring.
    fn catch_up(&mut self) {
        if self.index.capacity() == 0 {
            // Room for twice the bound: removals leave tombstones, and the table reclaims them
            // in place only while at most half its room is live. Sized for the bound alone, the
            // runtime's table of 4,096 doubled about 38,000 events into a stream's life, holding
            // both tables while it moved (P6 of docs/performance.md saw it as 0.2 MiB).
            self.index.reserve(self.capacity.saturating_mul(2));
        }
        let end = self.first + self.order.len() as u64;
        for seq in self.indexed.max(self.first)..end {
            let slot = (seq - self.first) as usize;
            if let Some(&key) = self.order.get(slot) {
                self.index.insert(key, seq);
            }
        }
        self.indexed = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn key(data: &str) -> Option<RecentKey> {
        RecentKey::of(&ResumeToken::from_document(doc! {"_data": data}))
    }

    fn at(time: u32) -> Option<Timestamp> {
        Some(Timestamp { time, increment: 1 })
    }

    #[test]
    fn remembers_settled_tokens_up_to_its_capacity() {
        let mut recent = RecentlySettled::new(2);
        assert!(!recent.delivered_again(key("01"), None));
        recent.insert(key("01"));
        recent.insert(key("02"));
        assert!(recent.delivered_again(key("01"), None));
        assert!(recent.delivered_again(key("02"), None));
        recent.insert(key("02"));
        recent.insert(key("03"));
        assert!(
            !recent.delivered_again(key("01"), None),
            "the oldest is forgotten"
        );
        assert!(recent.delivered_again(key("02"), None));
        assert!(recent.delivered_again(key("03"), None));
    }

    #[test]
    fn forgetting_an_older_copy_of_a_key_keeps_the_newer() {
        let mut recent = RecentlySettled::new(3);
        recent.insert(key("01"));
        recent.insert(key("02"));
        assert!(recent.delivered_again(key("01"), None), "indexes 01 and 02");
        // 01 settled again (a redelivery), then two more: the first copy of 01 is forgotten.
        recent.insert(key("01"));
        recent.insert(key("03"));
        assert!(recent.delivered_again(key("03"), None));
        recent.insert(key("04"));
        assert!(
            recent.delivered_again(key("01"), None),
            "its second copy is still held"
        );
        assert!(!recent.delivered_again(key("02"), None), "forgotten");
    }

    #[test]
    fn an_event_later_than_every_one_received_is_new_without_a_lookup() {
        let mut recent = RecentlySettled::new(100);
        for n in 1..=50u32 {
            let k = key(&format!("{n:04X}"));
            assert!(!recent.delivered_again(k, at(n)));
            recent.insert(k);
        }
        assert_eq!(recent.index.capacity(), 0, "no lookup was needed");
        assert_eq!(recent.order.len(), 50);
        // The source delivers from 40 again (a resume from an older position).
        for n in 40..=50u32 {
            assert!(
                recent.delivered_again(key(&format!("{n:04X}")), at(n)),
                "{n} was settled before"
            );
        }
        assert!(recent.index.capacity() > 0, "looked up");
        // 51 is new again, and so is a time no event had, older than the latest.
        assert!(!recent.delivered_again(key("0033"), at(51)));
        assert!(!recent.delivered_again(
            key("9999"),
            Some(Timestamp {
                time: 45,
                increment: 7
            })
        ));
        // An event with the latest time could share it with one settled (a transaction's).
        recent.insert(key("0033"));
        assert!(recent.delivered_again(key("0033"), at(51)));
    }

    #[test]
    fn distinct_tokens_get_distinct_keys() {
        let mut keys = std::collections::HashSet::new();
        for n in 0..100_000u64 {
            // As long as a server's, differing in one digit, in the middle or at the end.
            for data in [format!("8264{n:016X}2B0229296E5A1004"), format!("{n:X}")] {
                assert!(keys.insert(key(&data).map(|k| k.0)), "{data} collides");
            }
        }
        assert_ne!(key("0001"), key("0010"));
        assert_ne!(key(""), key("0"));
    }

    #[test]
    fn tokens_without_data_are_not_remembered() {
        let binary = ResumeToken::from_document(doc! {"_data": 1});
        assert_eq!(RecentKey::of(&binary), None);
        let mut recent = RecentlySettled::new(2);
        recent.insert(RecentKey::of(&binary));
        assert!(!recent.delivered_again(RecentKey::of(&binary), None));
        assert_ne!(key("0001"), key("0010"));
    }

    #[test]
    fn the_index_never_grows_after_start_however_long_the_stream_runs() {
        // The runtime's bound (worker/mod.rs) and a small one; every event looked up (no
        // cluster time), so the index follows the ring throughout.
        for capacity in [4096, 100] {
            let mut recent = RecentlySettled::new(capacity);
            recent.delivered_again(key("start"), None);
            let start = recent.index.capacity();
            for n in 0..50 * capacity as u64 {
                let k = key(&format!("{n:016X}"));
                assert!(!recent.delivered_again(k, None));
                recent.insert(k);
                // `capacity()` is live entries plus room left: tombstones lower it until the
                // table is rehashed in place; it rises above the start only when it grows.
                assert!(
                    recent.index.capacity() <= start,
                    "capacity {capacity}: the index grew after {n} insertions (a pause and a \
                     memory step in a long-running stream)"
                );
            }
            assert_eq!(recent.order.len(), capacity);
            assert!(recent.index.len() <= capacity);
        }
    }
}
