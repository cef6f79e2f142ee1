//! Deterministic fault simulation of the flowwarden runtime.
//!
//! Each seed becomes a [`Schedule`]: stream settings, a handler behaviour, a workload of
//! writes over a few keys, and faults at random points. [`run_schedule`] runs it on the REAL
//! runtime (supervisor, router, retry, dead letters, checkpoints) over the in-memory backend,
//! on a current-thread tokio runtime with paused (virtual) time, so waiting is free and the
//! run is deterministic: the same schedule gives the same trace every time. The harness
//! records the ground truth and checks five invariants:
//!
//! 1. no silent loss: every change after the start position is handled, dead-lettered,
//!    filtered, or inside a gap the runtime reported loudly;
//! 2. a checkpoint never passes a change that was not settled when it was written;
//! 3. per key, successful handling follows source order (redeliveries repeat, never reorder);
//! 4. no duplicate without a redelivery cause; a fault-free schedule handles each change once;
//! 5. the state is truthful: history lost under `Fail` shows `HistoryLost`, never `Running`.
//!
//! About 30% of the seeds run 2–3 runtimes on the same backend, with the stream deployed as
//! `SingleLeader`, under leader crashes, graceful stops, frozen renewals, partitions from the
//! lease store and zombies (a leader stalled past its lease). They also check:
//!
//! 6. one writer per epoch, epochs only grow: an accepted checkpoint write carries the epoch of
//!    the lease current at that instant, acquired by the runtime that wrote it; accepted epochs
//!    never decrease;
//! 7. the stored checkpoint never moves backwards (checked on every run);
//! 8. no zombie writes: no checkpoint or dead-letter write of a runtime that no longer holds
//!    the current lease is accepted;
//! 9. one consumer at a time: a runtime begins processing an event only while it holds the
//!    live lease;
//! 10. liveness: a free lease is taken by a standby within `standby_poll_secs`; after the
//!     drain exactly one instance leads and the others stand by.
//!
//! About 20% of the seeds start the stream with an initial snapshot (`start_position =
//! Snapshot`), with documents present before the start, writes and faults while the scan
//! runs. They also check:
//!
//! 12. no silent loss for snapshot starts: the projection the handler keeps (from its
//!     successful snapshot reads and changes) equals the collection at the end, except for
//!     keys the pipeline, the filter or a dead letter account for, unless the stream halted
//!     loudly;
//! 13. a resumed scan continues after the stored last `_id` (never from the beginning), the
//!     stored start never changes, and no cursor opens at "now" (or anywhere but the recorded
//!     start) while a snapshot is unfinished;
//! 14. history lost during the scan halts `HistoryLost` (and only then); a snapshot is
//!     declared complete only after the recorded start was confirmed retained.
//!
//! About 25% of the seeds run the stream as `transactional = true` on the in-memory backend's
//! transactions (one event at a time; the handler writes each event's effect through the
//! transaction), with commit failures injected and crashes while a commit is in flight. They
//! also check:
//!
//! 15. effects exactly once: no event's effect is ever applied twice, every effect belongs to
//!     an event the source delivered, and every event the stream handled has its effect
//!     applied exactly once.
//!
//! See `docs/testing/simulation.md`.

mod rng;
mod run;
mod schedule;
mod stats;
mod world;

use std::fmt;

pub use rng::{mix, SplitMix64};
pub use run::{run_schedule, run_seed, shrink, shrink_for};
pub use schedule::{
    Behaviour, FilterKind, LeaderSettings, PipelineKind, Schedule, Settings, SnapshotSettings,
    Step, TransactionalSettings, MULTI_INSTANCE_PCT, SHARED_CHECKPOINT_PCT, SNAPSHOT_PCT,
    TRANSACTIONAL_PCT,
};
pub use stats::Stats;
pub use world::Item;

/// The simulated stream's name.
pub const STREAM: &str = "sim";
/// The simulated stream's collection.
pub const COLLECTION: &str = "orders";

/// Options of a simulation run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimOptions {
    /// Runs the runtime with the test-only switch that reintroduces the classic bug (a
    /// position counted as done on receipt). The simulation must then find violations.
    pub checkpoint_on_receipt: bool,
    /// Runs the runtime with the test-only switch that checkpoints the highest completed event
    /// instead of the settled prefix (the naive concurrent consumer). With `concurrency > 1`
    /// the simulation must find violations.
    pub checkpoint_highest_completed: bool,
    /// Runs the runtime with the test-only switch that runs concurrent events without regard
    /// to their keys or barriers. With `concurrency > 1` the simulation must find violations.
    pub unkeyed_concurrency: bool,
    /// Runs the runtime with the test-only switch that takes an initial snapshot's start
    /// position again after the scan (the changes made during the scan are lost). On snapshot
    /// seeds the simulation must then find violations.
    pub snapshot_start_after_scan: bool,
    /// Runs the runtime with the test-only switch that restarts an unfinished snapshot's scan
    /// from the first document instead of after the stored last `_id`.
    pub snapshot_rescan_from_zero: bool,
    /// Runs the runtime with the test-only switch that commits a transactional event's writes
    /// without the checkpoint and writes the checkpoint afterwards as a plain write (the
    /// non-atomic design). On transactional seeds the simulation must then find an effect
    /// applied twice (invariant 15).
    pub checkpoint_outside_transaction: bool,
    /// Runs the runtime with the test-only switch that keeps writing plain checkpoints after a
    /// transaction whose outcome is unknown (no `Progress::freeze`). On transactional seeds
    /// the simulation must then find the checkpoint moving back (invariant 7) and an effect
    /// applied twice (15).
    pub no_freeze_after_unknown_outcome: bool,
    /// Breaks the harness's store wrappers on purpose, to prove the checkers of invariants
    /// 6–10 (the runtime is untouched).
    pub sabotage: Option<Sabotage>,
}

