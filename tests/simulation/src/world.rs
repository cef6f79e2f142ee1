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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bson::{Bson, Document};
use flowwarden::port::PutOutcome;
use flowwarden::port::{
    ChangeCursor, ChangeSource, Checkpoint, CheckpointStore, DeadLetterQuery, DeadLetterRecord,
    DeadLetterStatus, DeadLetterStore, Lease, LeaseStore, SourceError, SourceItem, StartAt,
    StoreError, StoreErrorKind, WatchSpec,
};
use flowwarden::{
    ChangeContext, ErrorAction, HandlerError, HandlerFuture, MemoryBackend, ResumeToken,
    RuntimeHandle, StreamDefinition, StreamHandler,
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
        Arc::new(World {
            state: Mutex::new(WorldState {
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

    fn settle(&mut self, seq: u64, how: Settle) {
        self.settled.entry(seq).or_insert(how);
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
        self.changes.insert(seq, c);
    }

    /// Invariant 2, at the instant a checkpoint is written.
    fn check_checkpoint(&mut self, cp: &Checkpoint) {
        for (label, pos) in [
            ("lastSeen", &cp.last_seen),
            ("lastProcessed", &cp.last_processed),
        ] {
            let Some(seq) = pos.as_ref().and_then(|p| token_seq(&p.token)) else {
                continue;
            };
            let bad = self
                .checked_changes(seq)
                .find(|c| !self.accounted(c))
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
    fn on_success(&mut self, seq: u64, key: Option<i32>) {
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
    fn on_open(
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
    fn history_lost_reported(&self) -> u64 {
        self.history_lost_finished
            + self
                .handles
                .values()
                .filter_map(|h| h.status(crate::STREAM))
                .map(|s| s.counters.history_lost)
                .sum::<u64>()
    }

    /// Turns skipped changes into a gap the runtime reported.
    fn take_gap(&mut self, skipped: Vec<u64>) {
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

    /// The trace prefix of an incarnation (empty in single-instance runs).
    pub(crate) fn tag(&self, inc: u32) -> String {
        self.incs
            .get(&inc)
            .map(|i| i.tag.clone())
            .unwrap_or_default()
    }

    fn ms(&self, at: Instant) -> u128 {
        at.saturating_duration_since(self.t0).as_millis()
    }

    fn lease_label(&self) -> String {
        match &self.lease {
            None => "no lease".into(),
            Some(l) => format!(
                "the lease is held by {} (runtime #{}) with epoch {}, {} at {}ms",
                l.owner,
                l.inc,
                l.epoch,
                if Instant::now() < l.expires {
                    "live until"
                } else {
                    "expired"
                },
                self.ms(l.expires)
            ),
        }
    }

    /// Whether `id` can take a lease within a poll period (not cut off, partitioned, or
    /// slowed down by the harness: a standby waiting for a slow answer does not poll).
    fn reaches_leases(&self, id: &str) -> bool {
        !self.cut_off.contains(id) && !self.slow_lease.contains_key(id)
    }

    /// Whether the lease is live and was acquired by `inc`.
    pub(crate) fn leads(&self, inc: u32) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|l| l.inc == inc && Instant::now() < l.expires)
    }

    /// A lease acquisition, as the store granted it.
    fn on_acquire(&mut self, inc: u32, owner: &str, epoch: i64, ttl: Duration) {
        let now = Instant::now();
        let tag = self.tag(inc);
        self.stats.lease_acquisitions += 1;
        if let Some(prev) = &self.lease {
            if epoch <= prev.epoch {
                let prev = prev.epoch;
                self.violate(
                    Invariant::OneWriterPerEpoch,
                    format!("{tag}the lease was acquired with epoch {epoch}, not above the previous epoch {prev}"),
                );
            }
            if self.lease.as_ref().is_some_and(|p| p.owner != owner) {
                self.stats.takeovers += 1;
            }
        }
        self.log(format!(
            "{tag}acquires the lease: epoch {epoch}, until {}ms",
            self.ms(now + ttl)
        ));
        self.lease = Some(LeaseMirror {
            owner: owner.to_owned(),
            epoch,
            expires: now + ttl,
            inc,
        });
        self.acquired.insert(inc, epoch);
        self.epoch_holder.insert(epoch, inc);
        let t0 = self.t0;
        let mut lines = Vec::new();
        for t in self.takeovers.iter_mut() {
            if !t.satisfied && now <= t.deadline {
                t.satisfied = true;
                lines.push(format!(
                    "takeover after `{}`: lease taken {}ms after it was free",
                    t.what,
                    now.saturating_duration_since(t.free_at.max(t0)).as_millis()
                ));
            }
        }
        for l in lines {
            self.log(l);
        }
    }

    /// Expects a takeover (invariant 10): the lease is free from now or from its expiry, and
    /// `standbys` are polling for it.
    pub(crate) fn expect_takeover(&mut self, what: String, standbys: Vec<u32>, poll: Duration) {
        let now = Instant::now();
        let free_at = self
            .lease
            .as_ref()
            .map(|l| l.expires.max(now))
            .unwrap_or(now);
        let standbys: Vec<u32> = standbys
            .into_iter()
            .filter(|i| {
                self.incs
                    .get(i)
                    .is_some_and(|inc| self.reaches_leases(&inc.id))
            })
            .collect();
        if standbys.is_empty() {
            self.log(format!("{what}: no standby, no takeover expected"));
            return;
        }
        // Timers fire on whole milliseconds: a little slack over the poll period.
        let deadline = free_at + poll + Duration::from_millis(10);
        self.log(format!(
            "{what}: lease free at {}ms; a standby of {standbys:?} must take it by {}ms",
            self.ms(free_at),
            self.ms(deadline)
        ));
        self.takeovers.push(Takeover {
            what,
            free_at,
            deadline,
            standbys,
            satisfied: false,
        });
    }

    /// The holder renewed its lease (a thawed leader): no takeover is due any more.
    fn on_renewed(&mut self, inc: u32) {
        let before = self.takeovers.len();
        self.takeovers.retain(|t| t.satisfied);
        if self.takeovers.len() != before {
            let tag = self.tag(inc);
            self.log(format!(
                "{tag}renewed its lease: no takeover is expected any more"
            ));
        }
    }

    /// Invariant 10, at every observation: an expected takeover whose deadline passed must
    /// have happened, unless every standby it relied on was crashed, stopped or cut off.
    pub(crate) fn check_takeovers(&mut self) {
        let now = Instant::now();
        let pending = std::mem::take(&mut self.takeovers);
        for t in pending {
            if t.satisfied {
                continue;
            }
            if now <= t.deadline {
                self.takeovers.push(t);
                continue;
            }
            let poll = Duration::from_secs(self.settings.leader.map_or(0, |l| l.poll_secs));
            let alive: Vec<u32> = t
                .standbys
                .iter()
                .copied()
                .filter(|i| {
                    self.incs.get(i).is_some_and(|inc| {
                        inc.ended.is_none_or(|e| e > t.deadline)
                            && self.reaches_leases(&inc.id)
                            && self
                                .busy_until
                                .get(i)
                                .is_none_or(|b| *b + poll <= t.deadline)
                    })
                })
                .collect();
            if !alive.is_empty() {
                let label = self.lease_label();
                self.violate(
                    Invariant::Liveness,
                    format!(
                        "after `{}`, the lease was free from {}ms and runtime(s) {alive:?} stood by, yet no instance took it within standby_poll_secs (by {}ms); {label}",
                        t.what,
                        self.ms(t.free_at),
                        self.ms(t.deadline)
                    ),
                );
            }
        }
    }

    /// Invariant 9, when `inc` begins processing an event (its first attempt).
    fn check_consumer(&mut self, inc: u32, seq: u64) {
        if self.leads(inc) {
            return;
        }
        let tag = self.tag(inc);
        let label = self.lease_label();
        let own = self
            .acquired
            .get(&inc)
            .map(|e| format!("its last epoch is {e}"))
            .unwrap_or_else(|| "it never acquired the lease".into());
        self.violate(
            Invariant::OneConsumer,
            format!("{tag}began processing #{seq} without holding the live lease ({own}); {label}"),
        );
    }

    /// Invariants 6, 7 and 8, when the store accepted a checkpoint write of `inc`.
    fn on_checkpoint_accepted(&mut self, inc: u32, cp: &Checkpoint, current: Option<&Lease>) {
        self.stats.checkpoints_saved += 1;
        let seen = cp.last_seen.as_ref().and_then(|p| token_seq(&p.token));
        let processed = cp.last_processed.as_ref().and_then(|p| token_seq(&p.token));
        let tag = self.tag(inc);
        let carried = match (&cp.owner, cp.epoch) {
            (Some(o), Some(e)) => format!("owner {o} epoch {e}"),
            (None, Some(e)) => format!("epoch {e}"),
            _ => "no epoch".into(),
        };
        if self.lease.is_some() || current.is_some() {
            let store = current
                .map(|l| format!("{} with epoch {}", l.owner, l.epoch))
                .unwrap_or_else(|| "nobody".into());
            // 6: it carries the epoch of the lease current at this instant ...
            let current_epoch = current.is_some_and(|l| {
                cp.epoch == Some(l.epoch) && cp.owner.as_deref() == Some(l.owner.as_str())
            });
            if !current_epoch {
                self.violate(
                    Invariant::OneWriterPerEpoch,
                    format!("{tag}an accepted checkpoint write carries {carried}, but the lease current at that instant is held by {store}"),
                );
            }
            if let Some(e) = cp.epoch {
                // ... accepted epochs never decrease, and one epoch has one writer.
                self.check_epoch_writer(inc, e, "checkpoint");
            }
            // 8: the writer still holds the current lease (fencing is by epoch: a write after
            // expiry is fine while nobody else acquired).
            let holds = current.is_some_and(|l| self.acquired.get(&inc) == Some(&l.epoch));
            if !holds {
                let own = self
                    .acquired
                    .get(&inc)
                    .map(|e| format!("acquired epoch {e}"))
                    .unwrap_or_else(|| "never acquired the lease".into());
                self.violate(
                    Invariant::ZombieWrite,
                    format!("{tag}a deposed leader's checkpoint write was accepted (it {own}; the store's lease is held by {store}): seen {}, processed {}", pos_seq(seen), pos_seq(processed)),
                );
            }
        }
        // 7: the stored checkpoint never moves backwards. One allowance: down to what this
        // runtime's source delivered again after moving back (the in-memory `rewind` fault; the
        // runtime processes redeliveries again). A `ProcessedFirst` replay gets none: the
        // runtime keeps the stored lastSeen until the replay passes it.
        if let Some(prev) = self.last_written.clone() {
            let floor = self.rewound_to.get(&inc).copied();
            for (label, before, after) in [
                ("lastSeen", prev.seen, seen),
                ("lastProcessed", prev.processed, processed),
            ] {
                if let Some(b) = before {
                    if after.is_some_and(|a| a < b && floor.is_some_and(|f| f <= a)) {
                        let (a, f) = (after.unwrap_or(0), floor.unwrap_or(0));
                        self.log(format!("{tag}the stored {label} moves back from #{b} to #{a}: the source redelivered from #{f}"));
                    } else if after.is_none_or(|a| a < b) {
                        self.violate(
                            Invariant::CheckpointMovesBackwards,
                            format!(
                                "{tag}the stored checkpoint's {label} moved back from #{b} (written by runtime #{}) to {}",
                                prev.inc,
                                pos_seq(after)
                            ),
                        );
                    }
                }
            }
        }
        self.last_written = Some(Written {
            seen,
            processed,
            inc,
        });
    }

    /// Invariant 6 on an accepted write (checkpoint or claim) of `inc` under epoch `e`:
    /// accepted epochs never decrease, and the writer is the runtime that acquired `e`.
    fn check_epoch_writer(&mut self, inc: u32, e: i64, what: &str) {
        let tag = self.tag(inc);
        if let Some(prev) = self.last_epoch {
            if e < prev {
                self.violate(
                    Invariant::OneWriterPerEpoch,
                    format!("{tag}accepted {what} epochs went back from {prev} to {e}"),
                );
            }
        }
        self.last_epoch = Some(self.last_epoch.map_or(e, |p| p.max(e)));
        let writer = *self.epoch_writer.entry(e).or_insert(inc);
        let holder = self.epoch_holder.get(&e).copied();
        if writer != inc || holder != Some(inc) {
            let holder = holder
                .map(|h| format!("runtime #{h}"))
                .unwrap_or_else(|| "nobody".into());
            self.violate(
                Invariant::OneWriterPerEpoch,
                format!("{tag}{what} accepted under epoch {e}, which was acquired by {holder} and first written by runtime #{writer}: two writers for one epoch"),
            );
        }
    }

    /// Invariants 6 and 8, when the store accepted a checkpoint claim of `inc` (a new
    /// leader fences the checkpoint before it loads it).
    fn on_claim_accepted(
        &mut self,
        inc: u32,
        fence: &flowwarden::port::Fence,
        current: Option<&Lease>,
    ) {
        let tag = self.tag(inc);
        self.log(format!(
            "{tag}claims the checkpoint (epoch {})",
            fence.epoch
        ));
        let store = current
            .map(|l| format!("{} with epoch {}", l.owner, l.epoch))
            .unwrap_or_else(|| "nobody".into());
        if !current.is_some_and(|l| l.epoch == fence.epoch && l.owner == fence.owner) {
            self.violate(
                Invariant::OneWriterPerEpoch,
                format!("{tag}an accepted checkpoint claim carries owner {} epoch {}, but the lease current at that instant is held by {store}", fence.owner, fence.epoch),
            );
        }
        self.check_epoch_writer(inc, fence.epoch, "checkpoint claim");
        if current.is_none_or(|l| self.acquired.get(&inc) != Some(&l.epoch)) {
            self.violate(
                Invariant::ZombieWrite,
                format!("{tag}a deposed leader's checkpoint claim was accepted (the store's lease is held by {store})"),
            );
        }
    }

    /// Invariant 8, when the store accepted a dead letter of `inc`.
    fn on_dead_letter_accepted(
        &mut self,
        inc: u32,
        rec: &DeadLetterRecord,
        current: Option<&Lease>,
    ) {
        if self.lease.is_none() && current.is_none() {
            return;
        }
        let carries = current.is_some_and(|l| {
            rec.epoch == Some(l.epoch) && rec.owner.as_deref() == Some(l.owner.as_str())
        });
        let holds = current.is_some_and(|l| self.acquired.get(&inc) == Some(&l.epoch));
        if !carries || !holds {
            let tag = self.tag(inc);
            let store = current
                .map(|l| format!("{} with epoch {}", l.owner, l.epoch))
                .unwrap_or_else(|| "nobody".into());
            let own = self
                .acquired
                .get(&inc)
                .map(|e| format!("acquired epoch {e}"))
                .unwrap_or_else(|| "never acquired the lease".into());
            self.violate(
                Invariant::ZombieWrite,
                format!(
                    "{tag}a dead letter for #{} carrying epoch {:?} was accepted from a runtime that {own}, while the store's lease is held by {store}",
                    token_seq(&rec.token).unwrap_or(0),
                    rec.epoch
                ),
            );
        }
    }

    /// A write of `inc` was rejected as fenced.
    fn on_fenced(&mut self, inc: u32, what: &str, e: &StoreError) {
        let tag = self.tag(inc);
        self.log(format!("{tag}{what} REJECTED (fenced): {}", e.message));
        if let Some(z) = self.zombies.get_mut(&inc) {
            if !*z {
                *z = true;
                self.stats.zombies_fenced += 1;
            }
        }
    }
}

/// The document type of the simulated stream (a document with `n` of another type does not
/// decode).
#[derive(Debug, Clone, Deserialize)]
pub struct Item {
    /// A number.
    pub n: i64,
    /// A status.
    #[serde(default)]
    pub status: String,
}

thread_local! {
    static PIPELINE: std::cell::RefCell<Vec<Document>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(crate) fn set_pipeline(kind: PipelineKind) {
    let stages = match kind {
        PipelineKind::None => vec![],
        PipelineKind::NoDeletes => {
            vec![bson::doc! {"$match": {"operationType": {"$nin": ["delete"]}}}]
        }
        PipelineKind::NotKey(k) => vec![bson::doc! {"$match": {"documentKey._id": {"$ne": k}}}],
        PipelineKind::NotHidden => {
            vec![bson::doc! {"$match": {"fullDocument.status": {"$ne": "hidden"}}}]
        }
    };
    PIPELINE.with(|p| *p.borrow_mut() = stages);
}

pub(crate) static DEFAULT_DEF: StreamDefinition = StreamDefinition {
    name: crate::STREAM,
    type_name: "SimHandler",
    database: None,
    collection: crate::COLLECTION,
    full_document: flowwarden::FullDocument::Default,
    full_document_before_change: flowwarden::FullDocumentBeforeChange::Off,
    enabled: true,
    auto_start: true,
    checkpoint: flowwarden::CheckpointConfig::DEFAULT,
    retry: flowwarden::RetryConfig::DEFAULT,
    restart: flowwarden::RestartConfig::DEFAULT,
    deployment: flowwarden::Deployment::AllInstances,
    source: flowwarden::SourceLocation {
        file: file!(),
        line: line!(),
    },
};

/// The panic message of injected panics (the harness's panic hook keeps them quiet).
pub(crate) const PANIC_MARK: &str = "flowwarden-simulation: injected handler panic";

/// The simulated handler: behaviour from the schedule, every call recorded.
#[derive(Clone)]
pub(crate) struct SimHandler {
    pub(crate) world: Arc<World>,
    /// The runtime (incarnation) it belongs to.
    pub(crate) inc: u32,
}

enum Outcome {
    Ok,
    Fail(&'static str),
    Panic,
    DeadLetterRequest,
}

fn key_of<T>(ctx: &ChangeContext<T>) -> Option<i32> {
    match ctx.document_key()?.get("_id")? {
        Bson::Int32(k) => Some(*k),
        Bson::Int64(k) => Some(*k as i32),
        _ => None,
    }
}

impl StreamHandler for SimHandler {
    type Document = Item;

    fn definition() -> &'static StreamDefinition {
        &DEFAULT_DEF
    }

    fn pipeline() -> Vec<Document> {
        PIPELINE.with(|p| p.borrow().clone())
    }

    fn filter(&self, ctx: &ChangeContext<Item>) -> bool {
        let mut w = self.world.lock();
        if w.settings.leader.is_some() && ctx.attempt() == 1 {
            if let Some(seq) = token_seq(ctx.resume_token()) {
                w.check_consumer(self.inc, seq);
            }
        }
        let key = key_of(ctx);
        let keep = match w.settings.filter {
            FilterKind::None => true,
            FilterKind::NoUpdatesOf(k) => {
                !(key == Some(k) && ctx.operation_type().as_str() == "update")
            }
            FilterKind::NotQuiet => ctx.document().is_none_or(|d| d.status != "quiet"),
        };
        if !keep {
            if let Some(seq) = token_seq(ctx.resume_token()) {
                let tag = w.tag(self.inc);
                w.log(format!("{tag}filter rejects #{seq}"));
                w.settle(seq, Settle::Filtered);
            }
        }
        keep
    }

    fn handle(self: Arc<Self>, ctx: Arc<ChangeContext<Item>>) -> Option<HandlerFuture> {
        let seq = token_seq(ctx.resume_token())?;
        let op = ctx.operation_type().as_str().to_owned();
        let key = key_of(&ctx);
        let mut w = self.world.lock();
        let inc = self.inc;
        let tag = w.tag(inc);
        if op == "drop" || op == "invalidate" {
            w.log(format!("{tag}unrouted #{seq} {op}"));
            w.settle(seq, Settle::Unrouted);
            return None;
        }
        let call = {
            let c = w.calls.entry(seq).or_insert(0);
            *c += 1;
            *c - 1
        };
        let b = &w.settings.behaviour;
        let h = mix(w.seed
            ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(call).wrapping_mul(0xC2B2_AE3D_27D4_EB4F));
        let latency = if b.max_latency_ms == 0 {
            0
        } else {
            h % (b.max_latency_ms + 1)
        };
        let outcome = if key.is_some_and(|k| b.permanent_keys.contains(&k)) {
            Outcome::Fail("permanent failure")
        } else if call < b.transient_calls && (h >> 20) % 100 < b.transient_pct {
            Outcome::Fail("transient failure")
        } else if call < 2 && (h >> 30) % 100 < b.panic_pct {
            Outcome::Panic
        } else if (h >> 40) % 100 < b.dead_letter_request_pct {
            Outcome::DeadLetterRequest
        } else {
            Outcome::Ok
        };
        w.stats.invocations += 1;
        w.log(format!(
            "{tag}invoke #{seq} {op} k{} attempt {} (call {call}, {latency}ms)",
            key.unwrap_or(-1),
            ctx.attempt()
        ));
        drop(w);
        let world = self.world.clone();
        Some(Box::pin(async move {
            if latency > 0 {
                tokio::time::sleep(Duration::from_millis(latency)).await;
            }
            // A zombie: the handler stalls (a GC pause, a blocked call) past its lease.
            let mut stalled = false;
            loop {
                let until = {
                    let mut w = world.lock();
                    let until = w.stall_until.get(&inc).copied();
                    match until {
                        Some(u) if u > Instant::now() => {
                            let at = u.saturating_duration_since(w.t0).as_millis();
                            w.log(format!("{tag}handler of #{seq} stalls until {at}ms"));
                            Some(u)
                        }
                        _ => None,
                    }
                };
                match until {
                    Some(u) => {
                        stalled = true;
                        tokio::time::sleep_until(u).await;
                    }
                    None => break,
                }
            }
            let mut w = world.lock();
            if stalled {
                let deposed = !w.leads(inc);
                if deposed {
                    w.stats.zombie_wakeups += 1;
                }
                w.log(format!(
                    "{tag}handler of #{seq} wakes{}",
                    if deposed {
                        " (a zombie: this runtime no longer holds the lease)"
                    } else {
                        ""
                    }
                ));
            }
            match outcome {
                Outcome::Ok => {
                    w.log(format!("{tag}success #{seq}"));
                    w.on_success(seq, key);
                    Ok(())
                }
                Outcome::Fail(why) => {
                    w.log(format!("{tag}fail #{seq}: {why}"));
                    Err(HandlerError::msg(format!("{why} of #{seq}")))
                }
                Outcome::DeadLetterRequest => {
                    w.log(format!("{tag}#{seq}: handler asks to dead-letter"));
                    ctx.dead_letter("the simulated handler asked for it");
                    Ok(())
                }
                Outcome::Panic => {
                    w.log(format!("{tag}panic #{seq}"));
                    drop(w);
                    panic!("{PANIC_MARK} #{seq}");
                }
            }
        }))
    }

    fn on_error(&self, error: &HandlerError, _ctx: &ChangeContext<Item>) -> Option<ErrorAction> {
        let w = self.world.lock();
        (w.settings.behaviour.dead_letter_permanent_at_once
            && error.to_string().starts_with("permanent"))
        .then_some(ErrorAction::DeadLetter)
    }
}

/// The in-memory change source, recording opens and deliveries.
pub(crate) struct RecSource {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
}

#[async_trait]
impl ChangeSource for RecSource {
    async fn open(
        &self,
        spec: &WatchSpec,
        at: StartAt,
    ) -> Result<Box<dyn ChangeCursor>, SourceError> {
        let head = self.memory.oplog_head();
        let first = self.memory.oplog_first_retained();
        let result = ChangeSource::open(&self.memory, spec, at.clone()).await;
        let summary = result.as_ref().map(|_| ()).map_err(Clone::clone);
        // Where the cursor starts: a delivery at or before it is the source moving back.
        let start = match &at {
            StartAt::ResumeAfter(t) | StartAt::StartAfter(t) => token_seq(t),
            StartAt::Now => Some(head),
            StartAt::OldestAvailable => Some(first.saturating_sub(1)),
            _ => None,
        };
        let inc = self.inc;
        // One look at the world: the next one judges a gap this open may have taken.
        let mut w = self.world.lock();
        let tag = w.tag(inc);
        w.on_open(&tag, &at, head, first, &summary);
        if let (Ok(_), StartAt::Now | StartAt::OldestAvailable, Some(st)) = (&result, &at, start) {
            let stored = w
                .last_written
                .as_ref()
                .map(|c| c.seen.max(c.processed))
                .unwrap_or_default();
            let delivered = w.max_delivered.get(&inc).copied();
            if stored.max(delivered).is_some_and(|c| st < c) {
                // Only a source that moved back (the rewind fault, past the retained history)
                // makes "now" or "the oldest entry" lie behind what was settled.
                let floor = w.rewound_to.entry(inc).or_insert(st);
                *floor = (*floor).min(st);
            }
        }
        drop(w);
        result.map(|inner| {
            Box::new(RecCursor {
                inner,
                world: self.world.clone(),
                last: start,
                tag,
                inc,
            }) as Box<dyn ChangeCursor>
        })
    }

    fn describe(&self) -> String {
        "simulated in-memory".into()
    }
}

struct RecCursor {
    inner: Box<dyn ChangeCursor>,
    world: Arc<World>,
    /// The last position delivered (at first, where the cursor was opened).
    last: Option<u64>,
    tag: String,
    inc: u32,
}

#[async_trait]
impl ChangeCursor for RecCursor {
    async fn next(&mut self) -> Result<Option<SourceItem>, SourceError> {
        let item = self.inner.next().await;
        let mut w = self.world.lock();
        match &item {
            Ok(Some(SourceItem::Event(raw))) => {
                if let Some(seq) = event_seq(raw) {
                    let invalidate = raw.get_str("operationType") == Ok("invalidate");
                    if !invalidate {
                        *w.deliveries.entry(seq).or_default() += 1;
                    }
                    if !invalidate && self.last.is_some_and(|l| seq <= l) {
                        w.log(format!(
                            "{}source moved back: #{seq} after #{}",
                            self.tag,
                            self.last.unwrap_or(0)
                        ));
                        let floor = w.rewound_to.entry(self.inc).or_insert(seq);
                        *floor = (*floor).min(seq);
                    }
                    if !invalidate {
                        self.last = Some(seq);
                        let max = w.max_delivered.entry(self.inc).or_insert(seq);
                        *max = (*max).max(seq);
                    }
                    w.log(format!(
                        "{}deliver #{seq}{}",
                        self.tag,
                        if invalidate { " invalidate" } else { "" }
                    ));
                }
            }
            Ok(Some(SourceItem::Idle(Some(t)))) => {
                if let Some(seq) = token_seq(t) {
                    if self.last.is_some_and(|l| seq < l) {
                        w.log(format!(
                            "{}source moved back: idle at #{seq} after #{}",
                            self.tag,
                            self.last.unwrap_or(0)
                        ));
                        let floor = w.rewound_to.entry(self.inc).or_insert(seq);
                        *floor = (*floor).min(seq);
                    }
                    self.last = Some(seq);
                }
            }
            Ok(Some(SourceItem::Idle(None))) | Ok(None) => {}
            Err(e) => w.log(format!(
                "{}read error {:?}: {}",
                self.tag, e.kind, e.message
            )),
        }
        item
    }

    fn initial_position(&self) -> Option<ResumeToken> {
        self.inner.initial_position()
    }
}

/// The in-memory checkpoint store of one runtime; checks invariant 2 at every write, and 6, 7
/// and 8 at every write the store accepts.
pub(crate) struct RecCheckpoints {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
}

fn pos_seq(s: Option<u64>) -> String {
    s.map(|s| format!("#{s}")).unwrap_or_else(|| "-".into())
}

fn pos_label(p: &Option<flowwarden::port::StoredPosition>) -> String {
    match p.as_ref().and_then(|p| token_seq(&p.token)) {
        Some(s) => format!("#{s}"),
        None => "-".into(),
    }
}

fn is_fenced<T>(r: &Result<T, StoreError>) -> bool {
    matches!(r, Err(e) if e.kind == StoreErrorKind::Fenced)
}

/// The lease the store holds now (the in-memory store answers at once, without yielding, so
/// it is the lease at the instant the preceding write was accepted or rejected).
async fn current_lease(memory: &MemoryBackend) -> Option<Lease> {
    LeaseStore::current(memory, crate::STREAM)
        .await
        .ok()
        .flatten()
}

#[async_trait]
impl CheckpointStore for RecCheckpoints {
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError> {
        let r = CheckpointStore::load(&self.memory, stream).await;
        let mut w = self.world.lock();
        let tag = w.tag(self.inc);
        match &r {
            Ok(Some(c)) => w.log(format!(
                "{tag}checkpoint load: seen {} processed {}",
                pos_label(&c.last_seen),
                pos_label(&c.last_processed)
            )),
            Ok(None) => w.log(format!("{tag}checkpoint load: none")),
            Err(e) => w.log(format!("{tag}checkpoint load failed: {e}")),
        }
        r
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let sabotage = {
            let mut w = self.world.lock();
            let tag = w.tag(self.inc);
            let epoch = checkpoint
                .epoch
                .map(|e| format!(" (epoch {e})"))
                .unwrap_or_default();
            w.log(format!(
                "{tag}checkpoint save: seen {} processed {}{epoch}",
                pos_label(&checkpoint.last_seen),
                pos_label(&checkpoint.last_processed)
            ));
            w.check_checkpoint(checkpoint);
            w.sabotage
        };
        let mut written = checkpoint.clone();
        if sabotage == Some(Sabotage::UnfencedWrites) {
            written.owner = None;
            written.epoch = None;
        }
        let mut r = CheckpointStore::save(&self.memory, &written).await;
        if sabotage == Some(Sabotage::ForgedEpoch) && is_fenced(&r) {
            if let Some(l) = current_lease(&self.memory).await {
                written.owner = Some(l.owner);
                written.epoch = Some(l.epoch);
                r = CheckpointStore::save(&self.memory, &written).await;
            }
        }
        if sabotage == Some(Sabotage::UnfencedWrites) {
            // Judged as the runtime sent it: the store just did not check the fence.
            written.owner.clone_from(&checkpoint.owner);
            written.epoch = checkpoint.epoch;
        }
        let current = current_lease(&self.memory).await;
        let mut w = self.world.lock();
        match &r {
            Ok(()) => w.on_checkpoint_accepted(self.inc, &written, current.as_ref()),
            Err(e) if e.kind == StoreErrorKind::Fenced => {
                w.stats.fenced_checkpoint_writes += 1;
                w.on_fenced(self.inc, "checkpoint save", e);
            }
            Err(e) => {
                let tag = w.tag(self.inc);
                w.log(format!("{tag}checkpoint save failed: {e}"));
            }
        }
        r
    }

    async fn claim(&self, key: &str, fence: &flowwarden::port::Fence) -> Result<(), StoreError> {
        let r = CheckpointStore::claim(&self.memory, key, fence).await;
        let current = current_lease(&self.memory).await;
        let mut w = self.world.lock();
        match &r {
            Ok(()) => w.on_claim_accepted(self.inc, fence, current.as_ref()),
            Err(e) if e.kind == StoreErrorKind::Fenced => {
                w.stats.fenced_claims += 1;
                w.on_fenced(self.inc, "checkpoint claim", e);
            }
            Err(e) => {
                let tag = w.tag(self.inc);
                w.log(format!("{tag}checkpoint claim failed: {e}"));
            }
        }
        r
    }
}

/// The in-memory dead-letter store, recording what was set aside.
pub(crate) struct RecDeadLetters {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
}

#[async_trait]
impl DeadLetterStore for RecDeadLetters {
    async fn put(&self, record: &DeadLetterRecord) -> Result<PutOutcome, StoreError> {
        let sabotage = self.world.lock().sabotage;
        let mut written = record.clone();
        if sabotage == Some(Sabotage::UnfencedWrites) {
            written.owner = None;
            written.epoch = None;
        }
        let mut r = DeadLetterStore::put(&self.memory, &written).await;
        if sabotage == Some(Sabotage::ForgedEpoch) && is_fenced(&r) {
            if let Some(l) = current_lease(&self.memory).await {
                written.owner = Some(l.owner);
                written.epoch = Some(l.epoch);
                r = DeadLetterStore::put(&self.memory, &written).await;
            }
        }
        if sabotage == Some(Sabotage::UnfencedWrites) {
            written.owner.clone_from(&record.owner);
            written.epoch = record.epoch;
        }
        let current = current_lease(&self.memory).await;
        let mut w = self.world.lock();
        let tag = w.tag(self.inc);
        let seq = token_seq(&record.token);
        match &r {
            Ok(_) => {
                w.on_dead_letter_accepted(self.inc, &written, current.as_ref());
                w.log(format!(
                    "{tag}dead-lettered #{} ({}): {}",
                    seq.unwrap_or(0),
                    record.error_kind,
                    record.error_chain.join(": ")
                ));
                w.stats.dead_letters += 1;
                if let Some(seq) = seq {
                    w.settle(seq, Settle::DeadLettered);
                }
            }
            Err(e) if e.kind == StoreErrorKind::Fenced => {
                w.stats.fenced_dead_letter_writes += 1;
                w.on_fenced(
                    self.inc,
                    &format!("dead letter for #{}", seq.unwrap_or(0)),
                    e,
                );
            }
            Err(e) => w.log(format!(
                "{tag}dead-letter put failed for #{}: {e}",
                seq.unwrap_or(0)
            )),
        }
        r
    }

    async fn list(&self, query: &DeadLetterQuery) -> Result<Vec<DeadLetterRecord>, StoreError> {
        DeadLetterStore::list(&self.memory, query).await
    }

    async fn get(&self, id: &str) -> Result<Option<DeadLetterRecord>, StoreError> {
        DeadLetterStore::get(&self.memory, id).await
    }

    async fn set_status(&self, id: &str, status: DeadLetterStatus) -> Result<bool, StoreError> {
        DeadLetterStore::set_status(&self.memory, id, status).await
    }

    fn max_record_bytes(&self) -> usize {
        DeadLetterStore::max_record_bytes(&self.memory)
    }
}

/// The in-memory lease store of one runtime: keeps the harness's lease mirror exact, cuts off
/// identities (acquisitions fail too, as across a partition), and applies the lease sabotages.
pub(crate) struct RecLeases {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
}

fn unreachable_lease_store() -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        "lease store unreachable (simulated partition)",
    )
}

impl RecLeases {
    /// An injected slow call of `owner`: waits, then tells whether the call fails (a partition)
    /// instead of reaching the store.
    async fn slow(&self, owner: &str, what: &str) -> bool {
        let slow = self.world.lock().slow_lease.get(owner).copied();
        let Some((d, fail)) = slow else { return false };
        if fail {
            self.world
                .lock()
                .busy_until
                .insert(self.inc, Instant::now() + d);
            tokio::time::sleep(d).await;
            let mut w = self.world.lock();
            let tag = w.tag(self.inc);
            w.log(format!(
                "{tag}lease {what}: no answer for {}ms, then an error",
                d.as_millis()
            ));
        }
        fail
    }

    /// An injected slow answer (the store acted at once; the answer arrives `d` later).
    async fn late_answer(&self, owner: &str) {
        let slow = self.world.lock().slow_lease.get(owner).copied();
        if let Some((d, false)) = slow {
            self.world
                .lock()
                .busy_until
                .insert(self.inc, Instant::now() + d);
            tokio::time::sleep(d).await;
        }
    }
}

#[async_trait]
impl LeaseStore for RecLeases {
    async fn try_acquire(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        if self.slow(owner, "acquisition").await {
            return Err(unreachable_lease_store());
        }
        {
            let w = self.world.lock();
            if w.cut_off.contains(owner) {
                return Err(unreachable_lease_store());
            }
            if w.sabotage == Some(Sabotage::NoTakeover)
                && w.lease.as_ref().is_some_and(|l| l.owner != owner)
            {
                return Ok(None);
            }
        }
        let r = LeaseStore::try_acquire(&self.memory, stream, owner, ttl).await;
        if let Ok(Some(l)) = &r {
            self.world.lock().on_acquire(self.inc, owner, l.epoch, ttl);
        }
        self.late_answer(owner).await;
        r
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        if self.slow(&lease.owner, "renewal").await {
            return Err(unreachable_lease_store());
        }
        {
            let w = self.world.lock();
            if w.cut_off.contains(&lease.owner) {
                return Err(unreachable_lease_store());
            }
            if w.sabotage == Some(Sabotage::LyingRenewals) && w.frozen.contains(&lease.owner) {
                // A broken store: the renewal "succeeds" but the lease is not extended.
                let mut fake = lease.clone();
                fake.expires_at = bson::DateTime::from_millis(
                    lease.expires_at.timestamp_millis() + ttl.as_millis() as i64,
                );
                return Ok(Some(fake));
            }
        }
        let r = LeaseStore::renew(&self.memory, lease, ttl).await;
        {
            let mut w = self.world.lock();
            let tag = w.tag(self.inc);
            match &r {
                Ok(Some(l)) => {
                    let now = Instant::now();
                    let renewed = w
                        .lease
                        .as_mut()
                        .filter(|m| m.epoch == l.epoch && m.owner == l.owner)
                        .map(|m| m.expires = now + ttl)
                        .is_some();
                    if renewed {
                        w.on_renewed(self.inc);
                    }
                }
                Ok(None) => w.log(format!("{tag}lease renewal: lost (epoch {})", lease.epoch)),
                Err(e) => w.log(format!(
                    "{tag}lease renewal failed (epoch {}): {}",
                    lease.epoch, e.message
                )),
            }
        }
        self.late_answer(&lease.owner).await;
        r
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let r = LeaseStore::release(&self.memory, lease).await;
        let mut w = self.world.lock();
        let tag = w.tag(self.inc);
        if r.is_ok() {
            let now = Instant::now();
            if let Some(m) = w.lease.as_mut() {
                if m.epoch == lease.epoch && m.owner == lease.owner && m.expires > now {
                    m.expires = now;
                }
            }
            w.log(format!("{tag}releases the lease (epoch {})", lease.epoch));
        }
        r
    }

    async fn current(&self, stream: &str) -> Result<Option<Lease>, StoreError> {
        LeaseStore::current(&self.memory, stream).await
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
