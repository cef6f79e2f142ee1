//! Schedules: everything one simulated run does, generated from a seed.
//!
//! A schedule is plain data (settings plus a list of steps), so it can be printed, shrunk
//! (steps removed) and run again; running the same schedule always gives the same trace.

use std::fmt;

use flowwarden::{OnHistoryLost, ResumeStrategy};

use crate::rng::{mix, SplitMix64};

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
    /// Multi-instance: crash the runtime of the current lease holder (nothing flushed, the
    /// lease is not released: it expires).
    CrashLeader,
    /// Multi-instance: crash a runtime that is not the lease holder.
    CrashStandby,
    /// Multi-instance: start a runtime in the first slot that is down, with the slot's
    /// identity or a new one.
    StartInstance {
        /// A new identity (the old one's lease, if live, must expire first).
        new_identity: bool,
    },
    /// Multi-instance: graceful shutdown of the lease holder (`leader`) or of a standby; the
    /// slot stays down until a later `StartInstance`.
    StopInstance {
        /// The lease holder, else a standby.
        leader: bool,
    },
    /// Multi-instance: graceful shutdown of the lease holder or of a standby, then a new
    /// runtime with the same identity.
    RestartInstance {
        /// The lease holder, else a standby.
        leader: bool,
    },
    /// Multi-instance: `RuntimeHandle::restart` of the stream (not the runtime) on the lease
    /// holder or on a standby: the stream stops (the leader flushes and releases) and starts
    /// again as a standby.
    RestartStream {
        /// The lease holder, else a standby.
        leader: bool,
    },
    /// Multi-instance: the lease holder's renewals fail (`freeze_lease_renewals`); it must
    /// stop before its lease expires. `cut_off`: its acquisitions fail too (a partition,
    /// injected by the harness's lease-store wrapper), so another instance takes over.
    FreezeLeader {
        /// Acquisitions fail too.
        cut_off: bool,
    },
    /// Multi-instance: every lease-store call of the lease holder's identity (acquire, renew)
    /// takes `ms` to answer (injected by the harness's lease-store wrapper): a slow round trip
    /// (`fail = false`: the store acted at once, the answer is late) or a partition where the
    /// driver waits for its timeout (`fail = true`: the call fails after `ms` and never reaches
    /// the store).
    SlowLeaseCalls {
        /// How long each call takes.
        ms: u64,
        /// The calls fail (a partition) rather than succeed late.
        fail: bool,
    },
    /// Multi-instance: every frozen, cut-off or slowed identity can reach the lease store
    /// again.
    ThawAll,
    /// Multi-instance: the lease holder's renewals are frozen and its handler stalls (its
    /// in-flight invocation, else its next one) for `stall_ms`: past its lease, a standby
    /// takes over; when the zombie wakes, its writes must be rejected.
    Zombie {
        /// How long the handler stalls.
        stall_ms: u64,
    },
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
                | Step::StartInstance { .. }
                | Step::StopInstance { .. }
                | Step::RestartInstance { .. }
                | Step::RestartStream { .. }
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
            Step::CrashLeader => "crash_leader",
            Step::CrashStandby => "crash_standby",
            Step::FreezeLeader { cut_off: false } => "freeze_leader_renewals",
            Step::FreezeLeader { cut_off: true } => "cut_off_leader",
            Step::SlowLeaseCalls { fail: false, .. } => "slow_lease_calls",
            Step::SlowLeaseCalls { fail: true, .. } => "hanging_lease_calls",
            Step::ThawAll => "thaw",
            Step::Zombie { .. } => "zombie",
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
            Step::CrashLeader => f.write_str("CRASH the leader"),
            Step::CrashStandby => f.write_str("CRASH a standby"),
            Step::StartInstance { new_identity } => write!(
                f,
                "start an instance{}",
                if *new_identity { " (new identity)" } else { "" }
            ),
            Step::StopInstance { leader } => write!(
                f,
                "graceful stop of {}",
                if *leader { "the leader" } else { "a standby" }
            ),
            Step::RestartInstance { leader } => write!(
                f,
                "graceful restart of {}",
                if *leader { "the leader" } else { "a standby" }
            ),
            Step::RestartStream { leader } => write!(
                f,
                "restart the stream on {}",
                if *leader { "the leader" } else { "a standby" }
            ),
            Step::FreezeLeader { cut_off } => write!(
                f,
                "FAULT freeze the leader's lease renewals{}",
                if *cut_off { " and cut it off" } else { "" }
            ),
            Step::SlowLeaseCalls { ms, fail } => write!(
                f,
                "FAULT the leader's lease calls take {ms}ms{}",
                if *fail { " and fail" } else { "" }
            ),
            Step::ThawAll => f.write_str("FAULT thaw every frozen identity"),
            Step::Zombie { stall_ms } => write!(
                f,
                "FAULT zombie: the leader's renewals freeze and its handler stalls {stall_ms}ms"
            ),
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

