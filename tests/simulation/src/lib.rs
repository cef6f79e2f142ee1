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
//! See `docs/testing/simulation.md`.

mod rng;
mod run;
mod schedule;
mod world;

use std::collections::BTreeMap;
use std::fmt;

pub use rng::{mix, SplitMix64};
pub use run::{run_schedule, run_seed, shrink, shrink_for};
pub use schedule::{
    Behaviour, FilterKind, LeaderSettings, PipelineKind, Schedule, Settings, SnapshotSettings,
    Step, MULTI_INSTANCE_PCT, SHARED_CHECKPOINT_PCT, SNAPSHOT_PCT,
};
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

/// Counts over one or many runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Schedules run.
    pub seeds: u64,
    /// Schedules without any fault step.
    pub fault_free_seeds: u64,
    /// Changes committed after the stream's start.
    pub changes: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Handler invocations.
    pub invocations: u64,
    /// Successful handler invocations.
    pub successes: u64,
    /// Successful invocations of a change already handled (at-least-once redelivery).
    pub duplicate_successes: u64,
    /// Redeliveries counted by the runtime (`redelivered`).
    pub redeliveries: u64,
    /// Dead letters stored.
    pub dead_letters: u64,
    /// Checkpoints written.
    pub checkpoints_saved: u64,
    /// Cursor opens.
    pub opens: u64,
    /// Runtimes started.
    pub runtimes: u64,
    /// History-lost gaps reported and accepted by policy.
    pub gaps: u64,
    /// Final halts, by reason.
    pub halts: BTreeMap<String, u64>,
    /// Violations found (at most 20 are kept per seed).
    pub violations: u64,
    /// Virtual time simulated, in ms.
    pub virtual_ms: u64,
    /// Multi-instance (`SingleLeader`) schedules run.
    pub multi_instance_seeds: u64,
    /// Schedules run with `concurrency > 1`.
    pub concurrent_seeds: u64,
    /// Lease acquisitions.
    pub lease_acquisitions: u64,
    /// Acquisitions by another identity than the previous holder.
    pub takeovers: u64,
    /// Checkpoint writes rejected as fenced.
    pub fenced_checkpoint_writes: u64,
    /// Dead-letter writes rejected as fenced.
    pub fenced_dead_letter_writes: u64,
    /// Checkpoint claims (a new leader fencing the checkpoint) rejected as fenced.
    pub fenced_claims: u64,
    /// Stalled handlers that woke after their runtime had lost the lease.
    pub zombie_wakeups: u64,
    /// Zombie runtimes that had a write rejected as fenced.
    pub zombies_fenced: u64,
    /// Observations (steps, drain ticks) at which two or more runtimes reported `Running`: a
    /// deposed leader finishing its in-flight event while the new one runs.
    pub running_overlaps: u64,
    /// Violations found, by invariant number (the first 20 of a run are kept in detail).
    pub violations_by_invariant: BTreeMap<u8, u64>,
    /// Opens at the oldest entry the source refused because it cannot tell where that is.
    pub oldest_unknown_refusals: u64,
    /// Drops after which the operator recreated the collection and restarted the stream.
    pub recreated_after_invalidate: u64,
    /// Of those, runs that then read the recreated collection's changes.
    pub recreated_read: u64,
    /// Schedules with two runtimes sharing one checkpoint (the checkpoint guard).
    pub shared_checkpoint_seeds: u64,
    /// Runtimes that halted `SharedCheckpoint` (found the checkpoint held by a live sibling).
    pub shared_checkpoint_halts: u64,
    /// Schedules that start with an initial snapshot.
    pub snapshot_seeds: u64,
    /// Scan batches read (initial snapshots).
    pub scan_batches: u64,
    /// Successful snapshot reads (documents handed to the handler by a scan).
    pub snapshot_reads: u64,
    /// Scans that went on after a stored last `_id` (after a crash, stop or halt mid-scan).
    pub resumed_scans: u64,
    /// Changes committed while a snapshot was unfinished.
    pub changes_during_scan: u64,
    /// Snapshots declared complete.
    pub snapshots_completed: u64,
    /// Runtimes that halted `HistoryLost` during an initial snapshot.
    pub snapshot_history_lost: u64,
}