/// Harness-level sabotage: a broken store around a correct runtime. Each must make the
/// simulation report violations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sabotage {
    /// The checkpoint and dead-letter wrappers strip owner and epoch before the store, so
    /// writes are not fenced: a zombie's writes go through (invariants 6, 7, 8).
    UnfencedWrites,
    /// A write rejected as fenced is retried with the current lease's owner and epoch
    /// forged in (two writers under one epoch: invariants 6 and 8).
    ForgedEpoch,
    /// Renewals of a frozen identity "succeed" without reaching the store: the leader keeps
    /// consuming after its lease expired and another instance took over (invariant 9).
    LyingRenewals,
    /// Only the last holder may acquire the lease: nobody takes over (invariant 10).
    NoTakeover,
    /// A source that cannot tell its oldest retained position opens at "now" instead of
    /// refusing (the MongoDB adapter's old behaviour without access to `local.oplog.rs`):
    /// the retained history is skipped while the runtime believes it restarted at the oldest
    /// entry (invariant 1).
    OldestBecomesNow,
    /// A source that cannot tell its oldest retained position reports it as a transient
    /// error: the runtime re-opens with backoff instead of halting `HistoryLost`, and never
    /// says that history is lost (invariant 5).
    OldestUnknownAsTransient,
    /// The checkpoint store keeps its previous position instead of a settled invalidate's
    /// (`startAfter`) token: a restart after the collection was dropped and recreated replays
    /// the invalidate and halts again, and the recreated collection is never read
    /// (invariant 1).
    ForgetInvalidate,
    /// The lease store grants every instance the checkpoint guard of a shared checkpoint, as
    /// if there were none: two runtimes consume under one checkpoint (invariant 9).
    GuardForEveryone,
}

impl Sabotage {
    /// Every sabotage.
    pub const ALL: [Sabotage; 8] = [
        Sabotage::UnfencedWrites,
        Sabotage::ForgedEpoch,
        Sabotage::LyingRenewals,
        Sabotage::NoTakeover,
        Sabotage::OldestBecomesNow,
        Sabotage::OldestUnknownAsTransient,
        Sabotage::ForgetInvalidate,
        Sabotage::GuardForEveryone,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Sabotage::UnfencedWrites => "unfenced-writes",
            Sabotage::ForgedEpoch => "forged-epoch",
            Sabotage::LyingRenewals => "lying-renewals",
            Sabotage::NoTakeover => "no-takeover",
            Sabotage::OldestBecomesNow => "oldest-becomes-now",
            Sabotage::OldestUnknownAsTransient => "oldest-unknown-as-transient",
            Sabotage::ForgetInvalidate => "forget-invalidate",
            Sabotage::GuardForEveryone => "guard-for-everyone",
        }
    }

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<Sabotage> {
        Sabotage::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// The invariants the harness checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Invariant {
    /// 1: every change is handled, dead-lettered, filtered, or in a loudly reported gap.
    NoSilentLoss,
    /// 2: a persisted checkpoint never passes a change that was not settled.
    CheckpointPassesUnsettled,
    /// 3: per key, successful handling follows source order.
    PerKeyOrder,
    /// 4: no duplicate without a redelivery; none at all without faults.
    DuplicateWithoutFault,
    /// 5: the reported state is truthful.
    TruthfulState,
    /// 6: an accepted checkpoint carries the current lease's epoch, acquired by its writer;
    /// accepted epochs (and lease epochs) only grow.
    OneWriterPerEpoch,
    /// 7: the stored checkpoint never moves backwards.
    CheckpointMovesBackwards,
    /// 8: no write of a deposed leader (checkpoint or dead letter) is accepted.
    ZombieWrite,
    /// 9: a runtime begins processing an event only while it holds the live lease.
    OneConsumer,
    /// 10: a free lease is taken by a standby within the poll period; after the drain one
    /// instance leads and the others stand by.
    Liveness,
    /// 11: within a runtime, events of one key are processed one at a time, and a barrier
    /// (no document key) alone.
    KeyedScheduling,
    /// 12: a snapshot start loses nothing: the handler's projection equals the collection
    /// (unless the stream halted loudly).
    SnapshotNoSilentLoss,
    /// 13: a resumed scan goes on after the stored last `_id`; the stream never starts
    /// anywhere but at the recorded start.
    SnapshotResume,
    /// 14: history lost during the scan halts `HistoryLost`, and only lost history does.
    SnapshotHistoryLost,
    /// 15: a transactional stream applies each event's effect at most once, and every event
    /// it handled exactly once.
    EffectsExactlyOnce,
}

