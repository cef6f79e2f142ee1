//! The ground truth of one run and the recording wrappers that feed it.
//!
//! The harness records every committed change (sequence number, key, whether the pipeline
//! rejects it); the handler records every invocation and success; the wrappers around the
//! in-memory backend's source, checkpoint store and dead-letter store record every open,
//! delivery, checkpoint write and dead letter. Invariants 2, 3 and 4 are checked at the
//! instant the runtime acts; 1 and 5 at the end of the run.
//!
//! Multi-instance runs give every runtime (an *incarnation*, numbered from 1) its own
//! wrappers, so each write is attributed to the runtime that made it. A wrapper around the
//! lease store keeps an exact mirror of the stream's lease (holder, epoch, expiry instant:
//! every acquisition, renewal and release goes through it). Invariants 6, 7 and 8 are checked
//! when a store accepts a write, 9 when a runtime begins processing an event, 10 at takeovers
//! and at the end of the run.
//!
//! By concept: this module holds the recorded state and the checks of invariants 1–5;
//! `leadership` the lease mirror and the checks of invariants 6–10; `snapshot` the initial
//! snapshot's ground truth and invariants 12–14; `transactions` the transactional stream's
//! ground truth and invariant 15; `handler` the simulated handler; `recorders` the store and
//! source wrappers that feed the state.

mod handler;
mod keyed;
mod leadership;
mod recorders;
mod snapshot;
mod transactions;

pub use handler::Item;
pub(crate) use handler::{set_pipeline, SimHandler, DEFAULT_DEF, PANIC_MARK};
pub(crate) use recorders::{RecCheckpoints, RecDeadLetters, RecLeases, RecSource, RecTransactions};
pub(crate) use snapshot::{int_key, SnapshotTruth};
pub(crate) use transactions::{counter, Trap, TxnTruth, EFFECTS, TOTALS};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bson::{Bson, Document};
use flowwarden::port::PutOutcome;
use flowwarden::port::{
    ChangeCursor, ChangeSource, Checkpoint, CheckpointStore, DeadLetterQuery, DeadLetterRecord,
    DeadLetterStatus, DeadLetterStore, Lease, LeaseStore, SourceError, SourceItem, StartAt,
    StoreError, StoreErrorKind, TransactionError, TransactionErrorKind, WatchSpec,
};
use flowwarden::{
    ChangeContext, ErrorAction, Halt, HaltReason, HandlerError, HandlerFuture, MemoryBackend,
    ResumeToken, RuntimeHandle, StreamDefinition, StreamHandler, StreamState,
};
use serde::Deserialize;
use tokio::time::Instant;

use crate::rng::mix;
use crate::schedule::{FilterKind, PipelineKind, Settings};
use crate::{Invariant, Sabotage, Stats, Violation};

/// The operation of a committed change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Insert,
    Update,
    Replace,
    Delete,
    Drop,
}

/// One committed change, as the harness wrote it.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) seq: u64,
    pub(crate) key: Option<i32>,
    pub(crate) op: Op,
    pub(crate) status: Option<&'static str>,
    /// The server-side pipeline drops it: it is never delivered.
    pub(crate) pipeline_rejects: bool,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.key {
            Some(k) => match self.status {
                Some(st) => write!(f, "#{} {:?} k{} status={st}", self.seq, self.op, k),
                None => write!(f, "#{} {:?} k{}", self.seq, self.op, k),
            },
            None => write!(f, "#{} {:?}", self.seq, self.op),
        }
    }
}

/// How a change was settled (first settlement only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    Handled,
    DeadLettered,
    Filtered,
    Unrouted,
}

/// The sequence number of an in-memory oplog token (`{_data: "%016X"}`, invalidate `..FF`).
/// Changes an open skipped, waiting for the runtime's history-lost report.
#[derive(Debug)]
pub(crate) struct PendingGap {
    at: String,
    skipped: Vec<u64>,
}

pub(crate) fn token_seq(t: &ResumeToken) -> Option<u64> {
    let d = t.data()?;
    u64::from_str_radix(d.get(..16)?, 16).ok()
}

fn event_seq(raw: &Document) -> Option<u64> {
    let id = raw.get_document("_id").ok()?;
    token_seq(&ResumeToken::from_document(id.clone()))
}

