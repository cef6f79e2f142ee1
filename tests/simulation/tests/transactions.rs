//! Transactional streams (`transactional = true`) in the simulation: the generated schedules
//! reach them (single- and multi-instance, snapshot starts, injected commit failures, crashes
//! while a commit is in flight, unknown outcomes, deposed leaders fenced at their commit) and
//! hold every invariant, including 15 (effects exactly once); the runtime switches that write
//! the checkpoint outside the transaction, or keep writing plain checkpoints after an unknown
//! outcome, are caught by 15, and the same seeds pass without them.

use flowwarden_simulation::{
    run_schedule, run_seed, shrink_for, Invariant, Schedule, SimOptions, Stats, Step,
};

/// The transactional seeds from 0 on.
fn all_transactional_seeds() -> impl Iterator<Item = u64> {
    (0u64..).filter(|s| Schedule::generate(*s).is_transactional())
}

/// The first `count` transactional seeds from 0.
fn transactional_seeds(count: usize) -> Vec<u64> {
    all_transactional_seeds().take(count).collect()
}

fn outside() -> SimOptions {
    SimOptions {
        checkpoint_outside_transaction: true,
        ..SimOptions::default()
    }
}

#[test]
fn the_schedules_reach_transactional_streams_and_hold_every_invariant() {
    let seeds = transactional_seeds(400);
    let mut stats = Stats::default();
    let mut failing = Vec::new();
    for seed in &seeds {
        let out = run_seed(*seed, &SimOptions::default()).expect("runs");
        if !out.violations.is_empty() {
            failing.push((*seed, out.violations));
        }
        stats.merge(&out.stats);
    }
    println!("{stats}");
    assert!(failing.is_empty(), "failing seeds: {failing:?}");
    assert_eq!(stats.transactional_seeds, 400);
    // Only one event at a time.
    assert_eq!(stats.concurrent_seeds, 0, "{stats}");
    // Every deployment, and snapshot starts.
    assert!(stats.multi_instance_seeds > 0, "{stats}");
    assert!(stats.shared_checkpoint_seeds > 0, "{stats}");
    assert!(
        stats.snapshot_seeds > 0 && stats.snapshot_reads > 0,
        "{stats}"
    );
    // What invariant 15 is about actually happens: commits applied, transactions run again
    // after transient failures, unknown outcomes (the stream halts and is restarted), commits
    // that failed or were fenced, and commits whose reply never came back.
    assert!(stats.commits_applied > 0, "{stats}");
    assert!(stats.transient_reruns > 0, "{stats}");
    assert!(stats.unknown_outcomes > 0, "{stats}");
    assert!(stats.failed_commits > 0, "{stats}");
    assert!(
        stats.fenced_commits > 0,
        "no deposed leader fenced at its commit: {stats}"
    );
    assert!(stats.unanswered_commits > 0, "{stats}");
    for kind in [
        "commit_failures_transient",
        "commit_failures_unavailable",
        "commit_failures_rejected",
        "commit_failures_unknown",
        "crash_in_commit_request",
        "crash_in_commit_reply",
        "crash",
        "crash_leader",
        "zombie",
        "freeze_leader_renewals",
    ] {
        assert!(
            stats.faults.get(kind).copied().unwrap_or(0) > 0,
            "no `{kind}` fault injected: {stats}"
        );
    }
}

/// The first transactional seed (among the first `limit`) whose run under `opts` violates
/// `invariant`, with its shrunk report.
fn first_caught(opts: &SimOptions, invariant: Invariant, limit: usize) -> Option<(u64, String)> {
    let seed = transactional_seeds(limit).into_iter().find(|seed| {
        run_seed(*seed, opts)
            .expect("runs")
            .violations
            .iter()
            .any(|v| v.invariant == invariant)
    })?;
    let schedule = Schedule::generate(seed);
    let (small, out) = shrink_for(&schedule, opts, 300, Some(invariant)).expect("shrinking runs");
    assert!(
        small.steps.len() < schedule.steps.len(),
        "seed {seed} shrinks"
    );
    let report = format!(
        "seed {seed}, shrunk from {} to {} steps:\n{}",
        schedule.steps.len(),
        small.steps.len(),
        out.report(&small, 30)
    );
    Some((seed, report))
}

