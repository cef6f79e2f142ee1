//! What a seed whose stream is `transactional = true` draws on top of its schedule, all from
//! its own generator (`mix(seed ^ TRANSACTIONAL_SALT)`): `concurrency = 1` (a transactional
//! stream handles one event at a time), how long a commit's request and reply take, whether
//! the handler makes a second write, and commit faults placed among the steps: injected commit
//! failures (transient, unavailable, rejected, and an unknown outcome after the commit
//! applied) and crashes while a commit is in flight, before or after it applied, each followed
//! by a start of the crashed slot.
//!
//! One fault of the other schedules is replaced: the in-memory `rewind` (open cursors move back
//! and deliver again events they delivered already) becomes `close streams` (the cursor is
//! lost and the runtime re-opens after its settled position). Exactly-once effects rest on the
//! source never delivering again, within one cursor, what it delivered already — which
//! MongoDB's cursors and the driver's own resume (after the last event returned) guarantee —
//! so a rewound cursor would apply a committed event's effects again without any real
//! counterpart (`docs/testing/simulation.md`, "Transactional streams").

use flowwarden::port::TransactionErrorKind;

use super::{Schedule, Step, TransactionalSettings};
use crate::rng::SplitMix64;

/// Turns `schedule` into a transactional one.
pub(super) fn apply(txn: &mut SplitMix64, schedule: &mut Schedule) {
    for step in &mut schedule.steps {
        if matches!(step, Step::Rewind(_)) {
            *step = Step::CloseStreams;
        }
    }
    let settings = &mut schedule.settings;
    settings.concurrency = 1;
    settings.transactional = Some(TransactionalSettings {
        commit_request_ms: txn.pick(&[0, 0, 1, 20, 200]),
        commit_reply_ms: txn.pick(&[0, 0, 1, 20, 200]),
        second_write: txn.chance(50),
    });
    add_faults(txn, schedule);
}

/// Places 1–4 commit faults among the steps (a fault-free schedule stays fault-free).
fn add_faults(txn: &mut SplitMix64, schedule: &mut Schedule) {
    if schedule.is_fault_free() {
        return;
    }
    let leader = schedule.settings.leader;
    for _ in 0..txn.range(1, 4) {
        // Before the last step, so a drop stays the last write.
        let at = txn.below(schedule.steps.len() as u64) as usize;
        let failures = |n, kind| vec![Step::CommitFailures { n, kind }];
        let unit = match txn.below(7) {
            0 | 1 => failures(txn.range(1, 3) as usize, TransactionErrorKind::Transient),
            2 => failures(txn.range(1, 3) as usize, TransactionErrorKind::Unavailable),
            3 => failures(1, TransactionErrorKind::Rejected),
            4 => failures(1, TransactionErrorKind::CommitUnknown),
            _ => {
                let mut unit = vec![Step::CrashInCommit {
                    applied: txn.chance(50),
                }];
                match leader {
                    Some(l) => {
                        unit.push(Step::Advance(txn.range(0, l.lease_secs * 1_000)));
                        unit.push(Step::StartInstance {
                            new_identity: txn.chance(40),
                        });
                    }
                    None => {
                        unit.push(Step::Advance(txn.range(0, 3_000)));
                        unit.push(Step::Restart);
                    }
                }
                unit
            }
        };
        schedule.steps.splice(at..at, unit);
    }
}
