//! Invariant 11, keyed scheduling: within one runtime, two events of the same key are never in
//! processing at once (the later one begins only after the earlier one settled), and a barrier
//! (an event with no document key) is never in processing beside any other event. Checked at
//! the instant an event begins (its first `#[filter]` call of a delivery, which the runtime
//! makes right before the handler).
//!
//! Processing that a runtime abandons (a session that ended with handlers cut off) is forgotten
//! when that runtime opens its next cursor: those events are delivered again.

use super::*;

impl WorldState {
    /// Invariant 11: `seq` of `key` begins processing in incarnation `inc`.
    pub(crate) fn on_begin(&mut self, inc: u32, seq: u64, key: Option<i32>) {
        let open = self.in_flight.entry(inc).or_default();
        if open.contains_key(&seq) {
            return; // a retry of the same event
        }
        let clash = open
            .iter()
            .find(|(s, k)| **s != seq && (k.is_none() || key.is_none() || **k == key))
            .map(|(s, k)| (*s, *k));
        open.insert(seq, key);
        let Some((other, other_key)) = clash else {
            return;
        };
        let label = |k: Option<i32>| k.map_or("a barrier".to_owned(), |k| format!("k{k}"));
        let message = format!(
            "change #{seq} ({}) began while #{other} ({}) was in processing in the same runtime",
            label(key),
            label(other_key)
        );
        self.violate(Invariant::KeyedScheduling, message);
    }

    /// `seq` settled (handled, dead-lettered, filtered, unrouted): no longer in processing.
    pub(crate) fn end_in_flight(&mut self, seq: u64) {
        for open in self.in_flight.values_mut() {
            open.remove(&seq);
        }
        for open in self.received_open.values_mut() {
            open.remove(&seq);
        }
    }

    /// A cursor of incarnation `inc` delivered `seq`.
    pub(crate) fn on_delivered(&mut self, inc: u32, seq: u64) {
        if !self.settled.contains_key(&seq) {
            self.received_open.entry(inc).or_default().insert(seq);
        }
    }

    /// Incarnation `inc` shut down gracefully.
    pub(crate) fn on_graceful_end(&mut self, inc: u32) {
        self.leave_unsettled(inc, "at shutdown");
    }

    /// Incarnation `inc` opened a cursor: nothing of its earlier sessions is in processing.
    pub(crate) fn on_cursor_open(&mut self, inc: u32) {
        self.leave_unsettled(inc, "by the previous cursor");
    }

    /// The events `inc` received and did not settle (never started after a stop, or cut off
    /// by the shutdown timeout) are delivered again, and with concurrent handlers so are later
    /// events it had already handled (at-least-once), which invariant 4 excuses.
    fn leave_unsettled(&mut self, inc: u32, when: &str) {
        self.in_flight.remove(&inc);
        let left: Vec<u64> = self
            .received_open
            .remove(&inc)
            .map(|open| open.into_iter().collect())
            .unwrap_or_default();
        if !left.is_empty() {
            let tag = self.tag(inc);
            self.log(format!("{tag}left unsettled {when}: {left:?}"));
            self.left_unsettled.extend(left);
        }
    }
}
