//! What a seed that starts with an initial snapshot (`start_position = Snapshot`) draws on top
//! of its schedule, all from its own generator (`mix(seed ^ SNAPSHOT_SALT)`): more documents
//! before the start (over more keys, so that writes hit documents already scanned and not yet
//! scanned), a small batch size (the scan's batch size too, so that a crash lands mid-scan), a
//! scan that takes virtual time, and faults placed early, while the scan runs: scan failures,
//! crashes, truncations of the oplog (to push the recorded start out of the retained history),
//! checkpoint save failures, graceful restarts.

use super::{Schedule, Settings, SnapshotSettings, Step, STATUSES};
use crate::rng::SplitMix64;

/// Turns `settings` into a snapshot start; returns which keys are present before the start.
pub(super) fn draw(snap: &mut SplitMix64, settings: &mut Settings) -> Vec<bool> {
    settings.keys = snap.range(6, 20) as i32;
    settings.batch_size = snap.pick(&[1, 2, 3, 5]);
    // Sometimes an empty collection: the start position is then the head of an empty oplog.
    let density = snap.pick(&[0, 50, 80, 80, 100]);
    let present: Vec<bool> = (0..settings.keys).map(|_| snap.chance(density)).collect();
    let mut unusual = Vec::new();
    for key in 0..settings.keys {
        if present[key as usize] && snap.chance(12) {
            unusual.push((key, snap.pick(&STATUSES), snap.chance(30)));
        }
    }
    settings.snapshot = Some(SnapshotSettings {
        scan_latency_ms: snap.pick(&[0, 10, 100, 500]),
        read_latency_ms: snap.pick(&[5, 50, 200, 1_000]),
        start_delay_ms: snap.pick(&[0, 0, 10, 5_000]),
        unusual,
    });
    present
}

/// Places 1–3 faults among the first steps, while the scan runs (a fault-free schedule stays
/// fault-free).
pub(super) fn add_faults(snap: &mut SplitMix64, schedule: &mut Schedule) {
    if schedule.is_fault_free() {
        return;
    }
    let leader = schedule.settings.leader;
    for _ in 0..snap.range(1, 3) {
        let at = snap.below(schedule.steps.len().min(10) as u64 + 1) as usize;
        let unit = match snap.below(6) {
            0 | 1 => {
                // A crash mid-scan (often while a read is in flight), then a new runtime that
                // must go on after the stored last `_id`.
                let mut unit = vec![Step::Advance(snap.pick(&[0, 1, 10, 50, 300, 1_000]))];
                match leader {
                    Some(l) => {
                        unit.push(Step::CrashLeader);
                        unit.push(Step::Advance(snap.range(0, l.lease_secs * 1_000)));
                        unit.push(Step::StartInstance {
                            new_identity: snap.chance(40),
                        });
                    }
                    None => {
                        unit.push(Step::Crash);
                        if snap.chance(30) {
                            unit.push(Step::Truncate(snap.range(0, 3) as usize));
                        }
                        unit.push(Step::Advance(snap.range(0, 3_000)));
                        unit.push(Step::Restart);
                    }
                }
                unit
            }
            2 => vec![Step::ScanFailures {
                n: snap.range(1, 3) as usize,
                fatal: snap.chance(20),
            }],
            3 => vec![Step::Truncate(snap.range(0, 3) as usize)],
            4 => vec![Step::CheckpointSaveFailures(snap.range(1, 4) as u32)],
            _ => vec![match leader {
                Some(_) => Step::RestartInstance { leader: true },
                None => Step::GracefulRestart,
            }],
        };
        schedule.steps.splice(at..at, unit);
    }
}
