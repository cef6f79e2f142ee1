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
//! See `docs/testing/simulation.md`.

mod rng;
mod run;
mod schedule;
mod world;

use std::collections::BTreeMap;
use std::fmt;

pub use rng::{mix, SplitMix64};
pub use run::{run_schedule, run_seed, shrink};
pub use schedule::{Behaviour, FilterKind, PipelineKind, Schedule, Settings, Step};
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
    /// Violations found.
    pub violations: u64,
    /// Virtual time simulated, in ms.
    pub virtual_ms: u64,
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
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seeds run:            {} ({} fault-free)",
            self.seeds, self.fault_free_seeds
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
        write!(f, "violations:           {}", self.violations)
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
