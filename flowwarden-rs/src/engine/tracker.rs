//! The seen / in-flight / settled rule, in one place.
//!
//! Every position the engine receives is registered here in receive order. A position becomes
//! checkpointable only when it and every position before it are settled (handled,
//! dead-lettered, skipped by an explicit `ErrorAction::Skip`, filtered out, unrouted, or an
//! idle post-batch token). The checkpoint is always the end of that contiguous settled prefix.

use std::cmp::Ordering;
use std::collections::VecDeque;

use crate::port::{Checkpoint, StoredPosition};

/// How a position was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settlement {
    /// A handler finished successfully.
    Handled,
    /// The event was dead-lettered.
    DeadLettered,
    /// `ErrorAction::Skip`.
    Skipped,
    /// The client-side filter rejected it.
    Filtered,
    /// No handler takes this operation type.
    Unrouted,
    /// An idle post-batch token.
    Idle,
}

impl Settlement {
    /// Whether this settlement advances the processed token (FlowWarden's lastProcessedToken).
    fn is_processed(self) -> bool {
        matches!(self, Self::Handled | Self::DeadLettered | Self::Skipped)
    }
}

/// A registered, not yet settled position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket(u64);

impl Ticket {
    /// The position's receive sequence number within this tracker.
    pub(crate) fn seq(self) -> u64 {
        self.0
    }
}

#[derive(Debug, Clone)]
struct Pending {
    seq: u64,
    position: StoredPosition,
    settled: Option<Settlement>,
}

/// Tracks positions from receipt to settlement and yields what may be checkpointed.
#[derive(Debug, Clone)]
pub(crate) struct Tracker {
    pending: VecDeque<Pending>,
    next_seq: u64,
    seen: Option<StoredPosition>,
    /// The latest settled handled position, unless `processed_at_seen`: then it is `seen` (the
    /// common case, a handled event settling), kept once rather than cloned into both.
    processed: Option<StoredPosition>,
    processed_at_seen: bool,
    /// The stored `lastSeen` that a replay from the stored `lastProcessed` has not passed yet:
    /// written as `lastSeen` instead of the older replayed positions, so the replay never gives
    /// up a fallback the stream could resume from.
    seen_floor: Option<StoredPosition>,
    processed_since_save: u32,
    dirty: bool,
    /// Test-only: reintroduces the classic bug (a position counts as done on receipt).
    #[cfg(feature = "test-util")]
    checkpoint_on_receipt: bool,
    /// Test-only: the concurrent consumer's bug (the checkpoint follows the highest completed
    /// position, not the settled prefix); holds that position's sequence number once on.
    #[cfg(feature = "test-util")]
    highest_completed: Option<Option<u64>>,
}

impl Tracker {
    /// Starts from the stored positions (so a flush never moves a checkpoint backwards).
    pub(crate) fn new(seen: Option<StoredPosition>, processed: Option<StoredPosition>) -> Self {
        Self {
            pending: VecDeque::new(),
            next_seq: 0,
            seen,
            processed,
            processed_at_seen: false,
            seen_floor: None,
            processed_since_save: 0,
            dirty: false,
            #[cfg(feature = "test-util")]
            checkpoint_on_receipt: false,
            #[cfg(feature = "test-util")]
            highest_completed: None,
        }
    }

    /// Test-only: makes this tracker count a position as done on receipt (the classic bug), so
    /// a test can prove its checker catches it.
    #[cfg(feature = "test-util")]
    pub(crate) fn with_checkpoint_on_receipt(mut self, on: bool) -> Self {
        self.checkpoint_on_receipt = on;
        self
    }

    /// Test-only: makes this tracker checkpoint the highest completed position instead of the
    /// contiguous settled prefix (the bug of naive concurrent consumers), so a test can prove
    /// its checker catches it.
    #[cfg(feature = "test-util")]
    pub(crate) fn with_checkpoint_highest_completed(mut self, on: bool) -> Self {
        self.highest_completed = on.then_some(None);
        self
    }

    /// Registers a received position (seen, not settled).
    pub(crate) fn receive(&mut self, position: StoredPosition) -> Ticket {
        let seq = self.next_seq;
        self.next_seq += 1;
        #[cfg(feature = "test-util")]
        if self.checkpoint_on_receipt {
            // The bug the simulation must catch: "seen" treated as "done".
            self.advance_both(position.clone());
            self.dirty = true;
        }
        self.pending.push_back(Pending {
            seq,
            position,
            settled: None,
        });
        Ticket(seq)
    }

