//! What the reliability review found the simulation blind to, now modelled: a source that
//! cannot tell its oldest retained position (MongoDB without access to `local.oplog.rs`), a
//! dropped collection that the operator recreates before restarting the stream, and two
//! `AllInstances` runtimes without a configured identity sharing one checkpoint. Each has an
//! invariant the generated schedules exercise, and a sabotage the checker catches.

use flowwarden_simulation::{run_seed, Invariant, Sabotage, Schedule, SimOptions, Stats};

/// The first of `0..limit` whose run violates `invariant` under `sabotage`.
fn first_caught(sabotage: Sabotage, invariant: Invariant, limit: u64) -> Option<u64> {
    let opts = SimOptions {
        sabotage: Some(sabotage),
        ..SimOptions::default()
    };
    (0..limit).find(|seed| {
        run_seed(*seed, &opts)
            .expect("runs")
            .violations
            .iter()
            .any(|v| v.invariant == invariant)
    })
}

/// The generated schedules do reach both situations, and hold every invariant there: an
/// unknown oldest position halts `HistoryLost` (checked by invariant 5 at the end of each
/// run), and after drop + recreate + restart every change of the new collection is handled
/// (invariant 1 no longer excuses an `Invalidated` halt once the operator restarted).
#[test]
fn the_schedules_reach_an_unknown_oldest_position_and_a_recreated_collection() {
    let mut stats = Stats::default();
    let mut failing = Vec::new();
    for seed in 0..1_500u64 {
        let out = run_seed(seed, &SimOptions::default()).expect("runs");
        if !out.violations.is_empty() {
            failing.push(seed);
        }
        stats.merge(&out.stats);
    }
    println!("{stats}");
    assert!(failing.is_empty(), "failing seeds: {failing:?}");
    assert!(
        (0..1_500u64).any(|s| Schedule::generate(s).settings.oldest_unknown),
        "no schedule has a source with an unknown oldest position"
    );
    assert!(
        stats.oldest_unknown_refusals > 0,
        "no open at the oldest entry was refused: {stats}"
    );
    assert!(
        stats.recreated_after_invalidate > 0,
        "no drop was followed by recreate and restart: {stats}"
    );
    assert_eq!(
        stats.recreated_read, stats.recreated_after_invalidate,
        "a restart after recreate did not read the new collection: {stats}"
    );
    assert!(
        stats.shared_checkpoint_seeds > 0 && stats.shared_checkpoint_halts > 0,
        "no shared-checkpoint run, or no second runtime halted SharedCheckpoint: {stats}"
    );
}

/// Two runtimes share one checkpoint: with the guard, one consumes and the other halts
/// `SharedCheckpoint`; a crash hands the checkpoint over once the crashed guard expires. Some
/// shared-checkpoint seed must see such a handover (a second holder of the guard).
#[test]
fn a_shared_checkpoint_is_handed_over_after_a_crash() {
    let handed_over = (0..1_500u64)
        .filter(|s| Schedule::generate(*s).settings.shared_checkpoint)
        .take(200)
        .any(|s| {
            let out = run_seed(s, &SimOptions::default()).expect("runs");
            assert!(out.violations.is_empty(), "seed {s}: {:?}", out.violations);
            out.stats.takeovers > 0 && out.stats.faults.contains_key("crash")
        });
    assert!(
        handed_over,
        "no shared-checkpoint seed handed the guard over after a crash"
    );
}

/// A lease store that grants the checkpoint guard to everyone, as if there were no guard: both
/// runtimes consume under one checkpoint (the silent-loss trap of the default configuration).
#[test]
fn a_guard_granted_to_everyone_is_caught() {
    let seed = first_caught(Sabotage::GuardForEveryone, Invariant::OneConsumer, 1_500);
    assert!(
        seed.is_some(),
        "GuardForEveryone went unnoticed by invariant 9 for 1,500 seeds"
    );
    println!("GuardForEveryone: invariant 9 fails first at seed {seed:?}");
}

/// The old MongoDB adapter's bug, planted in the simulated source: where the oldest position
/// is unknown it opens at "now". The runtime then believes it restarted at the oldest entry
/// and runs on; the retained history it skipped is silent loss.
#[test]
fn a_source_that_opens_at_now_when_the_oldest_is_unknown_is_caught() {
    let seed = first_caught(Sabotage::OldestBecomesNow, Invariant::NoSilentLoss, 1_500);
    assert!(
        seed.is_some(),
        "OldestBecomesNow went unnoticed by invariant 1 for 1,500 seeds"
    );
    println!("OldestBecomesNow: invariant 1 fails first at seed {seed:?}");
}

/// A source that reports the unknown oldest position as a transient error: the runtime keeps
/// re-opening and never reports the lost history; invariant 5 catches the untruthful state.
#[test]
fn an_unknown_oldest_position_reported_as_transient_is_caught() {
    let seed = first_caught(
        Sabotage::OldestUnknownAsTransient,
        Invariant::TruthfulState,
        1_500,
    );
    assert!(
        seed.is_some(),
        "OldestUnknownAsTransient went unnoticed by invariant 5 for 1,500 seeds"
    );
    println!("OldestUnknownAsTransient: invariant 5 fails first at seed {seed:?}");
}

/// A store that keeps its previous position instead of the settled invalidate's: the restart
/// after recreate replays the drop and halts again, and the new collection is never read.
#[test]
fn a_store_that_forgets_the_invalidate_is_caught() {
    let seed = first_caught(Sabotage::ForgetInvalidate, Invariant::NoSilentLoss, 1_500);
    assert!(
        seed.is_some(),
        "ForgetInvalidate went unnoticed by invariant 1 for 1,500 seeds"
    );
    println!("ForgetInvalidate: invariant 1 fails first at seed {seed:?}");
}