/// Everything recorded during one run.
pub(crate) struct WorldState {
    /// The latest cursor open was refused because the oldest retained entry is unknown (reset
    /// by any open that succeeds): what the final state must then show as HistoryLost.
    pub(crate) last_open_refused_oldest: bool,
    pub(crate) t0: Instant,
    pub(crate) seed: u64,
    pub(crate) settings: Settings,
    pub(crate) changes: BTreeMap<u64, Change>,
    /// Head of the oplog when the stream first opened: changes after it are checked.
    pub(crate) start_seq: Option<u64>,
    pub(crate) settled: BTreeMap<u64, Settle>,
    /// Changes inside a gap the runtime reported (history lost, accepted by policy).
    pub(crate) gap: BTreeSet<u64>,
    /// Per change: successful invocations.
    pub(crate) successes: BTreeMap<u64, u32>,
    /// Per change: how many times a cursor delivered it (the only source of repeats).
    pub(crate) deliveries: BTreeMap<u64, u32>,
    pub(crate) calls: BTreeMap<u64, u32>,
    /// Handles of the runtimes that are up, by incarnation.
    pub(crate) handles: BTreeMap<u32, RuntimeHandle>,
    /// History-lost counts of finished runtimes, plus how many were turned into gaps.
    pub(crate) history_lost_finished: u64,
    pub(crate) history_lost_accounted: u64,
    /// An open at `now` or at the oldest entry that skipped unsettled changes, judged at the
    /// next look at the world: the runtime counts an accepted gap once the cursor is open.
    pub(crate) pending_gap: Option<PendingGap>,
    pub(crate) trace: Vec<String>,
    pub(crate) violations: Vec<Violation>,
    pub(crate) stats: Stats,
    /// Harness-level sabotage (to prove the checkers of invariants 6–10).
    pub(crate) sabotage: Option<Sabotage>,
    /// Every runtime started, by incarnation.
    pub(crate) incs: BTreeMap<u32, Incarnation>,
    /// The stream's lease as the store holds it (multi-instance runs).
    pub(crate) lease: Option<LeaseMirror>,
    /// Per incarnation: the epoch of its last acquisition.
    pub(crate) acquired: BTreeMap<u32, i64>,
    /// Per epoch: the incarnation that acquired it.
    pub(crate) epoch_holder: BTreeMap<i64, u32>,
    /// Per epoch: the first incarnation whose checkpoint write under it was accepted.
    pub(crate) epoch_writer: BTreeMap<i64, u32>,
    /// The last checkpoint write the store accepted.
    pub(crate) last_written: Option<Written>,
    /// The epoch of the last accepted checkpoint write or claim.
    pub(crate) last_epoch: Option<i64>,
    /// Identities whose renewals the harness froze.
    pub(crate) frozen: BTreeSet<String>,
    /// Identities the lease-store wrapper cuts off (acquisitions fail too).
    pub(crate) cut_off: BTreeSet<String>,
    /// Identities whose lease-store calls are slow: how long, and whether they then fail.
    pub(crate) slow_lease: BTreeMap<String, (Duration, bool)>,
    /// Per incarnation: when its last injected slow lease call answers (it cannot poll
    /// before).
    pub(crate) busy_until: BTreeMap<u32, Instant>,
    /// Per incarnation: its handler stalls until then (a zombie).
    pub(crate) stall_until: BTreeMap<u32, Instant>,
    /// Incarnations made zombies (stalled), and whether a write of theirs was fenced since.
    pub(crate) zombies: BTreeMap<u32, bool>,
    /// Takeovers the harness waits for (invariant 10).
    pub(crate) takeovers: Vec<Takeover>,
    /// Per incarnation: the lowest position its source delivered again after moving back
    /// (before what that cursor had delivered or opened at). Its checkpoint may move back
    /// down to there: the runtime processes redeliveries again and tokens are opaque to it.
    pub(crate) rewound_to: BTreeMap<u32, u64>,
    /// Per incarnation: the highest position its cursors delivered.
    pub(crate) max_delivered: BTreeMap<u32, u64>,
    /// Per incarnation: events whose processing began and that are not settled, with their
    /// key (`None`: a barrier). Invariant 11.
    pub(crate) in_flight: BTreeMap<u32, BTreeMap<u64, Option<i32>>>,
    /// Per incarnation: events its current cursor delivered that are not settled.
    pub(crate) received_open: BTreeMap<u32, BTreeSet<u64>>,
    /// Events a runtime received and left unsettled at a graceful shutdown or a re-open.
    pub(crate) left_unsettled: BTreeSet<u64>,
    /// The initial snapshot (invariants 12–14).
    pub(crate) snap: SnapshotTruth,
    /// The transactional stream (invariant 15).
    pub(crate) txn: TxnTruth,
}