    /// Registers an idle post-batch position: settled, but it only takes effect once every
    /// position received before it is settled.
    pub(crate) fn receive_idle(&mut self, position: StoredPosition) {
        let ticket = self.receive(position);
        self.settle(ticket, Settlement::Idle);
    }

    /// Marks a received position settled and advances the settled prefix.
    pub(crate) fn settle(&mut self, ticket: Ticket, how: Settlement) {
        if let Some(p) = self.pending.iter_mut().find(|p| p.seq == ticket.0) {
            p.settled = Some(how);
            #[cfg(feature = "test-util")]
            if let Some(highest) = self.highest_completed.as_mut() {
                // The bug: whatever completed last and highest is "done", with all before it.
                if highest.is_none_or(|h| p.seq > h) {
                    *highest = Some(p.seq);
                    let position = p.position.clone();
                    if how.is_processed() {
                        self.advance_both(position);
                        self.processed_since_save += 1;
                    } else {
                        self.advance_seen(position);
                    }
                    self.dirty = true;
                }
            }
        }
        while let Some(front) = self.pending.front() {
            let Some(how) = front.settled else { break };
            let Some(done) = self.pending.pop_front() else {
                break;
            };
            #[cfg(feature = "test-util")]
            if self
                .highest_completed
                .is_some_and(|h| h.is_some_and(|h| done.seq <= h))
            {
                // Already counted by the bug above; the prefix catching up changes nothing.
                continue;
            }
            if self.seen_floor.as_ref().is_some_and(|floor| {
                done.position.token.position_cmp(&floor.token) != Some(Ordering::Less)
            }) {
                // Passed (or not comparable: then the replayed position is written, as before).
                self.seen_floor = None;
            }
            if how.is_processed() {
                self.processed_since_save += 1;
                self.advance_both(done.position);
            } else if done.position.start_after {
                // A settled invalidate ends the stream whether a handler took it or not: both
                // tokens move past it, so neither resume strategy replays it (and halts again).
                self.advance_both(done.position);
            } else {
                self.advance_seen(done.position);
            }
            self.dirty = true;
        }
    }

    /// Moves the settled `seen` to `position`, and the settled `processed` with it.
    fn advance_both(&mut self, position: StoredPosition) {
        self.seen = Some(position);
        self.processed = None;
        self.processed_at_seen = true;
    }

    /// Moves the settled `seen` to `position`; the settled `processed` stays where it was (when
    /// it was `seen`, that position moves over to it).
    fn advance_seen(&mut self, position: StoredPosition) {
        let before = self.seen.replace(position);
        if self.processed_at_seen {
            self.processed = before;
            self.processed_at_seen = false;
        }
    }

    /// Called when the cursor resumed from the stored `lastProcessed` while the stored
    /// `lastSeen` lies ahead of it (`ResumeStrategy::ProcessedFirst`): the replay in between
    /// re-delivers positions settled before, and until it passes the stored `lastSeen`, that one
    /// stays the written `lastSeen` (see `docs/checkpoint-resume.md`).
    pub(crate) fn hold_seen_floor(&mut self) {
        let ahead = match (&self.seen, self.settled_processed()) {
            (Some(seen), Some(processed)) => {
                seen.token.position_cmp(&processed.token) == Some(Ordering::Greater)
            }
            _ => false,
        };
        if ahead {
            self.seen_floor = self.seen.clone();
        }
    }

    /// Forgets positions that were received but will never be settled in this session
    /// (the cursor they came from is gone; they will be delivered again), and every position
    /// behind the first of them, settled or not: with concurrent handlers a later event may
    /// have settled before an earlier one that was abandoned, and the checkpoint must never
    /// move past the abandoned one. The later ones are delivered again too (at-least-once).
    pub(crate) fn abandon_unsettled(&mut self) {
        if let Some(first) = self.pending.iter().position(|p| p.settled.is_none()) {
            self.pending.truncate(first);
        }
    }

    /// Number of positions received and not yet part of the settled prefix.
    pub(crate) fn unsettled(&self) -> usize {
        self.pending.len()
    }

    /// The latest settled position: where to resume within this process.
    pub(crate) fn settled_seen(&self) -> Option<&StoredPosition> {
        self.seen.as_ref()
    }

    /// The latest settled handled position.
    pub(crate) fn settled_processed(&self) -> Option<&StoredPosition> {
        if self.processed_at_seen {
            self.seen.as_ref()
        } else {
            self.processed.as_ref()
        }
    }

