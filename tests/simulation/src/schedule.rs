//! Schedules: everything one simulated run does, generated from a seed.
//!
//! A schedule is plain data (settings plus a list of steps), so it can be printed, shrunk
//! (steps removed) and run again; running the same schedule always gives the same trace.

use std::fmt;

use flowwarden::{OnHistoryLost, ResumeStrategy};

use crate::rng::SplitMix64;

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
}

/// One step of a schedule.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Insert `{_id: key, n, status}` (`bad`: `n` is a string, so the document cannot be
    /// decoded into the stream's type).
    Insert {
        /// Key.
        key: i32,
        /// Value.
        n: i64,
        /// Status field.
        status: &'static str,
        /// Undecodable.
        bad: bool,
    },
    /// `$set: {n}` on `key`.
    Update {
        /// Key.
        key: i32,
        /// New value.
        n: i64,
    },
    /// Replace `key`'s document.
    Replace {
        /// Key.
        key: i32,
        /// Value.
        n: i64,
        /// Status field.
        status: &'static str,
        /// Undecodable.
        bad: bool,
    },
    /// Delete `key`.
    Delete {
        /// Key.
        key: i32,
    },
    /// Drop the watched collection (at most once, as the last write).
    Drop,
    /// Let virtual time pass.
    Advance(u64),
    /// The next `n` cursor reads fail with a resumable error.
    ReadErrors(usize),
    /// Kill every open cursor.
    CloseStreams,
    /// Open cursors move back by `n` entries (the source redelivers).
    Rewind(u64),
    /// Every cursor read is delayed (`None` clears).
    ReadDelay(Option<u64>),
    /// Keep only the last `n` oplog entries.
    Truncate(usize),
    /// The next `n` checkpoint writes fail.
    CheckpointSaveFailures(u32),
    /// The next `n` checkpoint loads fail.
    CheckpointLoadFailures(u32),
    /// Every checkpoint write is slow (`None` clears).
    CheckpointSaveDelay(Option<u64>),
    /// The next `n` dead-letter writes fail.
    DeadLetterPutFailures(u32),
    /// The next `n` cursor opens fail with a resumable error.
    OpenFailures(usize),
    /// Process crash: stream tasks aborted where they stand, nothing flushed.
    Crash,
    /// Start a new runtime (after a crash) on the same backend.
    Restart,
    /// Graceful shutdown, then a new runtime.
    GracefulRestart,
}

impl Step {
    /// Whether this step injects a fault (anything but writes, time, and graceful restarts).
    pub fn is_fault(&self) -> bool {
        !matches!(
            self,
            Step::Insert { .. }
                | Step::Update { .. }
                | Step::Replace { .. }
                | Step::Delete { .. }
                | Step::Drop
                | Step::Advance(_)
                | Step::GracefulRestart
        )
    }