/// Every transactional seed up to `last` holds every invariant without a switch.
fn assert_clean_up_to(last: u64) {
    for seed in all_transactional_seeds().take_while(|s| *s <= last) {
        let out = run_seed(seed, &SimOptions::default()).expect("runs");
        assert!(
            out.violations.is_empty(),
            "seed {seed} fails without the switch: {:?}",
            out.violations
        );
    }
}

/// The non-atomic design (`Builder::checkpoint_outside_transaction`: the handler's writes
/// commit first, the checkpoint is written afterwards as a plain write) applies an event's
/// effect twice after a crash in between. Invariant 15 must catch it within the first 100
/// transactional seeds, and those seeds must pass without the switch.
#[test]
fn a_checkpoint_written_outside_the_transaction_is_caught() {
    let (seed, report) = first_caught(&outside(), Invariant::EffectsExactlyOnce, 100).expect(
        "checkpoint_outside_transaction went unnoticed by invariant 15 for 100 transactional seeds",
    );
    println!("checkpoint_outside_transaction: invariant 15 fails first at {report}");
    assert_clean_up_to(seed);
}

/// Plain checkpoint writes that go on after a commit whose outcome is unknown
/// (`Builder::no_freeze_after_unknown_outcome`: no `Progress::freeze`): the halt's final flush
/// writes the settled prefix before the event whose commit applied, the stored checkpoint
/// moves back (invariant 7) and the restart applies the event's effect again (15). Both must
/// be caught within the first 100 transactional seeds, and those seeds pass without it.
#[test]
fn plain_writes_after_an_unknown_outcome_are_caught() {
    let opts = SimOptions {
        no_freeze_after_unknown_outcome: true,
        ..SimOptions::default()
    };
    let (seed, report) = first_caught(&opts, Invariant::EffectsExactlyOnce, 100).expect(
        "no_freeze_after_unknown_outcome went unnoticed by invariant 15 for 100 transactional seeds",
    );
    println!("no_freeze_after_unknown_outcome: invariant 15 fails first at {report}");
    let (first, _) = first_caught(&opts, Invariant::CheckpointMovesBackwards, 100)
        .expect("invariant 7 never sees the checkpoint move back");
    println!("no_freeze_after_unknown_outcome: invariant 7 fails first at seed {first}");
    assert_clean_up_to(seed.max(first));
}

/// A crash right after a commit applied, before its reply reached the runtime: the restart
/// resumes after the event (the checkpoint was in the commit), so its effect is applied once.
/// The same schedule with the checkpoint written outside the transaction applies it twice.
#[test]
fn a_crash_after_a_commit_applied_applies_the_effect_once() {
    let mut schedule = Schedule::generate(0);
    assert!(
        !schedule.initial_keys.contains(&0),
        "k0 is inserted by the schedule"
    );
    assert!(
        schedule.is_transactional()
            && !schedule.is_multi_instance()
            && !schedule.settings.shared_checkpoint
            && schedule.settings.snapshot.is_none()
    );
    schedule.settings.behaviour.dead_letter_request_pct = 0;
    schedule.steps = vec![
        Step::Insert {
            key: 0,
            n: 1,
            status: "NEW",
            bad: false,
        },
        Step::CrashInCommit { applied: true },
        Step::Advance(100),
        Step::Restart,
        Step::Update { key: 0, n: 2 },
    ];
    let out = run_schedule(&schedule, &SimOptions::default()).expect("runs");
    let trace = out.trace_text();
    assert!(out.violations.is_empty(), "{}", out.report(&schedule, 40));
    assert!(
        trace.contains("a commit is held after it applied"),
        "{trace}"
    );
    assert_eq!(out.stats.unanswered_commits, 1, "{trace}");
    assert_eq!(out.stats.commits_applied, 2, "{trace}");
    assert_eq!(out.stats.duplicate_successes, 0, "{trace}");
    assert!(
        trace.contains("effects at the end: 2 event(s), 2 application(s)"),
        "{trace}"
    );

    let out = run_schedule(&schedule, &outside()).expect("runs");
    assert!(
        out.violations
            .iter()
            .any(|v| v.invariant == Invariant::EffectsExactlyOnce),
        "the checkpoint outside the transaction went unnoticed:\n{}",
        out.trace_text()
    );
}