impl Invariant {
    /// The invariant's number in the issue.
    pub fn number(self) -> u8 {
        match self {
            Invariant::NoSilentLoss => 1,
            Invariant::CheckpointPassesUnsettled => 2,
            Invariant::PerKeyOrder => 3,
            Invariant::DuplicateWithoutFault => 4,
            Invariant::TruthfulState => 5,
            Invariant::OneWriterPerEpoch => 6,
            Invariant::CheckpointMovesBackwards => 7,
            Invariant::ZombieWrite => 8,
            Invariant::OneConsumer => 9,
            Invariant::Liveness => 10,
            Invariant::KeyedScheduling => 11,
            Invariant::SnapshotNoSilentLoss => 12,
            Invariant::SnapshotResume => 13,
            Invariant::SnapshotHistoryLost => 14,
            Invariant::EffectsExactlyOnce => 15,
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Invariant::NoSilentLoss => "no silent loss",
            Invariant::CheckpointPassesUnsettled => "checkpoint never passes an unsettled change",
            Invariant::PerKeyOrder => "per-key source order",
            Invariant::DuplicateWithoutFault => "no duplicate beyond redelivery",
            Invariant::TruthfulState => "truthful state",
            Invariant::OneWriterPerEpoch => "one writer per epoch, epochs only grow",
            Invariant::CheckpointMovesBackwards => "the stored checkpoint never moves backwards",
            Invariant::ZombieWrite => "no zombie writes",
            Invariant::OneConsumer => "one consumer at a time",
            Invariant::Liveness => "liveness: takeover and one leader after the drain",
            Invariant::KeyedScheduling => {
                "keyed scheduling: one event per key at a time, barriers alone"
            }
            Invariant::SnapshotNoSilentLoss => {
                "snapshot start: no silent loss, the projection equals the collection"
            }
            Invariant::SnapshotResume => {
                "snapshot start: the scan resumes after the stored _id, the stream at the recorded start"
            }
            Invariant::SnapshotHistoryLost => {
                "snapshot start: history lost during the scan halts HistoryLost"
            }
            Invariant::EffectsExactlyOnce => "transactional stream: effects exactly once",
        };
        write!(f, "invariant {} ({name})", self.number())
    }
}

/// One invariant violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which invariant.
    pub invariant: Invariant,
    /// The schedule's seed.
    pub seed: u64,
    /// What was observed.
    pub message: String,
    /// Index of the violation's line in the run's trace.
    pub trace_index: usize,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} violated (seed {}): {}",
            self.invariant, self.seed, self.message
        )
    }
}

/// A simulation could not be set up (not an invariant violation).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The tokio runtime could not be built.
    #[error("cannot build the tokio runtime: {0}")]
    Tokio(#[from] std::io::Error),
    /// The flowwarden runtime refused to start.
    #[error(transparent)]
    Startup(#[from] flowwarden::StartupError),
    /// The stream never opened its first cursor.
    #[error("seed {0}: the stream did not open its first cursor within 60 s of virtual time")]
    NeverStarted(u64),
}

/// The result of one schedule.
#[derive(Debug, Clone)]
pub struct SeedOutcome {
    /// The schedule's seed.
    pub seed: u64,
    /// Violations found (empty when every invariant held).
    pub violations: Vec<Violation>,
    /// Counts of this run.
    pub stats: Stats,
    /// The full trace: schedule steps and runtime events, stamped with virtual time.
    pub trace: Vec<String>,
}

impl SeedOutcome {
    /// The trace as one string.
    pub fn trace_text(&self) -> String {
        self.trace.join("\n")
    }

    /// A report of the violations: the schedule, and the trace around the first violation.
    pub fn report(&self, schedule: &Schedule, context: usize) -> String {
        let mut out = String::new();
        for v in &self.violations {
            out.push_str(&format!("{v}\n"));
        }
        out.push_str(&format!(
            "replay: cargo run --release -p flowwarden-simulation --bin simulate -- --replay {}\n",
            self.seed
        ));
        out.push_str(&format!("settings: {:?}\n", schedule.settings));
        out.push_str(&format!(
            "initial keys: {:?}\nsteps ({}):\n",
            schedule.initial_keys,
            schedule.steps.len()
        ));
        for (i, s) in schedule.steps.iter().enumerate() {
            out.push_str(&format!("  {i:>3}. {s}\n"));
        }
        if let Some(v) = self.violations.first() {
            let lo = v.trace_index.saturating_sub(context);
            let hi = (v.trace_index + 4).min(self.trace.len());
            out.push_str(&format!(
                "trace lines {lo}..{hi} of {}:\n",
                self.trace.len()
            ));
            for line in &self.trace[lo..hi] {
                out.push_str(&format!("  {line}\n"));
            }
        }
        out
    }
}