    /// The fault's kind, for the summary.
    pub fn fault_kind(&self) -> Option<&'static str> {
        Some(match self {
            Step::ReadErrors(_) => "read_errors",
            Step::CloseStreams => "close_streams",
            Step::Rewind(_) => "rewind",
            Step::ReadDelay(_) => "read_delay",
            Step::Truncate(_) => "truncate_history",
            Step::CheckpointSaveFailures(_) => "checkpoint_save_failures",
            Step::CheckpointLoadFailures(_) => "checkpoint_load_failures",
            Step::CheckpointSaveDelay(_) => "checkpoint_save_delay",
            Step::DeadLetterPutFailures(_) => "dead_letter_put_failures",
            Step::OpenFailures(_) => "open_failures",
            Step::Crash => "crash",
            Step::Restart => "restart",
            _ => return None,
        })
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Insert {
                key,
                n,
                status,
                bad,
            } => {
                write!(
                    f,
                    "insert k{key} n={n} status={status}{}",
                    if *bad { " (undecodable)" } else { "" }
                )
            }
            Step::Update { key, n } => write!(f, "update k{key} n={n}"),
            Step::Replace {
                key,
                n,
                status,
                bad,
            } => {
                write!(
                    f,
                    "replace k{key} n={n} status={status}{}",
                    if *bad { " (undecodable)" } else { "" }
                )
            }
            Step::Delete { key } => write!(f, "delete k{key}"),
            Step::Drop => f.write_str("drop collection"),
            Step::Advance(ms) => write!(f, "advance {ms}ms"),
            Step::ReadErrors(n) => write!(f, "FAULT fail next {n} reads"),
            Step::CloseStreams => f.write_str("FAULT close streams"),
            Step::Rewind(n) => write!(f, "FAULT rewind cursors by {n}"),
            Step::ReadDelay(d) => write!(f, "FAULT read delay {d:?}ms"),
            Step::Truncate(n) => write!(f, "FAULT truncate history keep {n}"),
            Step::CheckpointSaveFailures(n) => write!(f, "FAULT fail next {n} checkpoint saves"),
            Step::CheckpointLoadFailures(n) => write!(f, "FAULT fail next {n} checkpoint loads"),
            Step::CheckpointSaveDelay(d) => write!(f, "FAULT checkpoint save delay {d:?}ms"),
            Step::DeadLetterPutFailures(n) => write!(f, "FAULT fail next {n} dead-letter puts"),
            Step::OpenFailures(n) => write!(f, "FAULT fail next {n} opens"),
            Step::Crash => f.write_str("CRASH"),
            Step::Restart => f.write_str("RESTART"),
            Step::GracefulRestart => f.write_str("graceful restart"),
        }
    }
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

