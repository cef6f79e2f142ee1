//! Snapshot starts (`start_position = Snapshot`) in the simulation: the generated schedules
//! reach them (documents before the start, writes, crashes, scan failures, lost history and
//! checkpoint failures while the scan runs) and hold every invariant, including 12–14; the
//! two runtime switches that break the snapshot on purpose are caught; and the runtime bug the
//! simulation found (a false `HistoryLost` on an empty in-memory oplog) stays fixed.

use flowwarden_simulation::{
    run_schedule, run_seed, shrink_for, Invariant, Schedule, SimOptions, Stats, Step,
};

/// The snapshot seeds from 0 on.
fn all_snapshot_seeds() -> impl Iterator<Item = u64> {
    (0u64..).filter(|s| Schedule::generate(*s).settings.snapshot.is_some())
}

/// The first `count` snapshot seeds from 0.
fn snapshot_seeds(count: usize) -> Vec<u64> {
    all_snapshot_seeds().take(count).collect()
}

/// The first snapshot seed (among the first `limit`) whose run under `opts` violates
/// `invariant`, with the shrunk report.
fn first_caught(opts: &SimOptions, invariant: Invariant, limit: usize) -> Option<(u64, String)> {
    let seed = snapshot_seeds(limit).into_iter().find(|seed| {
        run_seed(*seed, opts)
            .expect("runs")
            .violations
            .iter()
            .any(|v| v.invariant == invariant)
    })?;
    let schedule = Schedule::generate(seed);
    let (small, out) = shrink_for(&schedule, opts, 300, Some(invariant)).expect("shrinking runs");
    let report = format!(
        "seed {seed}, shrunk from {} to {} steps:\n{}",
        schedule.steps.len(),
        small.steps.len(),
        out.report(&small, 30)
    );
    Some((seed, report))
}

/// Every snapshot seed up to `last` holds every invariant without the sabotage.
fn assert_clean_up_to(last: u64) {
    for seed in all_snapshot_seeds().take_while(|s| *s <= last) {
        let out = run_seed(seed, &SimOptions::default()).expect("runs");
        assert!(
            out.violations.is_empty(),
            "seed {seed} fails without the sabotage: {:?}",
            out.violations
        );
    }
}

#[test]
fn the_schedules_reach_snapshot_starts_and_hold_every_invariant() {
    let mut stats = Stats::default();
    let mut failing = Vec::new();
    for seed in snapshot_seeds(300) {
        let out = run_seed(seed, &SimOptions::default()).expect("runs");
        if !out.violations.is_empty() {
            failing.push((seed, out.violations));
        }
        stats.merge(&out.stats);
    }
    println!("{stats}");
    assert!(failing.is_empty(), "failing seeds: {failing:?}");
    assert_eq!(stats.snapshot_seeds, 300);
    // What the invariants are about actually happens: scans over several batches, changes
    // while they run, scans resumed after a crash or a halt, completed snapshots, history
    // lost during a scan, and the faults placed while the scan runs.
    assert!(stats.scan_batches > 2 * stats.snapshot_seeds, "{stats}");
    assert!(stats.snapshot_reads > 0, "{stats}");
    assert!(stats.changes_during_scan > 0, "{stats}");
    assert!(stats.resumed_scans > 0, "no scan resumed: {stats}");
    assert!(stats.snapshots_completed > 0, "{stats}");
    assert!(
        stats.snapshot_history_lost > 0,
        "no history lost during a scan: {stats}"
    );
    for kind in [
        "scan_failures",
        "crash",
        "crash_leader",
        "truncate_history",
        "checkpoint_save_failures",
    ] {
        assert!(
            stats.faults.get(kind).copied().unwrap_or(0) > 0,
            "no `{kind}` fault injected: {stats}"
        );
    }
}

/// The start position taken again after the scan (`Builder::snapshot_start_after_scan`): the
/// changes made while the scan ran are never delivered. Invariant 1 must catch the silent loss
/// (13 sees the open at "now" during the snapshot, 12 the projection that differs, 2 the
/// checkpoint that passes the lost changes), and the same seeds pass without the switch.
#[test]
fn a_start_recorded_after_the_scan_is_caught() {
    let opts = SimOptions {
        snapshot_start_after_scan: true,
        ..SimOptions::default()
    };
    let (seed, report) = first_caught(&opts, Invariant::NoSilentLoss, 100)
        .expect("snapshot_start_after_scan went unnoticed by invariant 1 for 100 snapshot seeds");
    println!("snapshot_start_after_scan: invariant 1 fails first at {report}");
    let (first, _) = first_caught(&opts, Invariant::SnapshotResume, 100)
        .expect("invariant 13 never sees the open at now");
    println!("snapshot_start_after_scan: invariant 13 fails first at seed {first}");
    assert_clean_up_to(seed.max(first));
}

/// An unfinished scan restarted from its first document (`Builder::snapshot_rescan_from_zero`)
/// is caught by invariant 13, and the same seeds pass without the switch.
#[test]
fn a_scan_restarted_from_zero_is_caught() {
    let opts = SimOptions {
        snapshot_rescan_from_zero: true,
        ..SimOptions::default()
    };
    let (seed, report) = first_caught(&opts, Invariant::SnapshotResume, 100)
        .expect("snapshot_rescan_from_zero went unnoticed by invariant 13 for 100 snapshot seeds");
    println!("snapshot_rescan_from_zero: invariant 13 fails first at {report}");
    assert_clean_up_to(seed);
}

/// Seed 134, shrunk: a snapshot that starts on an empty collection (an empty oplog: its start
/// is position 0) and reads a document inserted right after the start. The runtime halted
/// `HistoryLost` before the second scan batch although nothing had been dropped (fixed in the
/// in-memory backend's history bounds; `flowwarden-rs/tests/snapshot.rs` has the focused test).
#[test]
fn a_snapshot_on_an_empty_oplog_is_not_halted_for_lost_history() {
    let mut schedule = Schedule::generate(134);
    assert!(schedule.settings.snapshot.is_some() && schedule.initial_keys.is_empty());
    schedule.steps = vec![Step::Insert {
        key: 1,
        n: 12,
        status: "SHIPPED",
        bad: false,
    }];
    let out = run_schedule(&schedule, &SimOptions::default()).expect("runs");
    assert!(out.violations.is_empty(), "{}", out.report(&schedule, 30));
    let trace = out.trace_text();
    assert!(
        trace.contains("stream start position: after #0") && trace.contains("-> [1]"),
        "the scan did not read the document inserted after the start:\n{trace}"
    );
    assert_eq!(out.stats.snapshots_completed, 1, "{trace}");
}
