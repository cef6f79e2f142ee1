//! The drain: no more faults; wait (restarting what an operator would) until the stream caught
//! up, or halted loudly.

use super::*;

impl Sim<'_> {
    /// Whether every checked change up to the head is accounted for.
    pub(super) fn caught_up(&self) -> bool {
        let head = self.memory.oplog_head();
        let w = self.world.lock();
        let done = w.checked_changes(head).all(|c| w.accounted(c));
        // A snapshot start has also finished its scan.
        done && (!w.snap.on || w.snap.completed)
    }

    /// Multi-instance: exactly one runtime is `Running` holding the live lease; every other
    /// runtime that is up stands by.
    pub(super) fn leadership_settled(&self) -> bool {
        let w = self.world.lock();
        let mut leaders = 0;
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.runtime.is_none() {
                continue;
            }
            match self.status(i).map(|s| s.state) {
                Some(StreamState::Running) if w.leads(slot.inc) => leaders += 1,
                Some(StreamState::Standby) => {}
                _ => return false,
            }
        }
        leaders == 1
    }

    /// A stream task that ended halted (not a standby with the note of an earlier fencing).
    pub(super) fn ended_halted(status: &StreamStatus) -> Option<HaltReason> {
        let h = status.halt.as_ref()?;
        matches!(
            status.state,
            StreamState::Stopped | StreamState::HistoryLost
        )
        .then_some(h.reason)
    }

    /// No more faults: wait until the stream caught up (and, with several instances, one
    /// leads and the others stand by) or halted loudly; an operator restarts a runtime whose
    /// stream halted for a transient reason (store or source unavailable, and a transaction
    /// whose outcome is unknown, as its runbook says), up to 12 times.
    pub(super) async fn drain(&mut self) -> Result<(), SimError> {
        self.log("drain: no more faults");
        // Faults injected before the drain but not yet consumed (the next N reads, saves,
        // loads...) would otherwise keep firing during it, one per restart backoff.
        self.memory.faults().clear_pending();
        if self.leader.is_some() {
            self.thaw_all();
            // The operator brings every instance back.
            for i in 0..self.slots.len() {
                if self.slots[i].runtime.is_none() {
                    self.start(i).await?;
                }
            }
        } else {
            for i in 0..self.slots.len() {
                if self.slots[i].runtime.is_none() {
                    self.start(i).await?;
                }
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(900);
        let mut operator_restarts = 0;
        'drain: loop {
            let multi = self.leader.is_some();
            if multi {
                self.sample_running();
                self.world.lock().check_takeovers();
            }
            let settled = if self.shared() {
                self.shared_settled()
            } else {
                !multi || self.leadership_settled()
            };
            if self.caught_up() && settled {
                break;
            }
            for i in 0..self.slots.len() {
                let Some(status) = self.status(i) else {
                    continue;
                };
                let Some(reason) = Self::ended_halted(&status) else {
                    continue;
                };
                let sibling_runs = (0..self.slots.len()).any(|j| {
                    j != i
                        && self
                            .status(j)
                            .is_some_and(|s| s.state == StreamState::Running)
                });
                match reason {
                    // The guard did its job: the sibling consumes under the shared checkpoint.
                    HaltReason::SharedCheckpoint if sibling_runs => continue,
                    HaltReason::Invalidated if self.recreated_after.is_none() => {
                        self.recreate_and_restart().await?;
                        continue 'drain;
                    }
                    HaltReason::HistoryLost | HaltReason::Invalidated => break 'drain,
                    _ if operator_restarts < 12 => {
                        operator_restarts += 1;
                        let tag = self.world.lock().tag(self.slots[i].inc);
                        self.log(format!(
                            "{tag}drain: operator restarts the stream halted by {reason:?}"
                        ));
                        self.shutdown(i).await;
                        self.start(i).await?;
                        continue 'drain;
                    }
                    _ => break 'drain,
                }
            }
            if tokio::time::Instant::now() >= deadline {
                self.log("drain: deadline reached");
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Shared checkpoint: exactly one runtime consumes, holding the live guard; every other
    /// runtime that is up halted `SharedCheckpoint`.
    pub(super) fn shared_settled(&self) -> bool {
        let w = self.world.lock();
        let mut consumers = 0;
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.runtime.is_none() {
                continue;
            }
            let status = self.status(i);
            match status.as_ref().map(|s| s.state) {
                Some(StreamState::Running) if w.leads(slot.inc) => consumers += 1,
                _ if status.as_ref().and_then(Self::ended_halted)
                    == Some(HaltReason::SharedCheckpoint) => {}
                _ => return false,
            }
        }
        consumers == 1
    }

    /// What an operator does after an invalidate (docs/runbooks/invalidate.md): the dropped
    /// collection is recreated (a few inserts) and every stream that halted `Invalidated` is
    /// restarted. The restart must resume after the invalidate and read the new collection.
    pub(super) async fn recreate_and_restart(&mut self) -> Result<(), SimError> {
        self.log("drain: operator recreates the dropped collection and restarts the stream");
        self.recreated_after = Some(self.memory.oplog_head());
        self.world.lock().stats.recreated_after_invalidate += 1;
        let keys = self.schedule.settings.keys.min(3);
        for key in 0..keys {
            self.write(&Step::Insert {
                key,
                n: 1_000 + i64::from(key),
                status: "NEW",
                bad: false,
            });
        }
        for i in 0..self.slots.len() {
            let halted = self
                .status(i)
                .as_ref()
                .and_then(Self::ended_halted)
                .is_some();
            if halted || self.slots[i].runtime.is_none() {
                self.shutdown(i).await;
                self.start(i).await?;
            }
        }
        Ok(())
    }
}