impl Stats {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Stats) {
        self.seeds += other.seeds;
        self.fault_free_seeds += other.fault_free_seeds;
        self.changes += other.changes;
        for (k, v) in &other.faults {
            *self.faults.entry(k).or_default() += v;
        }
        self.invocations += other.invocations;
        self.successes += other.successes;
        self.duplicate_successes += other.duplicate_successes;
        self.redeliveries += other.redeliveries;
        self.dead_letters += other.dead_letters;
        self.checkpoints_saved += other.checkpoints_saved;
        self.opens += other.opens;
        self.runtimes += other.runtimes;
        self.gaps += other.gaps;
        for (k, v) in &other.halts {
            *self.halts.entry(k.clone()).or_default() += v;
        }
        self.violations += other.violations;
        self.virtual_ms += other.virtual_ms;
        self.multi_instance_seeds += other.multi_instance_seeds;
        self.concurrent_seeds += other.concurrent_seeds;
        self.lease_acquisitions += other.lease_acquisitions;
        self.takeovers += other.takeovers;
        self.fenced_checkpoint_writes += other.fenced_checkpoint_writes;
        self.fenced_dead_letter_writes += other.fenced_dead_letter_writes;
        self.fenced_claims += other.fenced_claims;
        self.zombie_wakeups += other.zombie_wakeups;
        self.zombies_fenced += other.zombies_fenced;
        self.running_overlaps += other.running_overlaps;
        self.oldest_unknown_refusals += other.oldest_unknown_refusals;
        self.recreated_after_invalidate += other.recreated_after_invalidate;
        self.recreated_read += other.recreated_read;
        self.shared_checkpoint_seeds += other.shared_checkpoint_seeds;
        self.shared_checkpoint_halts += other.shared_checkpoint_halts;
        self.snapshot_seeds += other.snapshot_seeds;
        self.scan_batches += other.scan_batches;
        self.snapshot_reads += other.snapshot_reads;
        self.resumed_scans += other.resumed_scans;
        self.changes_during_scan += other.changes_during_scan;
        self.snapshots_completed += other.snapshots_completed;
        self.snapshot_history_lost += other.snapshot_history_lost;
        for (k, v) in &other.violations_by_invariant {
            *self.violations_by_invariant.entry(*k).or_default() += v;
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seeds run:            {} ({} fault-free, {} multi-instance, {} concurrent)",
            self.seeds, self.fault_free_seeds, self.multi_instance_seeds, self.concurrent_seeds
        )?;
        writeln!(f, "changes committed:    {}", self.changes)?;
        let total: u64 = self.faults.values().sum();
        writeln!(f, "faults injected:      {total}")?;
        for (k, v) in &self.faults {
            writeln!(f, "  {k:<26} {v}")?;
        }
        writeln!(
            f,
            "handler invocations:  {} ({} successful)",
            self.invocations, self.successes
        )?;
        writeln!(
            f,
            "redeliveries:         {} counted by the runtime, {} repeated successes",
            self.redeliveries, self.duplicate_successes
        )?;
        writeln!(f, "dead letters:         {}", self.dead_letters)?;
        writeln!(f, "checkpoints written:  {}", self.checkpoints_saved)?;
        writeln!(
            f,
            "runtimes / opens:     {} / {}",
            self.runtimes, self.opens
        )?;
        writeln!(f, "reported gaps:        {}", self.gaps)?;
        writeln!(
            f,
            "oldest unknown:       {} refused opens; drop + recreate + restart: {} ({} read the new collection)",
            self.oldest_unknown_refusals, self.recreated_after_invalidate, self.recreated_read
        )?;
        writeln!(
            f,
            "shared checkpoint:    {} seeds, {} SharedCheckpoint halts",
            self.shared_checkpoint_seeds, self.shared_checkpoint_halts
        )?;
        if self.snapshot_seeds > 0 {
            writeln!(
                f,
                "snapshot starts:      {} seeds, {} scan batches, {} reads handled, {} changes during a scan, {} resumed scans, {} completed, {} HistoryLost halts during a scan",
                self.snapshot_seeds,
                self.scan_batches,
                self.snapshot_reads,
                self.changes_during_scan,
                self.resumed_scans,
                self.snapshots_completed,
                self.snapshot_history_lost
            )?;
        }
        if self.multi_instance_seeds > 0 {
            writeln!(
                f,
                "leases:               {} acquisitions, {} takeovers",
                self.lease_acquisitions, self.takeovers
            )?;
            writeln!(
                f,
                "fenced writes:        {} checkpoints, {} dead letters, {} claims rejected",
                self.fenced_checkpoint_writes, self.fenced_dead_letter_writes, self.fenced_claims
            )?;
            writeln!(
                f,
                "zombies:              {} woke deposed, {} runtimes fenced; {} observations with two runtimes Running",
                self.zombie_wakeups, self.zombies_fenced, self.running_overlaps
            )?;
        }
        if !self.halts.is_empty() {
            let h: Vec<String> = self
                .halts
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            writeln!(f, "final halts:          {}", h.join(", "))?;
        }
        writeln!(
            f,
            "virtual time:         {:.1} h",
            self.virtual_ms as f64 / 3_600_000.0
        )?;
        write!(f, "violations:           {}", self.violations)?;
        if !self.violations_by_invariant.is_empty() {
            let v: Vec<String> = self
                .violations_by_invariant
                .iter()
                .map(|(k, v)| format!("#{k}: {v}"))
                .collect();
            write!(f, " (occurrences by invariant: {})", v.join(", "))?;
        }
        Ok(())
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
