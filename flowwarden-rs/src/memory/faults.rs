//! Fault injection for the in-memory backend (feature `test-util`; without it there is no fault
//! state, and the hooks the backend calls answer "no fault"). Every fault is deterministic: it
//! applies to the next operations of its kind, in order, with no randomness.

#[cfg(feature = "test-util")]
use std::collections::VecDeque;
use std::time::Duration;

#[cfg(feature = "test-util")]
use super::MemoryBackend;
use crate::port::SourceError;
#[cfg(feature = "test-util")]
use crate::port::SourceErrorKind;
use crate::port::TransactionErrorKind;

#[cfg(feature = "test-util")]
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    pub(crate) fail_reads: VecDeque<SourceError>,
    pub(crate) fail_opens: VecDeque<SourceError>,
    pub(crate) fail_scans: VecDeque<SourceError>,
    pub(crate) close_generation: u64,
    pub(crate) open_generation: u64,
    pub(crate) rewind: Option<(u64, u64)>,
    pub(crate) read_delay: Option<Duration>,
    pub(crate) checkpoint_save_failures: u32,
    pub(crate) checkpoint_load_failures: u32,
    pub(crate) checkpoint_save_delay: Option<Duration>,
    pub(crate) dead_letter_put_failures: u32,
    pub(crate) frozen_lease_owners: std::collections::BTreeSet<String>,
    pub(crate) opens: u64,
    pub(crate) fail_commits: VecDeque<TransactionErrorKind>,
}

/// Without `test-util` there is no fault state: every hook below answers "no fault".
#[cfg(not(feature = "test-util"))]
#[derive(Debug, Default)]
pub(crate) struct FaultState;

/// What the fault state does to one cursor read.
pub(crate) enum ReadFault {
    /// Go on, after this delay if any.
    Proceed(Option<Duration>),
    /// Fail the read.
    #[cfg(feature = "test-util")]
    Fail(SourceError),
    /// The cursor was killed: fail this read and every later one.
    #[cfg(feature = "test-util")]
    Killed(SourceError),
    /// Move the cursor back by `events`, to generation `generation`, then go on after `delay`.
    #[cfg(feature = "test-util")]
    Rewind {
        generation: u64,
        events: u64,
        delay: Option<Duration>,
    },
}

/// The hooks the in-memory backend calls; compiled to constants without `test-util`.
impl FaultState {
    /// A cursor opens: the generation it gets, or an injected open failure.
    pub(crate) fn on_open(&mut self) -> Result<u64, SourceError> {
        #[cfg(feature = "test-util")]
        {
            self.opens += 1;
            if let Some(e) = self.fail_opens.pop_front() {
                return Err(e);
            }
            self.open_generation += 1;
            Ok(self.open_generation - 1)
        }
        #[cfg(not(feature = "test-util"))]
        Ok(0)
    }

    /// An initial snapshot reads a batch: an injected scan failure, if any.
    pub(crate) fn on_scan(&mut self) -> Result<(), SourceError> {
        #[cfg(feature = "test-util")]
        if let Some(e) = self.fail_scans.pop_front() {
            return Err(e);
        }
        Ok(())
    }

    /// A cursor of `generation` reads.
    pub(crate) fn on_read(&mut self, generation: u64) -> ReadFault {
        #[cfg(feature = "test-util")]
        {
            if generation < self.close_generation {
                return ReadFault::Killed(
                    SourceError::new(SourceErrorKind::Resumable, "cursor killed (injected close)")
                        .with_code(43),
                );
            }
            if let Some(e) = self.fail_reads.pop_front() {
                return ReadFault::Fail(e);
            }
            match self.rewind {
                Some((gen, events)) if generation < gen => ReadFault::Rewind {
                    generation: gen,
                    events,
                    delay: self.read_delay,
                },
                _ => ReadFault::Proceed(self.read_delay),
            }
        }
        #[cfg(not(feature = "test-util"))]
        {
            let _ = generation;
            ReadFault::Proceed(None)
        }
    }

    /// Whether this checkpoint load fails.
    pub(crate) fn checkpoint_load_fails(&mut self) -> bool {
        #[cfg(feature = "test-util")]
        if self.checkpoint_load_failures > 0 {
            self.checkpoint_load_failures -= 1;
            return true;
        }
        false
    }

    /// Whether this checkpoint save fails.
    pub(crate) fn checkpoint_save_fails(&mut self) -> bool {
        #[cfg(feature = "test-util")]
        if self.checkpoint_save_failures > 0 {
            self.checkpoint_save_failures -= 1;
            return true;
        }
        false
    }

    /// How long a checkpoint save takes.
    pub(crate) fn checkpoint_save_delay(&self) -> Option<Duration> {
        #[cfg(feature = "test-util")]
        return self.checkpoint_save_delay;
        #[cfg(not(feature = "test-util"))]
        None
    }

    /// Whether this dead-letter put fails.
    pub(crate) fn dead_letter_put_fails(&mut self) -> bool {
        #[cfg(feature = "test-util")]
        if self.dead_letter_put_failures > 0 {
            self.dead_letter_put_failures -= 1;
            return true;
        }
        false
    }

    /// An injected failure of this transaction commit, if any.
    pub(crate) fn commit_fails(&mut self) -> Option<TransactionErrorKind> {
        #[cfg(feature = "test-util")]
        return self.fail_commits.pop_front();
        #[cfg(not(feature = "test-util"))]
        None
    }

    /// Whether renewals of `owner` are frozen.
    pub(crate) fn renewal_frozen(&self, owner: &str) -> bool {
        #[cfg(feature = "test-util")]
        return self.frozen_lease_owners.contains(owner);
        #[cfg(not(feature = "test-util"))]
        {
            let _ = owner;
            false
        }
    }
}

