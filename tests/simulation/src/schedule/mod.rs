//! Schedules: everything one simulated run does, generated from a seed.
//!
//! A schedule is plain data (settings plus a list of steps), so it can be printed, shrunk
//! (steps removed) and run again; running the same schedule always gives the same trace.
//!
//! By concept: this module holds the settings and the schedule; `step` the steps (writes,
//! time, faults); `generate` how a seed becomes a schedule; `snapshot` what a seed that
//! starts with an initial snapshot draws on top; `transactional` what a seed whose stream is
//! `transactional = true` draws on top.

mod generate;
mod snapshot;
mod step;
mod transactional;

pub use step::Step;

use flowwarden::{OnHistoryLost, ResumeStrategy};

/// The server-side pipeline of the simulated stream (evaluated by the in-memory backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipelineKind {
    /// No pipeline.
    None,
    /// `{$match: {operationType: {$nin: ["delete"]}}}`.
    NoDeletes,
    /// `{$match: {"documentKey._id": {$ne: key}}}`.
    NotKey(i32),
    /// `{$match: {"fullDocument.status": {$ne: "hidden"}}}` (updates carry no document, so
    /// they pass).
    NotHidden,
}

/// The client-side filter of the simulated stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterKind {
    /// Accepts everything.
    None,
    /// Rejects updates of this key.
    NoUpdatesOf(i32),
    /// Rejects inserts and replaces whose document has `status: "quiet"`.
    NotQuiet,
}

/// How the simulated handler behaves; every decision is a hash of the seed, the event's
/// sequence number and how many times it was invoked before.
#[derive(Debug, Clone, PartialEq)]
pub struct Behaviour {
    /// Upper bound of one invocation's latency (`tokio::time::sleep`), in ms.
    pub max_latency_ms: u64,
    /// Percent of invocations (among the first `transient_calls` of an event) that fail.
    pub transient_pct: u64,
    /// Invocations of one event that may fail transiently.
    pub transient_calls: u32,
    /// Percent of first and second invocations that panic.
    pub panic_pct: u64,
    /// Percent of invocations that ask for the event to be dead-lettered.
    pub dead_letter_request_pct: u64,
    /// Keys whose events always fail (then are dead-lettered).
    pub permanent_keys: Vec<i32>,
    /// `#[on_error]` dead-letters permanent failures at once instead of retrying.
    pub dead_letter_permanent_at_once: bool,
}

/// The `SingleLeader` deployment of a multi-instance schedule: how many runtimes share the
/// backend, and the stream's lease timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderSettings {
    /// Runtimes started at the beginning (2 or 3), each with its own identity.
    pub instances: usize,
    /// `lease_secs`.
    pub lease_secs: u64,
    /// `renew_secs` (at most a third of the lease).
    pub renew_secs: u64,
    /// `standby_poll_secs`.
    pub poll_secs: u64,
}

/// Stream and runtime settings of one schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Document keys are `0..keys`.
    pub keys: i32,
    /// `save_every_n`.
    pub save_every_n: u32,
    /// `save_interval_secs`.
    pub save_interval_secs: u64,
    /// `resume_strategy`.
    pub resume_strategy: ResumeStrategy,
    /// `on_history_lost`.
    pub on_history_lost: OnHistoryLost,
    /// The source cannot tell its oldest retained position (MongoDB without read access to
    /// `local.oplog.rs` and without `serverStatus`): an open at the oldest entry is refused
    /// with `OldestUnknown`, so `ResumeFromOplogStart` must halt `HistoryLost`.
    pub oldest_unknown: bool,
    /// Two runtimes run the stream as `AllInstances` with no configured identity on one
    /// backend that has a lease store (the default configuration's trap: one checkpoint for
    /// both): the checkpoint guard must let exactly one of them consume at a time.
    pub shared_checkpoint: bool,
    /// Retry: attempts in all.
    pub retry_attempts: u32,
    /// Retry: first delay.
    pub retry_delay_ms: u64,
    /// Retry: jitter.
    pub retry_jitter: bool,
    /// Restart: consecutive failures before the stream halts (0 = unlimited).
    pub restart_attempts: u32,
    /// Restart: first delay.
    pub restart_delay_ms: u64,
    /// Runtime: idle read wait.
    pub max_await_ms: u64,
    /// Runtime: batch size.
    pub batch_size: u32,
    /// Runtime: shutdown timeout.
    pub shutdown_timeout_ms: u64,
    /// Runtime: dead-letter write attempts.
    pub dead_letter_write_attempts: u32,
    /// Pipeline.
    pub pipeline: PipelineKind,
    /// Filter.
    pub filter: FilterKind,
    /// Handler behaviour.
    pub behaviour: Behaviour,
    /// `Some`: a multi-instance schedule (`deployment = SingleLeader`); `None`: one runtime
    /// at a time (`AllInstances`, no identity).
    pub leader: Option<LeaderSettings>,
    /// `#[change_stream(concurrency)]`: 1 (serial) or more, with the default bound.
    pub concurrency: u32,
    /// The source asks to be read on the stream's own task (`ReadMode::InProcess`, as the
    /// in-memory backend does) instead of by a reader task of its own (`ReadAhead`, as
    /// MongoDB's cursor does; its events are then handed over still encoded,
    /// `SourceItem::Encoded`, as MongoDB's are).
    pub read_in_process: bool,
    /// `Some`: the stream starts with `start_position = Snapshot` (an initial snapshot of the
    /// documents present before the start); `None`: `start_position = Resume`.
    pub snapshot: Option<SnapshotSettings>,
    /// `Some`: the stream is `transactional = true` (then `concurrency` is 1) on the in-memory
    /// backend's transactions, and its handler writes each event's effect through the
    /// transaction; `None`: an ordinary (at-least-once) stream.
    pub transactional: Option<TransactionalSettings>,
}