    /// Handled events settled since the last save.
    pub(crate) fn processed_since_save(&self) -> u32 {
        self.processed_since_save
    }

    /// Whether the settled prefix moved since the last save.
    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The checkpoint to write now (the settled prefix only).
    pub(crate) fn snapshot(&self, stream: &str, updated_at: bson::DateTime) -> Checkpoint {
        Checkpoint {
            stream: stream.to_owned(),
            last_processed: self.settled_processed().cloned(),
            last_seen: self.seen_floor.clone().or_else(|| self.seen.clone()),
            owner: None,
            epoch: None,
            updated_at,
            snapshot: None,
        }
    }

    /// Records that the snapshot was stored.
    pub(crate) fn mark_saved(&mut self) {
        self.processed_since_save = 0;
        self.dirty = false;
    }

    /// Undoes a [`Tracker::mark_saved`] whose write failed: the prefix is unsaved again, and
    /// the `processed` events it covered count towards the next save again.
    pub(crate) fn mark_unsaved(&mut self, processed: u32) {
        self.processed_since_save = self.processed_since_save.saturating_add(processed);
        self.dirty = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ResumeToken;

    fn pos(n: u32) -> StoredPosition {
        StoredPosition {
            token: ResumeToken::from_document(bson::doc! {"_data": format!("{n:04X}")}),
            cluster_time: None,
            wall_time: None,
            start_after: false,
        }
    }

    fn data(p: Option<&StoredPosition>) -> Option<String> {
        p.and_then(|p| p.token.data().map(str::to_owned))
    }

    #[test]
    fn checkpoint_never_passes_an_unsettled_position() {
        let mut t = Tracker::new(None, None);
        let a = t.receive(pos(1));
        let b = t.receive(pos(2));
        t.settle(b, Settlement::Handled);
        assert_eq!(data(t.settled_seen()), None, "b settled but a is in flight");
        t.settle(a, Settlement::Handled);
        assert_eq!(data(t.settled_seen()).as_deref(), Some("0002"));
        assert_eq!(t.processed_since_save(), 2);
    }

    #[test]
    fn processed_stays_on_the_last_handled_event_while_seen_moves_on_and_back_with_it() {
        let mut t = Tracker::new(Some(pos(0)), Some(pos(0)));
        let settle = |t: &mut Tracker, n: u32, how: Settlement| {
            let ticket = t.receive(pos(n));
            t.settle(ticket, how);
            let cp = t.snapshot("s", bson::DateTime::from_millis(0));
            (
                data(cp.last_seen.as_ref()).unwrap_or_default(),
                data(cp.last_processed.as_ref()).unwrap_or_default(),
            )
        };
        let both = |n: &str| (n.to_owned(), n.to_owned());
        assert_eq!(settle(&mut t, 1, Settlement::Handled), both("0001"));
        assert_eq!(
            settle(&mut t, 2, Settlement::Filtered),
            ("0002".into(), "0001".into())
        );
        assert_eq!(
            settle(&mut t, 3, Settlement::Idle),
            ("0003".into(), "0001".into())
        );
        assert_eq!(settle(&mut t, 4, Settlement::DeadLettered), both("0004"));
        assert_eq!(
            settle(&mut t, 5, Settlement::Unrouted),
            ("0005".into(), "0004".into())
        );
        assert_eq!(settle(&mut t, 6, Settlement::Skipped), both("0006"));
        assert_eq!(data(t.settled_processed()).as_deref(), Some("0006"));
        assert_eq!(data(t.settled_seen()).as_deref(), Some("0006"));
    }

    #[test]
    fn filtered_and_idle_advance_seen_only() {
        let mut t = Tracker::new(None, None);
        let a = t.receive(pos(1));
        t.settle(a, Settlement::Handled);
        let b = t.receive(pos(2));
        t.settle(b, Settlement::Filtered);
        t.receive_idle(pos(3));
        assert_eq!(data(t.settled_processed()).as_deref(), Some("0001"));
        assert_eq!(data(t.settled_seen()).as_deref(), Some("0003"));
    }

    #[test]
    fn an_unrouted_invalidate_moves_both_tokens_past_it() {
        let mut t = Tracker::new(None, None);
        let a = t.receive(pos(1));
        t.settle(a, Settlement::Handled);
        let drop = t.receive(pos(2));
        t.settle(drop, Settlement::Unrouted);
        let invalidate = t.receive(StoredPosition {
            start_after: true,
            ..pos(3)
        });
        t.settle(invalidate, Settlement::Unrouted);
        assert_eq!(data(t.settled_seen()).as_deref(), Some("0003"));
        let processed = t.settled_processed().expect("processed");
        assert_eq!(data(Some(processed)).as_deref(), Some("0003"));
        assert!(processed.start_after, "resumed with startAfter");
    }

    #[test]
    fn idle_waits_for_earlier_in_flight() {
        let mut t = Tracker::new(None, None);
        let a = t.receive(pos(1));
        t.receive_idle(pos(2));
        assert_eq!(t.settled_seen(), None);
        t.settle(a, Settlement::DeadLettered);
        assert_eq!(data(t.settled_seen()).as_deref(), Some("0002"));
    }

    #[test]
    fn abandoned_positions_do_not_block_or_advance() {
        let mut t = Tracker::new(Some(pos(0)), None);
        let _a = t.receive(pos(1));
        t.abandon_unsettled();
        assert_eq!(t.unsettled(), 0);
        assert_eq!(data(t.settled_seen()).as_deref(), Some("0000"));
    }

    #[test]
    fn abandoning_keeps_the_checkpoint_before_the_first_abandoned_position() {
        let mut t = Tracker::new(Some(pos(0)), None);
        let _a = t.receive(pos(1));
        let b = t.receive(pos(2));
        t.settle(b, Settlement::Handled);
        t.abandon_unsettled();
        assert_eq!(t.unsettled(), 0);
        let c = t.receive(pos(1));
        t.settle(c, Settlement::Handled);
        assert_eq!(
            data(t.settled_seen()).as_deref(),
            Some("0001"),
            "#2 settled before the abandoned #1; it must not be checkpointed with it gone"
        );
    }

    #[cfg(feature = "test-util")]
    #[test]
    fn the_classic_bug_switch_checkpoints_on_receipt() {
        let mut t = Tracker::new(None, None).with_checkpoint_on_receipt(true);
        let _a = t.receive(pos(1));
        assert_eq!(data(t.settled_seen()).as_deref(), Some("0001"));
    }

    #[cfg(feature = "test-util")]
    #[test]
    fn the_highest_completed_switch_passes_an_unsettled_position() {
        let mut t = Tracker::new(None, None).with_checkpoint_highest_completed(true);
        let a = t.receive(pos(1));
        let b = t.receive(pos(2));
        t.settle(b, Settlement::Handled);
        assert_eq!(
            data(t.settled_seen()).as_deref(),
            Some("0002"),
            "the bug: #1 is in flight"
        );
        t.settle(a, Settlement::Handled);
        assert_eq!(
            data(t.settled_seen()).as_deref(),
            Some("0002"),
            "never backwards"
        );
    }

    #[test]
    fn a_replay_from_processed_keeps_the_stored_seen_until_it_passes_it() {
        // Stored: processed #1, seen #3 (#2 and #3 were filtered). Replaying from #1:
        let mut t = Tracker::new(Some(pos(3)), Some(pos(1)));
        t.hold_seen_floor();
        let two = t.receive(pos(2));
        t.settle(two, Settlement::Filtered);
        let cp = t.snapshot("s", bson::DateTime::from_millis(0));
        assert_eq!(
            data(cp.last_seen.as_ref()).as_deref(),
            Some("0003"),
            "not back to #2"
        );
        assert_eq!(
            data(t.settled_seen()).as_deref(),
            Some("0002"),
            "resumes in-process from #2"
        );
        let three = t.receive(pos(3));
        t.settle(three, Settlement::Handled);
        let four = t.receive(pos(4));
        t.settle(four, Settlement::Filtered);
        let cp = t.snapshot("s", bson::DateTime::from_millis(0));
        assert_eq!(
            data(cp.last_seen.as_ref()).as_deref(),
            Some("0004"),
            "passed: follows again"
        );
        assert_eq!(data(cp.last_processed.as_ref()).as_deref(), Some("0003"));

        // Nothing to hold when seen is not ahead of processed, or tokens do not compare.
        let mut t = Tracker::new(Some(pos(1)), Some(pos(1)));
        t.hold_seen_floor();
        assert!(t.seen_floor.is_none());
        let opaque = StoredPosition {
            token: ResumeToken::from_document(
                bson::doc! {"_data": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1] }},
            ),
            ..pos(0)
        };
        let mut t = Tracker::new(Some(opaque), Some(pos(1)));
        t.hold_seen_floor();
        assert!(t.seen_floor.is_none());
    }
}