/// Injects faults into a [`MemoryBackend`]. Obtained with [`MemoryBackend::faults`]
/// (feature `test-util`).
#[cfg(feature = "test-util")]
#[derive(Clone)]
pub struct Faults {
    backend: MemoryBackend,
}

#[cfg(feature = "test-util")]
impl Faults {
    pub(crate) fn new(backend: MemoryBackend) -> Self {
        Self { backend }
    }

    fn with<R>(&self, f: impl FnOnce(&mut FaultState) -> R) -> R {
        let r = f(&mut self.backend.lock().faults);
        // Wake idle readers so they observe the fault now.
        self.backend.notify_appended();
        r
    }

    /// The next `n` cursor reads fail with a resumable error (like a step-down or a network
    /// error on `getMore`).
    pub fn fail_next_reads(&self, n: usize) {
        self.fail_next_reads_with(
            n,
            SourceErrorKind::Resumable,
            "injected resumable read error",
        );
    }

    /// The next `n` cursor reads fail with an error of this kind.
    pub fn fail_next_reads_with(&self, n: usize, kind: SourceErrorKind, message: &str) {
        self.with(|f| {
            for _ in 0..n {
                f.fail_reads.push_back(SourceError::new(kind, message));
            }
        });
    }

    /// The next `n` cursor opens fail with an error of this kind.
    pub fn fail_next_opens(&self, n: usize, kind: SourceErrorKind, message: &str) {
        self.with(|f| {
            for _ in 0..n {
                f.fail_opens.push_back(SourceError::new(kind, message));
            }
        });
    }

    /// The next `n` batches of an initial snapshot's scan fail with an error of this kind.
    pub fn fail_next_scans(&self, n: usize, kind: SourceErrorKind, message: &str) {
        self.with(|f| {
            for _ in 0..n {
                f.fail_scans.push_back(SourceError::new(kind, message));
            }
        });
    }

    /// Every cursor open now fails its next read with a resumable "cursor killed" error.
    pub fn close_streams(&self) {
        self.with(|f| f.close_generation = f.open_generation);
    }

    /// Every cursor open now moves back by `events` oplog entries at its next read, the way a
    /// driver that resumed from an older cached token redelivers events.
    pub fn rewind_cursors(&self, events: u64) {
        self.with(|f| f.rewind = Some((f.open_generation, events)));
    }

    /// Every cursor read waits this long first (`None` to clear).
    pub fn set_read_delay(&self, delay: Option<Duration>) {
        self.with(|f| f.read_delay = delay);
    }

    /// Drops every oplog entry except the last `keep` (positions before them answer
    /// "history lost").
    pub fn truncate_history(&self, keep: usize) {
        let mut st = self.backend.lock();
        while st.oplog.len() > keep {
            st.oplog.pop_front();
        }
    }

    /// The next `n` checkpoint writes fail with an "unavailable" store error.
    pub fn fail_next_checkpoint_saves(&self, n: u32) {
        self.with(|f| f.checkpoint_save_failures += n);
    }

    /// The next `n` checkpoint loads fail with an "unavailable" store error.
    pub fn fail_next_checkpoint_loads(&self, n: u32) {
        self.with(|f| f.checkpoint_load_failures += n);
    }

    /// Every checkpoint write takes this long (`None` to clear).
    pub fn set_checkpoint_save_delay(&self, delay: Option<Duration>) {
        self.with(|f| f.checkpoint_save_delay = delay);
    }

    /// The next `n` dead-letter writes fail with an "unavailable" store error.
    pub fn fail_next_dead_letter_puts(&self, n: u32) {
        self.with(|f| f.dead_letter_put_failures += n);
    }

    /// Every lease renewal by `owner` fails with an "unavailable" store error until
    /// [`Faults::thaw_lease_renewals`]: that leader is cut off from the store (or paused).
    pub fn freeze_lease_renewals(&self, owner: &str) {
        self.with(|f| f.frozen_lease_owners.insert(owner.to_owned()));
    }

    /// Ends [`Faults::freeze_lease_renewals`] for `owner`.
    pub fn thaw_lease_renewals(&self, owner: &str) {
        self.with(|f| f.frozen_lease_owners.remove(owner));
    }

    /// Drops every fault injected but not yet consumed (failures of the next reads, opens,
    /// checkpoint loads and saves, dead-letter writes, a pending rewind) and every delay; a
    /// frozen lease owner stays frozen until [`Faults::thaw_lease_renewals`]. "No more faults
    /// from now on", as a simulation's drain means it.
    pub fn clear_pending(&self) {
        self.with(|f| {
            f.fail_reads.clear();
            f.fail_opens.clear();
            f.fail_scans.clear();
            f.rewind = None;
            f.read_delay = None;
            f.checkpoint_save_failures = 0;
            f.checkpoint_load_failures = 0;
            f.checkpoint_save_delay = None;
            f.dead_letter_put_failures = 0;
            f.fail_commits.clear();
        });
    }

    /// Fails the next `n` transaction commits (`transactional = true` streams) with `kind`.
    /// [`TransactionErrorKind::CommitUnknown`] commits first and then reports the failure (the
    /// reply was lost after the commit applied); every other kind commits nothing.
    pub fn fail_next_commits(&self, n: usize, kind: TransactionErrorKind) {
        self.with(|f| f.fail_commits.extend(std::iter::repeat_n(kind, n)));
    }

    /// How many cursors were opened so far (to assert re-opens).
    pub fn opens(&self) -> u64 {
        self.backend.lock().faults.opens
    }
}
