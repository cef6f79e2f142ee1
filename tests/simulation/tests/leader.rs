//! Multi-instance (`SingleLeader`) simulation: hand-written zombie and takeover schedules, and
//! the proof that the checkers of invariants 6–10 fail when the stores around a correct
//! runtime are broken on purpose (harness-level sabotage; the runtime is untouched).

use flowwarden::{OnHistoryLost, ResumeStrategy};
use flowwarden_simulation::{
    run_schedule, run_seed, shrink, Behaviour, FilterKind, Invariant, LeaderSettings, PipelineKind,
    Sabotage, Schedule, SeedOutcome, Settings, SimOptions, Step,
};

/// Two instances, lease 5 s renewed every second, standbys poll every second; a handler
/// without latency or failures; a checkpoint after every event; a long shutdown timeout, so
/// a stalled leader is still inside its session when it wakes.
fn two_leaders() -> Settings {
    Settings {
        keys: 2,
        save_every_n: 1,
        save_interval_secs: 0,
        resume_strategy: ResumeStrategy::ProcessedFirst,
        on_history_lost: OnHistoryLost::Fail,
        oldest_unknown: false,
        shared_checkpoint: false,
        retry_attempts: 1,
        retry_delay_ms: 10,
        retry_jitter: false,
        restart_attempts: 0,
        restart_delay_ms: 50,
        max_await_ms: 100,
        batch_size: 8,
        shutdown_timeout_ms: 60_000,
        dead_letter_write_attempts: 1,
        pipeline: PipelineKind::None,
        filter: FilterKind::None,
        behaviour: Behaviour {
            max_latency_ms: 0,
            transient_pct: 0,
            transient_calls: 0,
            panic_pct: 0,
            dead_letter_request_pct: 0,
            permanent_keys: vec![],
            dead_letter_permanent_at_once: false,
        },
        leader: Some(LeaderSettings {
            instances: 2,
            lease_secs: 5,
            renew_secs: 1,
            poll_secs: 1,
        }),
        concurrency: 1,
        read_in_process: false,
        snapshot: None,
        transactional: None,
    }
}

fn insert(key: i32, n: i64) -> Step {
    Step::Insert {
        key,
        n,
        status: "NEW",
        bad: false,
    }
}

/// The leader (i0) starts handling k0's insert, its renewals freeze and its handler stalls
/// for 20 s: it stops reading before its lease expires (at 5 s), i1 takes over within a poll,
/// handles k0 again and checkpoints under epoch 2. At 20 s the zombie's handler finishes and
/// its checkpoint write (epoch 1) must be rejected; it stands by.
fn zombie_schedule(settings: Settings) -> Schedule {
    Schedule {
        seed: 7,
        settings,
        initial_keys: vec![],
        steps: vec![
            insert(0, 1),
            Step::Zombie { stall_ms: 20_000 },
            Step::Advance(30_000),
            insert(1, 2),
            Step::Advance(2_000),
        ],
    }
}

fn invariants(out: &SeedOutcome) -> Vec<Invariant> {
    out.violations.iter().map(|v| v.invariant).collect()
}

fn assert_clean(schedule: &Schedule, out: &SeedOutcome) {
    assert!(out.violations.is_empty(), "{}", out.report(schedule, 60));
}

#[test]
fn a_zombie_checkpoint_write_is_rejected_and_the_zombie_stands_by() {
    let schedule = zombie_schedule(two_leaders());
    let out = run_schedule(&schedule, &SimOptions::default()).expect("runs");
    assert_clean(&schedule, &out);
    let trace = out.trace_text();
    assert_eq!(out.stats.zombie_wakeups, 1, "{trace}");
    assert!(out.stats.fenced_checkpoint_writes >= 1, "{trace}");
    assert_eq!(out.stats.zombies_fenced, 1, "{trace}");
    assert!(out.stats.takeovers >= 1, "{trace}");
    assert!(
        trace.contains("[i1 #2] acquires the lease: epoch 2"),
        "{trace}"
    );
    // The zombie handled k0 too, after i1 did: a redelivery, allowed by at-least-once.
    assert!(out.stats.duplicate_successes >= 1, "{trace}");

    // The same run with stores that do not check the fence: the zombie's write goes
    // through, and the checker says so.
    let sabotaged = SimOptions {
        sabotage: Some(Sabotage::UnfencedWrites),
        ..SimOptions::default()
    };
    let out = run_schedule(&schedule, &sabotaged).expect("runs");
    let found = invariants(&out);
    assert!(
        found.contains(&Invariant::ZombieWrite) && found.contains(&Invariant::OneWriterPerEpoch),
        "unfenced zombie write not reported: {found:?}\n{}",
        out.trace_text()
    );
}

