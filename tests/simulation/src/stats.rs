//! The counts a run (or many) reports: what the schedules did (changes, faults, invocations,
//! takeovers, scans, ...) and how many violations of each invariant were found.

use std::collections::BTreeMap;
use std::fmt;

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
    /// Schedules whose source is read on the stream's own task (`ReadMode::InProcess`).
    pub in_process_read_seeds: u64,
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
    /// Schedules whose stream is `transactional = true`.
    pub transactional_seeds: u64,
    /// Transactions begun (one per handler attempt and per transient rerun).
    pub transactions_begun: u64,
    /// Commits the store applied (each settles one handled event with its checkpoint).
    pub commits_applied: u64,
    /// Transient reruns of a whole transaction (the runtime's `transactions_retried`).
    pub transient_reruns: u64,
    /// Commits whose outcome the runtime was told is unknown (the reply lost after the commit
    /// applied: the stream halts `TransactionOutcomeUnknown` and is restarted).
    pub unknown_outcomes: u64,
    /// Commits refused because their checkpoint was fenced (a deposed leader's transaction).
    pub fenced_commits: u64,
    /// Commits that failed otherwise (transient, unavailable, rejected): nothing applied.
    pub failed_commits: u64,
    /// Commits applied whose reply never reached the runtime (it crashed, or a stop abandoned
    /// the attempt, while the reply was in flight).
    pub unanswered_commits: u64,
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
        self.in_process_read_seeds += other.in_process_read_seeds;
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
        self.transactional_seeds += other.transactional_seeds;
        self.transactions_begun += other.transactions_begun;
        self.commits_applied += other.commits_applied;
        self.transient_reruns += other.transient_reruns;
        self.unknown_outcomes += other.unknown_outcomes;
        self.fenced_commits += other.fenced_commits;
        self.failed_commits += other.failed_commits;
        self.unanswered_commits += other.unanswered_commits;
        for (k, v) in &other.violations_by_invariant {
            *self.violations_by_invariant.entry(*k).or_default() += v;
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seeds run:            {} ({} fault-free, {} multi-instance, {} concurrent, {} read in process)",
            self.seeds,
            self.fault_free_seeds,
            self.multi_instance_seeds,
            self.concurrent_seeds,
            self.in_process_read_seeds
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
        if self.transactional_seeds > 0 {
            writeln!(
                f,
                "transactional:        {} seeds, {} transactions begun, {} commits applied ({} unanswered), {} transient reruns, {} unknown outcomes, {} fenced and {} failed commits",
                self.transactional_seeds,
                self.transactions_begun,
                self.commits_applied,
                self.unanswered_commits,
                self.transient_reruns,
                self.unknown_outcomes,
                self.fenced_commits,
                self.failed_commits
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
