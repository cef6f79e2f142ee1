//! A bounded memory of the tokens settled in this process, to count redeliveries.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::event::ResumeToken;

/// The identity of a token in the memory: a 64-bit FNV-1a hash of its `_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RecentKey(u64);

impl RecentKey {
    /// The key of `token`; `None` for a token without a `_data` string (not remembered).
    pub(super) fn of(token: &ResumeToken) -> Option<Self> {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let data = token.data()?;
        let hash = data
            .bytes()
            .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
        Some(Self(hash))
    }
}

/// The set's hasher: its keys are hashes already, so they are used as they are.
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
pub(super) struct RecentlySettled {
    set: HashSet<u64, BuildHasherDefault<PreHashed>>,
    order: VecDeque<u64>,
    capacity: usize,
}

impl RecentlySettled {
    pub(super) fn new(capacity: usize) -> Self {
        // Room for twice the bound: removals leave tombstones, and the table reclaims them in
        // place only while at most half its room is live. Sized for the bound alone, the
        // runtime's set of 4,096 doubled about 38,000 events into every stream's life, holding
        // both tables while it moved (P6 of docs/performance.md saw it as 0.2 MiB).
        Self {
            set: HashSet::with_capacity_and_hasher(
                capacity.saturating_mul(2),
                BuildHasherDefault::default(),
            ),
            order: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Whether a token with this key was settled recently.
    pub(super) fn contains(&self, key: Option<RecentKey>) -> bool {
        key.is_some_and(|k| self.set.contains(&k.0))
    }

    /// Remembers a settled token by its key, forgetting the oldest past the capacity.
    pub(super) fn insert(&mut self, key: Option<RecentKey>) {
        let Some(RecentKey(key)) = key else { return };
        if !self.set.insert(key) {
            return;
        }
        if self.order.len() == self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.order.push_back(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn key(data: &str) -> Option<RecentKey> {
        RecentKey::of(&ResumeToken::from_document(doc! {"_data": data}))
    }

    #[test]
    fn remembers_settled_tokens_up_to_its_capacity() {
        let mut recent = RecentlySettled::new(2);
        assert!(!recent.contains(key("01")));
        recent.insert(key("01"));
        recent.insert(key("02"));
        assert!(recent.contains(key("01")) && recent.contains(key("02")));
        recent.insert(key("02"));
        recent.insert(key("03"));
        assert!(!recent.contains(key("01")), "the oldest is forgotten");
        assert!(recent.contains(key("02")) && recent.contains(key("03")));
    }

    #[test]
    fn tokens_without_data_are_not_remembered() {
        let binary = ResumeToken::from_document(doc! {"_data": 1});
        assert_eq!(RecentKey::of(&binary), None);
        let mut recent = RecentlySettled::new(2);
        recent.insert(RecentKey::of(&binary));
        assert!(!recent.contains(RecentKey::of(&binary)));
        assert_ne!(key("0001"), key("0010"));
    }

    #[test]
    fn the_set_never_grows_after_start_however_long_the_stream_runs() {
        // The runtime's bound (worker/mod.rs) and a small one.
        for capacity in [4096, 100] {
            let mut recent = RecentlySettled::new(capacity);
            let start = recent.set.capacity();
            for n in 0..50 * capacity as u64 {
                recent.insert(key(&format!("{n:016X}")));
                // `capacity()` is live entries plus room left: tombstones lower it until the
                // table is rehashed in place; it rises above the start only when it grows.
                assert!(
                    recent.set.capacity() <= start,
                    "capacity {capacity}: the set grew after {n} insertions (a pause and a \
                     memory step in a long-running stream)"
                );
            }
            assert_eq!(recent.order.len(), capacity);
        }
    }
}