/// A `transactional = true` stream: each handled event's effect (its `effects` document's
/// counter, and a running total) commits with the checkpoint past the event. A commit takes
/// virtual time both ways, so that crashes, stops and zombies land while it is in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct TransactionalSettings {
    /// How long a commit's request takes to reach the store, in ms (a crash meanwhile: nothing
    /// is applied).
    pub commit_request_ms: u64,
    /// How long a commit's reply takes to come back, in ms (a crash or an abandoned stop
    /// meanwhile: the commit applied and the runtime does not know).
    pub commit_reply_ms: u64,
    /// The handler also increments a running total in the same transaction (a second write:
    /// the total must equal the sum of the effects, so no commit applied half of them).
    pub second_write: bool,
}

/// An initial snapshot (`start_position = Snapshot`): the scan must take virtual time, so
/// that writes and faults land while it runs. The scan's batch size is the runtime's
/// `batch_size` (small in these schedules), its progress is saved every `save_every_n`
/// documents.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotSettings {
    /// How long each scan batch takes (a `find`'s round trip), in ms.
    pub scan_latency_ms: u64,
    /// The least latency of one snapshot read in the handler, in ms (on top of the
    /// behaviour's).
    pub read_latency_ms: u64,
    /// Virtual time between the backend's creation (and the documents' insertion) and the
    /// first runtime's start, in ms.
    pub start_delay_ms: u64,
    /// Documents present before the start other than `{n: 0, status: "NEW"}`: key, status,
    /// and whether `n` is a string (the document cannot be decoded).
    pub unusual: Vec<(i32, &'static str, bool)>,
}

/// One simulated run: settings, the documents present before the stream starts, and steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The seed it was generated from.
    pub seed: u64,
    /// Settings.
    pub settings: Settings,
    /// Keys inserted before the stream starts (not part of the checked history).
    pub initial_keys: Vec<i32>,
    /// Steps, in order.
    pub steps: Vec<Step>,
}

const STATUSES: [&str; 5] = ["NEW", "PAID", "SHIPPED", "hidden", "quiet"];

/// Percent of single-instance seeds that run two runtimes sharing one checkpoint
/// (`AllInstances`, no configured identity, a lease store: the checkpoint guard).
pub const SHARED_CHECKPOINT_PCT: u64 = 25;

/// Percent of seeds that generate a multi-instance schedule.
pub const MULTI_INSTANCE_PCT: u64 = 30;

/// Percent of seeds that start the stream with an initial snapshot (`start_position =
/// Snapshot`), single- and multi-instance alike.
pub const SNAPSHOT_PCT: u64 = 20;

/// Percent of seeds whose stream is `transactional = true` (single- and multi-instance,
/// snapshot starts included; always `concurrency = 1`).
pub const TRANSACTIONAL_PCT: u64 = 25;

impl Schedule {
    /// Whether this is a multi-instance (`SingleLeader`) schedule.
    pub fn is_multi_instance(&self) -> bool {
        self.settings.leader.is_some()
    }

    /// Whether the stream is `transactional = true`.
    pub fn is_transactional(&self) -> bool {
        self.settings.transactional.is_some()
    }

    /// Whether no step injects a fault.
    pub fn is_fault_free(&self) -> bool {
        !self.steps.iter().any(Step::is_fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic() {
        for seed in 0..50 {
            assert_eq!(Schedule::generate(seed), Schedule::generate(seed));
        }
    }
}