#[test]
fn a_zombie_dead_letter_is_rejected() {
    let mut settings = two_leaders();
    // k0 always fails and is dead-lettered at once: the zombie's last write is a dead letter.
    settings.behaviour.permanent_keys = vec![0];
    settings.behaviour.dead_letter_permanent_at_once = true;
    let schedule = zombie_schedule(settings);
    let out = run_schedule(&schedule, &SimOptions::default()).expect("runs");
    assert_clean(&schedule, &out);
    let trace = out.trace_text();
    assert!(out.stats.fenced_dead_letter_writes >= 1, "{trace}");
    assert_eq!(
        out.stats.dead_letters, 1,
        "only the new leader's dead letter is stored: {trace}"
    );

    let sabotaged = SimOptions {
        sabotage: Some(Sabotage::UnfencedWrites),
        ..SimOptions::default()
    };
    let out = run_schedule(&schedule, &sabotaged).expect("runs");
    assert!(
        out.violations
            .iter()
            .any(|v| v.invariant == Invariant::ZombieWrite && v.message.contains("dead letter")),
        "unfenced zombie dead letter not reported: {:?}\n{}",
        invariants(&out),
        out.trace_text()
    );
}

#[test]
fn a_standby_takes_over_a_crashed_leader_within_lease_and_poll() {
    let schedule = Schedule {
        seed: 11,
        settings: two_leaders(),
        initial_keys: vec![],
        steps: vec![
            insert(0, 1),
            Step::Advance(500),
            Step::CrashLeader,
            insert(1, 2),
            Step::Advance(10_000),
            Step::StartInstance { new_identity: true },
            update(0, 3),
        ],
    };
    let out = run_schedule(&schedule, &SimOptions::default()).expect("runs");
    assert_clean(&schedule, &out);
    assert!(out.stats.takeovers >= 1, "{}", out.trace_text());
    assert!(
        out.trace_text()
            .contains("takeover after `crash of the leader`"),
        "{}",
        out.trace_text()
    );

    let sabotaged = SimOptions {
        sabotage: Some(Sabotage::NoTakeover),
        ..SimOptions::default()
    };
    let out = run_schedule(&schedule, &sabotaged).expect("runs");
    assert!(
        invariants(&out).contains(&Invariant::Liveness),
        "{:?}\n{}",
        invariants(&out),
        out.trace_text()
    );
}

fn update(key: i32, n: i64) -> Step {
    Step::Update { key, n }
}

/// The leader's renewals freeze at 0.5 s (lease until 5 s): it must stop before 5 s.
fn frozen_schedule(cut_off: bool) -> Schedule {
    Schedule {
        seed: 13,
        settings: two_leaders(),
        initial_keys: vec![],
        steps: vec![
            insert(0, 1),
            Step::Advance(500),
            Step::FreezeLeader { cut_off },
            insert(1, 2),
            Step::Advance(3_000),
            update(0, 3),
            Step::Advance(10_000),
            update(1, 4),
        ],
    }
}

#[test]
fn a_frozen_leader_stops_before_its_lease_expires() {
    // Cut off from the lease store: it stops, and i1 takes over once the lease expired.
    let schedule = frozen_schedule(true);
    let out = run_schedule(&schedule, &SimOptions::default()).expect("runs");
    assert_clean(&schedule, &out);
    assert!(out.stats.takeovers >= 1, "{}", out.trace_text());

    // Only its renewals fail: it stops its session before the lease expires and takes the
    // lease again at once, with a new epoch (acquisitions still reach the store).
    let schedule = frozen_schedule(false);
    let out = run_schedule(&schedule, &SimOptions::default()).expect("runs");
    assert_clean(&schedule, &out);
    assert!(out.stats.lease_acquisitions >= 2, "{}", out.trace_text());

    // With renewals that "succeed" without reaching the store, the old leader keeps
    // consuming after i1 took over.
    let sabotaged = SimOptions {
        sabotage: Some(Sabotage::LyingRenewals),
        ..SimOptions::default()
    };
    let out = run_schedule(&schedule, &sabotaged).expect("runs");
    assert!(
        invariants(&out).contains(&Invariant::OneConsumer),
        "{:?}\n{}",
        invariants(&out),
        out.trace_text()
    );
}