impl Schedule {
    /// The schedule of `seed`.
    pub fn generate(seed: u64) -> Schedule {
        let mut r = SplitMix64::new(seed);
        let keys = r.range(2, 6) as i32;
        let pipeline = match r.below(5) {
            0 => PipelineKind::NoDeletes,
            1 => PipelineKind::NotKey(r.below(keys as u64) as i32),
            2 => PipelineKind::NotHidden,
            _ => PipelineKind::None,
        };
        let filter = match r.below(4) {
            0 => FilterKind::NoUpdatesOf(r.below(keys as u64) as i32),
            1 => FilterKind::NotQuiet,
            _ => FilterKind::None,
        };
        let mut permanent_keys = Vec::new();
        if r.chance(30) {
            permanent_keys.push(r.below(keys as u64) as i32);
        }
        let behaviour = Behaviour {
            max_latency_ms: r.pick(&[0, 0, 20, 200, 1_500, 4_000]),
            transient_pct: r.pick(&[0, 0, 10, 30, 60]),
            transient_calls: r.range(1, 4) as u32,
            panic_pct: r.pick(&[0, 0, 5, 20]),
            dead_letter_request_pct: r.pick(&[0, 0, 0, 5]),
            permanent_keys,
            dead_letter_permanent_at_once: r.chance(30),
        };
        let settings = Settings {
            keys,
            save_every_n: r.range(1, 20) as u32,
            save_interval_secs: r.range(0, 10),
            resume_strategy: if r.chance(50) {
                ResumeStrategy::ProcessedFirst
            } else {
                ResumeStrategy::SeenFirst
            },
            on_history_lost: r.pick(&[
                OnHistoryLost::Fail,
                OnHistoryLost::ResumeFromOplogStart,
                OnHistoryLost::ResumeFromNow,
            ]),
            retry_attempts: r.range(1, 4) as u32,
            retry_delay_ms: r.pick(&[10, 100, 500, 2_000]),
            retry_jitter: r.chance(50),
            restart_attempts: r.pick(&[0, 0, 4, 8]),
            restart_delay_ms: r.pick(&[50, 200, 1_000]),
            max_await_ms: r.pick(&[100, 500, 1_000]),
            batch_size: r.pick(&[1, 2, 8, 256]),
            shutdown_timeout_ms: r.pick(&[500, 2_000, 10_000]),
            dead_letter_write_attempts: r.range(1, 4) as u32,
            pipeline,
            filter,
            behaviour,
        };

        let mut present: Vec<bool> = (0..keys).map(|_| r.chance(60)).collect();
        let initial_keys = (0..keys).filter(|k| present[*k as usize]).collect();

        let fault_free = r.chance(15);
        let fault_pct = r.range(8, 30);
        let writes = r.range(12, 40);
        let mut steps = Vec::new();
        let mut down_for: Option<u64> = None;
        let mut dead_letter_failures = 0u32;
        let status = |r: &mut SplitMix64| r.pick(&STATUSES);
        for i in 0..writes {
            let n = i as i64 + 1;
            let key = r.below(keys as u64) as i32;
            let bad = r.chance(5);
            let step = if present[key as usize] {
                match r.below(4) {
                    0 | 1 => Step::Update { key, n },
                    2 => Step::Replace {
                        key,
                        n,
                        status: status(&mut r),
                        bad,
                    },
                    _ => {
                        present[key as usize] = false;
                        Step::Delete { key }
                    }
                }
            } else {
                present[key as usize] = true;
                Step::Insert {
                    key,
                    n,
                    status: status(&mut r),
                    bad,
                }
            };
            steps.push(step);
            if r.chance(50) {
                steps.push(Step::Advance(r.pick(&[0, 5, 20, 100, 400, 1_500, 4_000])));
            }
            if let Some(left) = down_for.as_mut() {
                if *left == 0 {
                    if r.chance(30) {
                        steps.push(Step::Truncate(r.range(0, 4) as usize));
                    }
                    steps.push(Step::Advance(r.range(0, 3_000)));
                    steps.push(Step::Restart);
                    down_for = None;
                } else {
                    *left -= 1;
                }
                continue;
            }
            if fault_free {
                if r.chance(5) {
                    steps.push(Step::GracefulRestart);
                }
                continue;
            }
            if !r.chance(fault_pct) {
                continue;
            }
            let fault = match r.below(15) {
                0 | 1 => Step::ReadErrors(r.range(1, 3) as usize),
                2 => Step::CloseStreams,
                3..=5 => {
                    // Often while a handler is in flight: a short advance, then the crash.
                    steps.push(Step::Advance(r.pick(&[0, 1, 10, 50, 300])));
                    down_for = Some(r.range(0, 3));
                    Step::Crash
                }
                6 => Step::Rewind(r.range(1, 4)),
                7 => Step::ReadDelay(if r.chance(60) {
                    Some(r.pick(&[10, 200, 1_500]))
                } else {
                    None
                }),
                8 => Step::Truncate(r.range(0, 6) as usize),
                9 => Step::CheckpointSaveFailures(r.range(1, 4) as u32),
                10 => Step::CheckpointLoadFailures(r.range(1, 3) as u32),
                11 => Step::CheckpointSaveDelay(if r.chance(60) {
                    Some(r.pick(&[50, 1_000, 8_000]))
                } else {
                    None
                }),
                12 if dead_letter_failures < 8 => {
                    // At most 8 queued in all, so the drain's operator restarts outlast them.
                    let n = (r.range(1, 6) as u32).min(8 - dead_letter_failures);
                    dead_letter_failures += n;
                    Step::DeadLetterPutFailures(n)
                }
                13 => Step::OpenFailures(r.range(1, 3) as usize),
                _ => Step::GracefulRestart,
            };
            steps.push(fault);
        }
        if down_for.is_some() {
            steps.push(Step::Restart);
        }
        if !fault_free && r.chance(8) {
            steps.push(Step::Advance(r.pick(&[0, 100, 2_000])));
            steps.push(Step::Drop);
        }
        Schedule {
            seed,
            settings,
            initial_keys,
            steps,
        }
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
