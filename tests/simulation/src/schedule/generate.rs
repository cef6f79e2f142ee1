//! How a seed becomes a schedule: one SplitMix64 generator for the settings and the steps,
//! and side generators (`mix(seed ^ constant)`) for the situations added later, so that every
//! other draw of a seed stays what it was.

use flowwarden::{OnHistoryLost, ResumeStrategy};

use super::{
    Behaviour, FilterKind, LeaderSettings, PipelineKind, Schedule, Settings, Step,
    MULTI_INSTANCE_PCT, SHARED_CHECKPOINT_PCT, SNAPSHOT_PCT, STATUSES, TRANSACTIONAL_PCT,
};
use crate::rng::{mix, SplitMix64};

/// The salt of the snapshot generator (`mix(seed ^ SNAPSHOT_SALT)`).
const SNAPSHOT_SALT: u64 = 0x736E_6170_7368_6F74;

/// The salt of the transactional generator (`mix(seed ^ TRANSACTIONAL_SALT)`).
const TRANSACTIONAL_SALT: u64 = 0x7472_616E_7361_6374;

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
            read_in_process: false,
            snapshot: None,
            transactional: None,
        };
        // From its own generator, so every other draw of the seed stays what it was.
        let mut conc = SplitMix64::new(mix(seed ^ 0x636F_6E63_7572_2121));
        settings.concurrency = conc.pick(&[1, 1, 2, 8, 64]);
        // Where the reader runs, also from its own generator.
        let mut read = SplitMix64::new(mix(seed ^ 0x7265_6164_2069_6E21));
        settings.read_in_process = read.chance(50);
        // Drawn from its own generator, so every other draw of the seed stays what it was.
        let mut oldest = SplitMix64::new(mix(seed ^ 0x6F6C_6465_7374_3F21));
        settings.oldest_unknown =
            settings.on_history_lost == OnHistoryLost::ResumeFromOplogStart && oldest.chance(40);

        // An initial snapshot or not, from its own generator too: every other seed keeps its
        // schedule. A snapshot seed has more documents over more keys, drawn from that
        // generator (`schedule/snapshot.rs`).
        let mut snap = SplitMix64::new(mix(seed ^ SNAPSHOT_SALT));
        let snapshot = snap.chance(SNAPSHOT_PCT);
        let present: Vec<bool> = if snapshot {
            super::snapshot::draw(&mut snap, &mut settings)
        } else {
            (0..keys).map(|_| r.chance(60)).collect()
        };
        let keys = settings.keys;
        let initial_keys = (0..keys).filter(|k| present[*k as usize]).collect();

        // Multi-instance or not is drawn from a side generator, so the single-instance
        // schedules are exactly the ones of the seeds before multi-instance runs existed.
        let side = SplitMix64::new(mix(seed ^ 0x6C65_6164_6572_7321));
        let mut schedule =
            Self::generate_deployment(seed, r, side, settings, present, initial_keys);
        if snapshot {
            super::snapshot::add_faults(&mut snap, &mut schedule);
        }
        // Transactional or not, from its own generator too, decided last: every other seed
        // keeps its schedule, and a transactional seed keeps every other draw (its concurrency
        // becomes 1, its commits draw their latency and faults: `schedule/transactional.rs`).
        let mut txn = SplitMix64::new(mix(seed ^ TRANSACTIONAL_SALT));
        if txn.chance(TRANSACTIONAL_PCT) {
            super::transactional::apply(&mut txn, &mut schedule);
        }
        schedule
    }

    /// The steps, single-instance (one runtime, or two sharing a checkpoint) or
    /// multi-instance.
    fn generate_deployment(
        seed: u64,
        mut r: SplitMix64,
        mut side: SplitMix64,
        mut settings: Settings,
        mut present: Vec<bool>,
        initial_keys: Vec<i32>,
    ) -> Schedule {
        if side.chance(MULTI_INSTANCE_PCT) {
            return Self::generate_multi(seed, r, side, settings, present, initial_keys);
        }
        let keys = settings.keys;
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
}