/// One runtime started by the harness.
#[derive(Debug, Clone)]
pub(crate) struct Incarnation {
    /// Its instance identity (empty in single-instance runs: not configured).
    pub(crate) id: String,
    /// Prefix of its trace lines (empty in single-instance runs).
    pub(crate) tag: String,
    /// When the harness crashed or stopped it.
    pub(crate) ended: Option<Instant>,
}

/// The stream's lease, mirrored exactly from the lease-store wrapper.
#[derive(Debug, Clone)]
pub(crate) struct LeaseMirror {
    pub(crate) owner: String,
    pub(crate) epoch: i64,
    /// By the store's clock (Tokio's, virtual): live while `now < expires`.
    pub(crate) expires: Instant,
    /// The incarnation that acquired it.
    pub(crate) inc: u32,
}

/// What the last accepted checkpoint write held.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    pub(crate) seen: Option<u64>,
    pub(crate) processed: Option<u64>,
    pub(crate) inc: u32,
}

/// A takeover the harness expects: the lease is free (or will be, at expiry) and standbys
/// are polling, so one of them must take it within `standby_poll_secs`.
#[derive(Debug, Clone)]
pub(crate) struct Takeover {
    pub(crate) what: String,
    pub(crate) free_at: Instant,
    pub(crate) deadline: Instant,
    pub(crate) standbys: Vec<u32>,
    pub(crate) satisfied: bool,
}

/// Shared, lockable run state.
pub(crate) struct World {
    state: Mutex<WorldState>,
}

