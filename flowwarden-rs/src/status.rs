//! What the runtime reports about each stream.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use bson::DateTime;

/// The life cycle of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamState {
    /// Loading its checkpoint and opening the source.
    Starting,
    /// Reading and handling events.
    Running,
    /// Re-opening the source after an error, per the restart backoff.
    Resuming,
    /// A healthy `SingleLeader` standby: another instance holds the lease; this one polls.
    Standby,
    /// Not running: stopped on request, never started, or halted (see `halt`).
    Stopped,
    /// Halted because every stored position is older than the retained history and
    /// `on_history_lost = Fail`.
    HistoryLost,
}

/// Why a stream halted, with the runbook an operator follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt {
    /// The class of the halt.
    pub reason: HaltReason,
    /// What happened, naming the stream.
    pub message: String,
    /// The runbook to follow (a path under `docs/runbooks/`).
    pub runbook: &'static str,
}

impl Halt {
    /// A halt for `reason`, with its runbook.
    pub fn new(reason: HaltReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            runbook: reason.runbook(),
        }
    }
}

impl std::fmt::Display for Halt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (runbook: {})", self.message, self.runbook)
    }
}

/// The classes of halts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HaltReason {
    /// Every stored position is older than the retained history (`on_history_lost = Fail`).
    HistoryLost,
    /// The watched collection was dropped or renamed.
    Invalidated,
    /// The stored checkpoint does not parse.
    CorruptCheckpoint,
    /// Retries were exhausted and no dead-letter store is configured.
    NoDeadLetterStore,
    /// The dead-letter store refused the record repeatedly.
    DeadLetterStoreFailed,
    /// `#[on_error]` returned `ErrorAction::Halt`.
    HaltRequested,
    /// The source reported an unrecoverable error (for example code 280).
    SourceFatal,
    /// The source stayed unreachable past `#[restart(max_attempts)]`.
    SourceUnavailable,
    /// An event was larger than the server can return.
    EventTooLarge,
    /// The stream's definition is not acceptable to the source (for example its pipeline).
    Configuration,
    /// A write was rejected because another instance took over the stream.
    Fenced,
    /// Another live instance runs this `AllInstances` stream under the same checkpoint (no
    /// configured instance identity): sharing it would lose events silently.
    SharedCheckpoint,
    /// Whether a `transactional = true` stream's commit applied is unknown, even after
    /// retrying it: the restart's stored checkpoint decides.
    TransactionOutcomeUnknown,
}

impl HaltReason {
    /// The runbook for this class of halt.
    pub fn runbook(self) -> &'static str {
        match self {
            Self::HistoryLost => "docs/runbooks/history-lost.md",
            Self::Invalidated => "docs/runbooks/invalidate.md",
            Self::CorruptCheckpoint => "docs/runbooks/corrupt-checkpoint.md",
            Self::NoDeadLetterStore | Self::HaltRequested | Self::DeadLetterStoreFailed => {
                "docs/runbooks/handler-failures.md"
            }
            Self::SourceFatal | Self::Configuration => "docs/runbooks/source-fatal.md",
            Self::SourceUnavailable => "docs/runbooks/source-unavailable.md",
            Self::EventTooLarge => "docs/runbooks/event-too-large.md",
            Self::Fenced => "docs/runbooks/fenced.md",
            Self::SharedCheckpoint => "docs/runbooks/shared-checkpoint.md",
            Self::TransactionOutcomeUnknown => "docs/runbooks/transaction-outcome-unknown.md",
        }
    }
}

/// Counters of one stream since the runtime started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamCounters {
    /// Events received from the source.
    pub received: u64,
    /// Events handled successfully.
    pub handled: u64,
    /// Events rejected by the filter.
    pub filtered: u64,
    /// Events no handler takes.
    pub unrouted: u64,
    /// Handler attempts that were retried.
    pub retried: u64,
    /// Events dead-lettered.
    pub dead_lettered: u64,
    /// Events settled by `ErrorAction::Skip`.
    pub skipped: u64,
    /// Events received again after they were settled in this process (at-least-once).
    pub redelivered: u64,
    /// Source re-opens after errors.
    pub restarts: u64,
    /// Gaps accepted under `on_history_lost = ResumeFromOplogStart | ResumeFromNow`.
    pub history_lost: u64,
    /// Checkpoints written.
    pub checkpoints_saved: u64,
    /// Checkpoint writes that failed.
    pub checkpoint_failures: u64,
    /// Transactions committed with their checkpoint (`transactional = true` streams).
    pub transactions_committed: u64,
    /// Transactions run again, handler included, after a transient error (nothing of the
    /// failed run was committed).
    pub transactions_retried: u64,
}

/// A snapshot of one stream's status.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamStatus {
    /// The stream's name.
    pub name: &'static str,
    /// Its state.
    pub state: StreamState,
    /// Wall time of the last event received.
    pub last_event_at: Option<DateTime>,
    /// Why it halted, when it did.
    pub halt: Option<Halt>,
    /// Counters.
    pub counters: StreamCounters,
    /// Where the stream stands against its source's retained history; `None` until the
    /// first sample (taken every few seconds while the runtime runs).
    pub lag: Option<LagStatus>,
    /// The last checkpoint this process stored for the stream (both positions, their times,
    /// when it was written); `None` until the first save.
    pub checkpoint: Option<crate::port::Checkpoint>,
}