/// The leader is partitioned from the lease store: its calls hang 10 s, then fail (the
/// driver's server-selection timeout). It must stop before its lease expires (5 s) although
/// its renewal never answers, and must not handle what is committed after i1 took over. The
/// runtime used to wait for the hung renewal and keep consuming (found as seed 142).
#[test]
fn a_partitioned_leader_stops_before_its_lease_expires() {
    let schedule = Schedule {
        seed: 17,
        settings: two_leaders(),
        initial_keys: vec![],
        steps: vec![
            insert(0, 1),
            Step::Advance(500),
            Step::SlowLeaseCalls {
                ms: 10_000,
                fail: true,
            },
            Step::Advance(6_000),
            update(0, 2),
            insert(1, 3),
            Step::Advance(10_000),
            update(1, 4),
        ],
    };
    let out = run_schedule(&schedule, &SimOptions::default()).expect("runs");
    assert_clean(&schedule, &out);
    let trace = out.trace_text();
    assert!(out.stats.takeovers >= 1, "{trace}");
    assert!(
        trace.contains("takeover after `partition of i0`"),
        "{trace}"
    );
}

/// The first multi-instance seed (below `limit`) on which `sabotage` makes `invariant` fail.
fn first_caught(sabotage: Sabotage, invariant: Invariant, limit: u64) -> Option<u64> {
    let opts = SimOptions {
        sabotage: Some(sabotage),
        ..SimOptions::default()
    };
    (0..limit)
        .filter(|s| Schedule::generate(*s).is_multi_instance())
        .find(|s| {
            run_seed(*s, &opts)
                .expect("runs")
                .violations
                .iter()
                .any(|v| v.invariant == invariant)
        })
}

/// Every sabotage is found on generated schedules, by the invariant it breaks, within a few
/// hundred multi-instance seeds.
#[test]
fn every_sabotage_is_caught_on_generated_schedules() {
    for (sabotage, invariant) in [
        (Sabotage::UnfencedWrites, Invariant::ZombieWrite),
        (
            Sabotage::UnfencedWrites,
            Invariant::CheckpointMovesBackwards,
        ),
        (Sabotage::ForgedEpoch, Invariant::OneWriterPerEpoch),
        (Sabotage::LyingRenewals, Invariant::OneConsumer),
        (Sabotage::NoTakeover, Invariant::Liveness),
    ] {
        let seed = first_caught(sabotage, invariant, 1_500);
        assert!(
            seed.is_some(),
            "{sabotage:?} went unnoticed by {invariant} for 1,500 seeds"
        );
        println!("{sabotage:?}: {invariant} fails first at seed {seed:?}");
    }
}

/// Shrinking keeps a multi-instance violation and makes the schedule smaller.
#[test]
fn a_multi_instance_violation_shrinks() {
    let opts = SimOptions {
        sabotage: Some(Sabotage::LyingRenewals),
        ..SimOptions::default()
    };
    let seed = first_caught(Sabotage::LyingRenewals, Invariant::OneConsumer, 1_500)
        .expect("a seed that fails");
    let schedule = Schedule::generate(seed);
    let (small, out) = shrink(&schedule, &opts, 300).expect("shrinks");
    assert!(small.steps.len() < schedule.steps.len());
    assert!(small.is_multi_instance());
    assert!(
        invariants(&out).contains(&Invariant::OneConsumer),
        "{}",
        out.report(&small, 40)
    );
    println!(
        "seed {seed} shrunk from {} to {} steps:\n{}",
        schedule.steps.len(),
        small.steps.len(),
        out.report(&small, 40)
    );
}

/// Several runtimes on one current-thread runtime: still the same trace on every replay,
/// sabotaged or not.
#[test]
fn multi_instance_replays_give_the_same_trace() {
    let seeds: Vec<u64> = (0..400u64)
        .filter(|s| Schedule::generate(*s).is_multi_instance())
        .take(60)
        .collect();
    assert!(seeds.len() == 60);
    for opts in [
        SimOptions::default(),
        SimOptions {
            sabotage: Some(Sabotage::UnfencedWrites),
            ..SimOptions::default()
        },
    ] {
        for seed in &seeds {
            let a = run_seed(*seed, &opts).expect("runs");
            let b = run_seed(*seed, &opts).expect("runs");
            assert_eq!(a.trace, b.trace, "seed {seed} ({opts:?})");
            assert_eq!(a.stats, b.stats, "seed {seed} ({opts:?})");
        }
    }
}
