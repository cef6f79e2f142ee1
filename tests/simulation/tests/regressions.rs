//! Schedules the simulation once failed on, written out by hand so each stays covered whatever
//! the seeds generate.

use flowwarden::{OnHistoryLost, ResumeStrategy};
use flowwarden_simulation::{
    run_schedule, Behaviour, FilterKind, PipelineKind, Schedule, Settings, SimOptions, Step,
};

/// Found by invariant 7 (seed 3300, shrunk to 6 steps; across a change of leader: seed 12526).
/// Under `resume_strategy = ProcessedFirst`, a restarted (or newly elected) runtime resumes
/// after `lastProcessed` and replays what lies between it and `lastSeen`. It used to write the
/// replayed, older positions as `lastSeen`, giving up a resumable fallback: here `lastSeen #3`
/// survives the truncation to `#4..`, a rewritten `lastSeen #2` does not, and the stream halted
/// `HistoryLost` where it could resume. The runtime now keeps the stored `lastSeen` until the
/// replay passes it (`ResumeToken::position_cmp`).
#[test]
fn a_processed_first_replay_keeps_the_stored_last_seen() {
    let settings = Settings {
        keys: 2,
        save_every_n: 1,
        save_interval_secs: 1,
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
        batch_size: 1,
        shutdown_timeout_ms: 2_000,
        dead_letter_write_attempts: 1,
        pipeline: PipelineKind::None,
        filter: FilterKind::NoUpdatesOf(0),
        behaviour: Behaviour {
            max_latency_ms: 0,
            transient_pct: 0,
            transient_calls: 0,
            panic_pct: 0,
            dead_letter_request_pct: 0,
            permanent_keys: vec![],
            dead_letter_permanent_at_once: false,
        },
        leader: None,
        concurrency: 1,
        read_in_process: false,
        snapshot: None,
        transactional: None,
    };
    let schedule = Schedule {
        seed: 1,
        settings,
        initial_keys: vec![],
        steps: vec![
            // #1 handled; #2 and #3 rejected by the filter; the heartbeat stores seen #3,
            // processed #1.
            Step::Insert {
                key: 0,
                n: 1,
                status: "NEW",
                bad: false,
            },
            Step::Update { key: 0, n: 2 },
            Step::Update { key: 0, n: 3 },
            Step::Advance(2_000),
            // Slow reads; a restart replays after #1; the heartbeat stores seen #2.
            Step::ReadDelay(Some(600)),
            Step::GracefulRestart,
            Step::Advance(2_100),
            Step::Crash,
            Step::ReadDelay(None),
            // #4, and history before it is gone: resuming after #3 works, after #2 does not.
            Step::Insert {
                key: 1,
                n: 4,
                status: "NEW",
                bad: false,
            },
            Step::Truncate(1),
            Step::Restart,
        ],
    };
    let out = run_schedule(&schedule, &SimOptions::default()).expect("runs");
    let trace = out.trace_text();
    assert!(
        !trace.contains("the stored lastSeen moves back"),
        "lastSeen moved back during the replay:\n{trace}"
    );
    assert!(
        out.stats.halts.is_empty(),
        "halted although the stored lastSeen was resumable:\n{trace}"
    );
}