impl World {
    pub(crate) fn new(seed: u64, settings: Settings) -> Arc<World> {
        let snapshot = settings.snapshot.is_some();
        let transactional = settings.transactional.is_some();
        Arc::new(World {
            state: Mutex::new(WorldState {
                last_open_refused_oldest: false,
                t0: Instant::now(),
                seed,
                settings,
                changes: BTreeMap::new(),
                start_seq: None,
                settled: BTreeMap::new(),
                gap: BTreeSet::new(),
                successes: BTreeMap::new(),
                deliveries: BTreeMap::new(),
                calls: BTreeMap::new(),
                handles: BTreeMap::new(),
                history_lost_finished: 0,
                history_lost_accounted: 0,
                pending_gap: None,
                trace: Vec::new(),
                violations: Vec::new(),
                stats: Stats::default(),
                sabotage: None,
                incs: BTreeMap::new(),
                lease: None,
                acquired: BTreeMap::new(),
                epoch_holder: BTreeMap::new(),
                epoch_writer: BTreeMap::new(),
                last_written: None,
                last_epoch: None,
                frozen: BTreeSet::new(),
                cut_off: BTreeSet::new(),
                slow_lease: BTreeMap::new(),
                busy_until: BTreeMap::new(),
                stall_until: BTreeMap::new(),
                zombies: BTreeMap::new(),
                takeovers: Vec::new(),
                rewound_to: BTreeMap::new(),
                max_delivered: BTreeMap::new(),
                in_flight: BTreeMap::new(),
                received_open: BTreeMap::new(),
                left_unsettled: BTreeSet::new(),
                snap: SnapshotTruth::new(snapshot),
                txn: TxnTruth::new(transactional),
            }),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, WorldState> {
        let mut state = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        state.judge_pending_gap();
        state
    }
}

impl WorldState {
    /// Appends a line to the trace, stamped with virtual time.
    pub(crate) fn log(&mut self, msg: impl AsRef<str>) {
        let ms = self.t0.elapsed().as_millis();
        self.trace.push(format!("{ms:>8}ms  {}", msg.as_ref()));
    }

    pub(crate) fn violate(&mut self, invariant: Invariant, message: String) {
        self.log(format!("!! VIOLATION {invariant}: {message}"));
        *self
            .stats
            .violations_by_invariant
            .entry(invariant.number())
            .or_default() += 1;
        let at = self.trace.len() - 1;
        if self.violations.len() < 20 {
            self.violations.push(Violation {
                invariant,
                seed: self.seed,
                message,
                trace_index: at,
            });
        }
    }

    /// Whether a change is settled, or excused by a reported gap, or never delivered.
    pub(crate) fn accounted(&self, c: &Change) -> bool {
        c.pipeline_rejects || self.settled.contains_key(&c.seq) || self.gap.contains(&c.seq)
    }

    /// Checked changes (after the start position) in `..=upto`.
    pub(crate) fn checked_changes(&self, upto: u64) -> impl Iterator<Item = &Change> {
        let lo = self.start_seq.map(|s| s + 1).unwrap_or(u64::MAX);
        self.changes
            .range(lo..)
            .take_while(move |(s, _)| **s <= upto)
            .map(|(_, c)| c)
    }

    pub(crate) fn settle(&mut self, seq: u64, how: Settle) {
        self.settled.entry(seq).or_insert(how);
        self.end_in_flight(seq);
    }

    /// Records a committed change.
    pub(crate) fn commit(
        &mut self,
        seq: u64,
        key: Option<i32>,
        op: Op,
        status: Option<&'static str>,
    ) {
        let pipeline_rejects = match self.settings.pipeline {
            PipelineKind::None => false,
            PipelineKind::NoDeletes => op == Op::Delete,
            PipelineKind::NotKey(k) => key == Some(k),
            PipelineKind::NotHidden => {
                matches!(op, Op::Insert | Op::Replace) && status == Some("hidden")
            }
        };
        let c = Change {
            seq,
            key,
            op,
            status,
            pipeline_rejects,
        };
        self.log(format!(
            "commit {c}{}",
            if pipeline_rejects {
                " (pipeline rejects)"
            } else {
                ""
            }
        ));
        self.stats.changes += 1;
        if self.snap.on && !self.snap.completed && self.start_seq.is_some() {
            self.stats.changes_during_scan += 1;
        }
        if status == Some("hidden") {
            if let Some(k) = key {
                self.snap.hidden.insert(k);
            }
        }
        self.changes.insert(seq, c);
    }

    /// Invariant 2, at the instant a checkpoint is written.
    pub(crate) fn check_checkpoint(&mut self, cp: &Checkpoint) {
        self.check_checkpoint_excusing(cp, None);
    }

    /// Invariant 2 on a checkpoint that may pass `excused` (the event of a commit that was not
    /// applied: its checkpoint passes only that event).
    pub(crate) fn check_checkpoint_excusing(&mut self, cp: &Checkpoint, excused: Option<u64>) {
        for (label, pos) in [
            ("lastSeen", &cp.last_seen),
            ("lastProcessed", &cp.last_processed),
        ] {
            let Some(seq) = pos.as_ref().and_then(|p| token_seq(&p.token)) else {
                continue;
            };
            let bad = self
                .checked_changes(seq)
                .find(|c| !self.accounted(c) && Some(c.seq) != excused)
                .map(|c| c.to_string());
            if let Some(c) = bad {
                self.violate(
                    Invariant::CheckpointPassesUnsettled,
                    format!("checkpoint written with {label} = #{seq}, which passes change {c}: not settled at the time of writing"),
                );
            }
        }
    }

    /// Invariants 3 and 4, at the instant a handler succeeds.
    pub(crate) fn on_success(&mut self, seq: u64, key: Option<i32>) {
        self.stats.successes += 1;
        let before = self.successes.get(&seq).copied().unwrap_or(0);
        let delivered = self.deliveries.get(&seq).copied().unwrap_or(0);
        if before > 0 {
            self.stats.duplicate_successes += 1;
        }
        if before + 1 > delivered {
            self.violate(
                Invariant::DuplicateWithoutFault,
                format!("change #{seq} handled successfully {} time(s) but delivered by the source only {delivered} time(s)", before + 1),
            );
        }
        if before == 0 {
            if let Some(k) = key {
                let earlier = self
                    .checked_changes(seq.saturating_sub(1))
                    .find(|c| c.key == Some(k) && c.seq < seq && !self.accounted(c))
                    .map(|c| c.to_string());
                if let Some(c) = earlier {
                    self.violate(
                        Invariant::PerKeyOrder,
                        format!("change #{seq} of k{k} handled before the earlier change {c} of the same key was settled"),
                    );
                }
            }
        }
        *self.successes.entry(seq).or_default() += 1;
        self.settle(seq, Settle::Handled);
    }

    /// A cursor was opened at `at`; a loud history-lost restart (counter risen) turns
    /// the unsettled changes it skips into a reported gap.
    pub(crate) fn on_open(
        &mut self,
        tag: &str,
        at: &StartAt,
        head: u64,
        first: u64,
        result: &Result<(), SourceError>,
    ) {
        self.stats.opens += 1;
        match result {
            Err(e) => self.log(format!(
                "{tag}open {at} -> error {:?}: {}",
                e.kind, e.message
            )),
            Ok(()) => {
                self.log(format!("{tag}open {at} (oplog #{first}..=#{head})"));
                let upper = match at {
                    StartAt::Now => head,
                    StartAt::OldestAvailable => first.saturating_sub(1),
                    _ => return,
                };
                if self.start_seq.is_none() {
                    self.start_seq = Some(head);
                    self.log(format!("stream start position: after #{head}"));
                    return;
                }
                let skipped: Vec<u64> = self
                    .checked_changes(upper)
                    .filter(|c| !self.accounted(c))
                    .map(|c| c.seq)
                    .collect();
                if self.history_lost_reported() > self.history_lost_accounted {
                    self.take_gap(skipped);
                } else if !skipped.is_empty() {
                    self.pending_gap = Some(PendingGap {
                        at: at.to_string(),
                        skipped,
                    });
                }
            }
        }
    }

    /// History-lost reports so far: of finished runtimes and of the ones that are up.
    pub(crate) fn history_lost_reported(&self) -> u64 {
        self.history_lost_finished
            + self
                .handles
                .values()
                .filter_map(|h| h.status(crate::STREAM))
                .map(|s| s.counters.history_lost)
                .sum::<u64>()
    }

    /// Turns skipped changes into a gap the runtime reported.
    pub(crate) fn take_gap(&mut self, skipped: Vec<u64>) {
        self.history_lost_accounted = self.history_lost_reported();
        self.stats.gaps += 1;
        self.log(format!(
            "reported gap (history lost, counted): {} change(s) skipped: {skipped:?}",
            skipped.len()
        ));
        self.gap.extend(skipped);
    }

    /// Judges an open that skipped changes: the runtime had its chance to report the gap
    /// (it counts one right after the cursor opens, before it touches anything else).
    pub(crate) fn judge_pending_gap(&mut self) {
        let Some(pending) = self.pending_gap.take() else {
            return;
        };
        if self.history_lost_reported() > self.history_lost_accounted {
            self.take_gap(pending.skipped);
        } else {
            self.violate(
                Invariant::NoSilentLoss,
                format!(
                    "the stream re-opened at `{}` without reporting lost history; unsettled changes {:?} are skipped silently",
                    pending.at, pending.skipped
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Schedule;

    /// Two changes after the start, then an open at `now` that skips both.
    fn world_after_a_skipping_open() -> Arc<World> {
        let mut settings = Schedule::generate(1).settings;
        settings.pipeline = PipelineKind::None;
        let world = World::new(1, settings);
        let mut w = world.lock();
        w.on_open("", &StartAt::Now, 0, 1, &Ok(()));
        w.commit(1, Some(0), Op::Insert, None);
        w.commit(2, Some(1), Op::Insert, None);
        w.on_open("", &StartAt::Now, 2, 1, &Ok(()));
        drop(w);
        world
    }

    #[test]
    fn a_skip_the_runtime_never_reports_is_silent_loss_at_the_next_look() {
        let world = world_after_a_skipping_open();
        let w = world.lock();
        assert!(w.gap.is_empty());
        assert_eq!(w.violations.len(), 1, "{:?}", w.trace);
        assert_eq!(w.violations[0].invariant, Invariant::NoSilentLoss);
        assert!(w.violations[0].message.contains("[1, 2]"));
    }

    #[test]
    fn a_skip_the_runtime_reports_after_the_open_is_a_gap() {
        let world = world_after_a_skipping_open();
        // What a runtime that finished after counting the gap leaves behind.
        world.state.lock().expect("world").history_lost_finished = 1;
        let w = world.lock();
        assert!(w.violations.is_empty(), "{:?}", w.trace);
        assert_eq!(w.gap.iter().copied().collect::<Vec<_>>(), vec![1, 2]);
    }
}
