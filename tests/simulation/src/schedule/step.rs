//! The steps of a schedule: writes, time, and faults.

use std::fmt;

use flowwarden::port::TransactionErrorKind;

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
    /// The next `n` batches of an initial snapshot's scan fail, with a resumable error or
    /// (`fatal`) one that halts the stream (the drain's operator restarts it).
    ScanFailures {
        /// How many batches.
        n: usize,
        /// Not resumable.
        fatal: bool,
    },
    /// Transactional schedules: the next `n` commits of the in-memory transactions fail with
    /// `kind` (`Faults::fail_next_commits`; `CommitUnknown` applies the commit, then reports
    /// its reply lost).
    CommitFailures {
        /// How many commits.
        n: usize,
        /// How each fails.
        kind: TransactionErrorKind,
    },
    /// Transactional schedules: the next commit any runtime sends is held, before it reaches
    /// the store (`applied = false`: the request is in flight) or after it applied (`applied =
    /// true`: the reply is in flight), and that runtime crashes there (the leader's slot or the
    /// consuming one is then down until a later start). Nothing happens if no commit comes
    /// within 30 s.
    CrashInCommit {
        /// The commit applied before the crash.
        applied: bool,
    },
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
            Step::ScanFailures { .. } => "scan_failures",
            Step::CommitFailures { kind, .. } => match kind {
                TransactionErrorKind::Transient => "commit_failures_transient",
                TransactionErrorKind::Unavailable => "commit_failures_unavailable",
                TransactionErrorKind::Rejected => "commit_failures_rejected",
                TransactionErrorKind::CommitUnknown => "commit_failures_unknown",
                TransactionErrorKind::Fenced => "commit_failures_fenced",
            },
            Step::CrashInCommit { applied: false } => "crash_in_commit_request",
            Step::CrashInCommit { applied: true } => "crash_in_commit_reply",
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
            Step::ScanFailures { n, fatal } => write!(
                f,
                "FAULT fail next {n} scans{}",
                if *fatal { " (fatal)" } else { "" }
            ),
            Step::CommitFailures { n, kind } => {
                write!(f, "FAULT fail next {n} commits ({kind:?})")
            }
            Step::CrashInCommit { applied } => write!(
                f,
                "CRASH while a commit is in flight ({})",
                if *applied {
                    "after it applied: the reply is lost"
                } else {
                    "before it reached the store"
                }
            ),
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