/// A stream's lag against its source's retained history (MongoDB's oplog window), as last
/// sampled. See docs/operations.md, "Lag and the oplog window".
#[derive(Debug, Clone, PartialEq)]
pub struct LagStatus {
    /// Whether `lag_seconds` could be measured: not before the stream's first read, nor when
    /// the source cannot tell its history (then `unknown_reason` says why).
    pub known: bool,
    /// Why lag or the window is unknown, when it is.
    pub unknown_reason: Option<String>,
    /// The time of the latest settled position: the last settled event, or the post-batch
    /// position of an empty or fully filtered batch.
    pub position_time: Option<DateTime>,
    /// The time of the oldest retained history entry.
    pub oldest_time: Option<DateTime>,
    /// The time of the newest history entry (the last operation written).
    pub newest_time: Option<DateTime>,
    /// Newest history time minus the position time; 0 when the last read returned an empty
    /// batch after the position (caught up).
    pub lag_seconds: Option<f64>,
    /// Newest minus oldest retained history time: how far back a restart can resume.
    pub window_seconds: Option<f64>,
    /// The window minus the lag: how long the stream may fall further behind (or stay down)
    /// before its position leaves the retained history.
    pub headroom_seconds: Option<f64>,
    /// The last read returned an empty batch and nothing is unsettled.
    pub caught_up: bool,
    /// Running, yet no progress for the configured time while the source has newer history:
    /// a stuck consumer (readiness fails; docs/runbooks/stalled.md).
    pub stalled: bool,
    /// Since when the position has not moved while behind, when it is behind.
    pub behind_since: Option<DateTime>,
    /// When this sample was taken.
    pub sampled_at: DateTime,
}

fn stalled(s: &StreamStatus) -> bool {
    s.lag.as_ref().is_some_and(|l| l.stalled)
}

/// The shared, updatable status of one stream.
#[derive(Debug)]
pub(crate) struct StatusCell {
    /// Everything but what `per_event` holds (its counters stay 0 here).
    inner: Mutex<StreamStatus>,
    per_event: PerEvent,
    changed: tokio::sync::Notify,
}

/// What moves with every event, kept beside the lock: a busy stream counts without taking it.
/// A snapshot reads these after the rest, so it may count an event more than the rest shows.
#[derive(Debug)]
struct PerEvent {
    received: AtomicU64,
    handled: AtomicU64,
    /// `last_event_at` in milliseconds; [`NO_EVENT`] when none.
    last_event_at: AtomicI64,
}

const NO_EVENT: i64 = i64::MIN;

impl StatusCell {
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            inner: Mutex::new(StreamStatus {
                name,
                state: StreamState::Stopped,
                last_event_at: None,
                halt: None,
                counters: StreamCounters::default(),
                lag: None,
                checkpoint: None,
            }),
            per_event: PerEvent {
                received: AtomicU64::new(0),
                handled: AtomicU64::new(0),
                last_event_at: AtomicI64::new(NO_EVENT),
            },
            changed: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn snapshot(&self) -> StreamStatus {
        let mut status = match self.inner.lock() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let per_event = &self.per_event;
        status.counters.received = per_event.received.load(Ordering::Relaxed);
        status.counters.handled = per_event.handled.load(Ordering::Relaxed);
        status.last_event_at = match per_event.last_event_at.load(Ordering::Relaxed) {
            NO_EVENT => None,
            millis => Some(DateTime::from_millis(millis)),
        };
        status
    }

    /// Counts an event received; `wall_time` is its wall time, when it has one.
    pub(crate) fn count_received(&self, wall_time: Option<DateTime>) {
        self.per_event.received.fetch_add(1, Ordering::Relaxed);
        if let Some(time) = wall_time {
            self.per_event
                .last_event_at
                .store(time.timestamp_millis(), Ordering::Relaxed);
        }
    }

    /// Counts an event handled successfully.
    pub(crate) fn count_handled(&self) {
        self.per_event.handled.fetch_add(1, Ordering::Relaxed);
    }

    /// Applies `f`. Waiters are woken when the state or the halt changes; counter changes
    /// are picked up by their periodic re-check, so a busy stream does not wake an observer
    /// on every event.
    pub(crate) fn update(&self, f: impl FnOnce(&mut StreamStatus)) {
        let changed = {
            let mut guard = match self.inner.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            let before = (guard.state, guard.halt.is_some(), stalled(&guard));
            f(&mut guard);
            before != (guard.state, guard.halt.is_some(), stalled(&guard))
        };
        if changed {
            self.changed.notify_waiters();
        }
    }

    pub(crate) fn set_state(&self, state: StreamState) {
        self.update(|s| {
            s.state = state;
            if matches!(state, StreamState::Starting) {
                s.halt = None;
            }
        });
    }

    pub(crate) async fn wait_until(&self, pred: impl Fn(&StreamStatus) -> bool) -> StreamStatus {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let snap = self.snapshot();
            if pred(&snap) {
                return snap;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_shows_the_per_event_counts_beside_the_rest() {
        let cell = StatusCell::new("s");
        let before = cell.snapshot();
        assert_eq!((before.counters.received, before.counters.handled), (0, 0));
        assert_eq!(before.last_event_at, None);
        cell.count_received(Some(DateTime::from_millis(1_000)));
        cell.count_received(None);
        cell.count_handled();
        cell.update(|s| s.counters.filtered += 1);
        let after = cell.snapshot();
        assert_eq!(after.counters.received, 2);
        assert_eq!(after.counters.handled, 1);
        assert_eq!(after.counters.filtered, 1);
        assert_eq!(
            after.last_event_at,
            Some(DateTime::from_millis(1_000)),
            "an event without a wall time leaves the last one"
        );
    }
}
