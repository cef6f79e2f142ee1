//! A bounded memory of the tokens settled in this process, to count redeliveries.

use std::collections::{HashSet, VecDeque};

use crate::event::ResumeToken;

/// A bounded memory of tokens settled in this process, to count redeliveries. Keeps hashes of
/// the tokens' data, not the tokens: a collision can only miscount a redelivery, never change
/// what is processed.
pub(super) struct RecentlySettled {
    set: HashSet<u64>,
    order: VecDeque<u64>,
    capacity: usize,
}

impl RecentlySettled {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            set: HashSet::with_capacity(capacity),
            order: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    fn key(token: &ResumeToken) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        let data = token.data()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        data.hash(&mut h);
        Some(h.finish())
    }

    pub(super) fn contains(&self, token: &ResumeToken) -> bool {
        Self::key(token).is_some_and(|k| self.set.contains(&k))
    }

    pub(super) fn insert(&mut self, token: &ResumeToken) {
        let Some(key) = Self::key(token) else { return };
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