/// Percent of single-instance seeds that run two runtimes sharing one checkpoint
/// (`AllInstances`, no configured identity, a lease store: the checkpoint guard).
pub const SHARED_CHECKPOINT_PCT: u64 = 25;

/// Percent of seeds that generate a multi-instance schedule.
pub const MULTI_INSTANCE_PCT: u64 = 30;

/// One write over `keys` keys: an insert of an absent key, else an update, a replace or a
/// delete (the order of draws is part of every seed's schedule: do not change it).
fn write_step(r: &mut SplitMix64, keys: i32, present: &mut [bool], n: i64) -> Step {
    let key = r.below(keys as u64) as i32;
    let bad = r.chance(5);
    if present[key as usize] {
        match r.below(4) {
            0 | 1 => Step::Update { key, n },
            2 => Step::Replace {
                key,
                n,
                status: r.pick(&STATUSES),
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
            status: r.pick(&STATUSES),
            bad,
        }
    }
}

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
        let mut settings = Settings {
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
            leader: None,
            oldest_unknown: false,
            shared_checkpoint: false,
            concurrency: 1,
        };
        // From its own generator, so every other draw of the seed stays what it was.
        let mut conc = SplitMix64::new(mix(seed ^ 0x636F_6E63_7572_2121));
        settings.concurrency = conc.pick(&[1, 1, 2, 8, 64]);
        // Drawn from its own generator, so every other draw of the seed stays what it was.
        let mut oldest = SplitMix64::new(mix(seed ^ 0x6F6C_6465_7374_3F21));
        settings.oldest_unknown =
            settings.on_history_lost == OnHistoryLost::ResumeFromOplogStart && oldest.chance(40);

        let mut present: Vec<bool> = (0..keys).map(|_| r.chance(60)).collect();
        let initial_keys = (0..keys).filter(|k| present[*k as usize]).collect();

        // Multi-instance or not is drawn from a side generator, so the single-instance
        // schedules are exactly the ones of the seeds before multi-instance runs existed.
        let mut side = SplitMix64::new(mix(seed ^ 0x6C65_6164_6572_7321));
        if side.chance(MULTI_INSTANCE_PCT) {
            return Self::generate_multi(seed, r, side, settings, present, initial_keys);
        }
        // Also from its own generator: the steps stay those of the single-instance schedule.
        let mut shared = SplitMix64::new(mix(seed ^ 0x7368_6172_6564_2163));
        settings.shared_checkpoint = shared.chance(SHARED_CHECKPOINT_PCT);

        let fault_free = r.chance(15);
        let fault_pct = r.range(8, 30);
        let writes = r.range(12, 40);
        let mut steps = Vec::new();
        let mut down_for: Option<u64> = None;
        let mut dead_letter_failures = 0u32;
        for i in 0..writes {
            steps.push(write_step(&mut r, keys, &mut present, i as i64 + 1));
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

    /// A multi-instance schedule: 2–3 runtimes run the stream as `SingleLeader` with seeded
    /// lease timing; besides the single-instance faults, leader crashes, standby crashes,
    /// graceful stops and restarts of either, frozen renewals (with or without a partition
    /// from the lease store) and zombies.
    fn generate_multi(
        seed: u64,
        mut r: SplitMix64,
        mut side: SplitMix64,
        mut settings: Settings,
        mut present: Vec<bool>,
        initial_keys: Vec<i32>,
    ) -> Schedule {
        let lease_secs = side.range(3, 30);
        let leader = LeaderSettings {
            instances: side.range(2, 3) as usize,
            lease_secs,
            renew_secs: side.range(1, (lease_secs / 3).max(1)),
            poll_secs: side.range(1, 5),
        };
        settings.leader = Some(leader);
        // A deposed leader keeps its in-flight handler only while its stop waits for it: some
        // long shutdown timeouts, so that zombies outlive their lease.
        settings.shutdown_timeout_ms = side.pick(&[500, 10_000, 60_000, 60_000]);
        let lease_ms = lease_secs * 1_000;
        let poll_ms = leader.poll_secs * 1_000;
        let keys = settings.keys;

        let fault_free = r.chance(15);
        let fault_pct = r.range(8, 30);
        let writes = r.range(12, 40);
        let mut steps = Vec::new();
        // Countdowns (in writes) until a stopped or crashed slot is started again.
        let mut down: Vec<u64> = Vec::new();
        let mut thaw_in: Option<u64> = None;
        let mut dead_letter_failures = 0u32;
        for i in 0..writes {
            steps.push(write_step(&mut r, keys, &mut present, i as i64 + 1));
            if r.chance(50) {
                steps.push(Step::Advance(r.pick(&[
                    0,
                    5,
                    20,
                    100,
                    400,
                    1_500,
                    4_000,
                    lease_ms / 2,
                    lease_ms + poll_ms,
                ])));
            }
            let mut k = 0;
            while k < down.len() {
                if down[k] == 0 {
                    if r.chance(20) {
                        steps.push(Step::Truncate(r.range(0, 4) as usize));
                    }
                    steps.push(Step::Advance(r.range(0, lease_ms)));
                    steps.push(Step::StartInstance {
                        new_identity: r.chance(40),
                    });
                    down.remove(k);
                } else {
                    down[k] -= 1;
                    k += 1;
                }
            }
            if let Some(left) = thaw_in.as_mut() {
                if *left == 0 {
                    steps.push(Step::ThawAll);
                    thaw_in = None;
                } else {
                    *left -= 1;
                }
            }
            if fault_free {
                if r.chance(8) {
                    let leader = r.chance(60);
                    match r.below(3) {
                        0 if down.is_empty() => {
                            steps.push(Step::StopInstance { leader });
                            down.push(r.range(0, 3));
                        }
                        1 => steps.push(Step::RestartStream { leader }),
                        _ => steps.push(Step::RestartInstance { leader }),
                    }
                }
                continue;
            }
            if !r.chance(fault_pct) {
                continue;
            }
            let fault = match r.below(23) {
                0 | 1 => Step::ReadErrors(r.range(1, 3) as usize),
                2 => Step::CloseStreams,
                20 => Step::RestartStream {
                    leader: r.chance(60),
                },
                21 | 22 => {
                    if thaw_in.is_none() && r.chance(70) {
                        thaw_in = Some(r.range(1, 6));
                    }
                    Step::SlowLeaseCalls {
                        ms: r.pick(&[200, 1_000, lease_ms / 2, lease_ms, 30_000]),
                        fail: r.chance(50),
                    }
                }
                3..=5 => {
                    // Often while a handler is in flight.
                    steps.push(Step::Advance(r.pick(&[0, 1, 10, 50, 300])));
                    down.push(r.range(0, 3));
                    Step::CrashLeader
                }
                6 => {
                    down.push(r.range(0, 3));
                    Step::CrashStandby
                }
                7 | 8 => {
                    // Right after a write: a handler is often in flight, or about to be.
                    steps.push(Step::Advance(r.pick(&[0, 0, 1, 10, 50])));
                    if thaw_in.is_none() && r.chance(70) {
                        thaw_in = Some(r.range(1, 6));
                    }
                    Step::Zombie {
                        stall_ms: r.pick(&[
                            lease_ms / 2,
                            lease_ms + poll_ms + 500,
                            lease_ms + poll_ms + 5_000,
                            2 * lease_ms + 20_000,
                        ]),
                    }
                }
                9 => {
                    if thaw_in.is_none() && r.chance(70) {
                        thaw_in = Some(r.range(1, 6));
                    }
                    Step::FreezeLeader {
                        cut_off: r.chance(50),
                    }
                }
                10 => {
                    down.push(r.range(0, 3));
                    Step::StopInstance {
                        leader: r.chance(60),
                    }
                }
                11 => Step::RestartInstance {
                    leader: r.chance(60),
                },
                12 => Step::Rewind(r.range(1, 4)),
                13 => Step::Truncate(r.range(0, 6) as usize),
                14 => Step::CheckpointSaveFailures(r.range(1, 4) as u32),
                15 => Step::CheckpointLoadFailures(r.range(1, 3) as u32),
                16 => Step::CheckpointSaveDelay(if r.chance(60) {
                    Some(r.pick(&[50, 1_000, 8_000]))
                } else {
                    None
                }),
                17 if dead_letter_failures < 8 => {
                    let n = (r.range(1, 6) as u32).min(8 - dead_letter_failures);
                    dead_letter_failures += n;
                    Step::DeadLetterPutFailures(n)
                }
                18 => Step::OpenFailures(r.range(1, 3) as usize),
                _ => Step::ReadDelay(if r.chance(60) {
                    Some(r.pick(&[10, 200, 1_500]))
                } else {
                    None
                }),
            };
            steps.push(fault);
        }
        for _ in &down {
            steps.push(Step::StartInstance {
                new_identity: r.chance(40),
            });
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

    /// Whether this is a multi-instance (`SingleLeader`) schedule.
    pub fn is_multi_instance(&self) -> bool {
        self.settings.leader.is_some()
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
