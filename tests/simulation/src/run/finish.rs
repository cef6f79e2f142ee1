//! The end of a run: graceful shutdown, then invariants 1, 4, 5, 10, 12, 14 and 15 over the
//! whole run.

use super::*;

impl Sim<'_> {
    /// Graceful shutdown, then invariants 1, 4, 5 and 10 over the whole run.
    pub(super) async fn finish(mut self) -> SeedOutcome {
        let statuses: Vec<(usize, StreamStatus)> = (0..self.slots.len())
            .filter_map(|i| self.status(i).map(|s| (i, s)))
            .collect();
        let loud_status = statuses.iter().find(|(_, s)| {
            matches!(
                Self::ended_halted(s),
                Some(HaltReason::HistoryLost | HaltReason::Invalidated)
            )
        });
        let leader = self.leader_slot();
        // The status invariants 1 and 5 judge: the one runtime of a single-instance run; with
        // several, a loud halt if any, else the leader's.
        let final_status = loud_status
            .or_else(|| statuses.iter().find(|(i, _)| Some(*i) == leader))
            .or(statuses.first())
            .map(|(_, s)| s.clone());
        if self.leader.is_some() {
            let mut w = self.world.lock();
            w.check_takeovers();
            drop(w);
            // Invariant 10: after the drain, one leader and standbys (unless halted loudly).
            if loud_status.is_none() && !self.leadership_settled() {
                let states: Vec<String> = statuses
                    .iter()
                    .map(|(i, s)| {
                        format!(
                            "{} #{}: {:?}{}",
                            self.slots[*i].id,
                            self.slots[*i].inc,
                            s.state,
                            s.halt
                                .as_ref()
                                .map(|h| format!(" (halt {:?})", h.reason))
                                .unwrap_or_default()
                        )
                    })
                    .collect();
                let mut w = self.world.lock();
                let lease = w
                    .lease
                    .as_ref()
                    .map(|l| format!("held by runtime #{} epoch {}", l.inc, l.epoch))
                    .unwrap_or_else(|| "never taken".into());
                w.violate(
                    Invariant::Liveness,
                    format!("after the drain no single instance leads with the others standing by: {states:?}; lease {lease}"),
                );
            }
        }
        if self.shared() && loud_status.is_none() && !self.shared_settled() {
            let states: Vec<String> = statuses
                .iter()
                .map(|(i, s)| {
                    format!(
                        "{} #{}: {:?} {:?}",
                        self.slots[*i].id,
                        self.slots[*i].inc,
                        s.state,
                        s.halt.as_ref().map(|h| h.reason)
                    )
                })
                .collect();
            self.world.lock().violate(
                Invariant::Liveness,
                format!("after the drain no single runtime consumes the shared checkpoint with the other halted SharedCheckpoint: {states:?}"),
            );
        }
        // Standbys first, so the leader's release does not start a last takeover.
        let mut order: Vec<usize> = (0..self.slots.len())
            .filter(|i| Some(*i) != leader)
            .collect();
        order.extend(leader);
        for i in order {
            self.shutdown(i).await;
        }
        let head = self.memory.oplog_head();
        let first = self.memory.oplog_first_retained();
        let stored = self.memory.checkpoint_document(STREAM);
        let documents = self
            .memory
            .collection(COLLECTION)
            .find(doc! {})
            .unwrap_or_default();
        let effects = self
            .memory
            .collection(world::EFFECTS)
            .find(doc! {})
            .unwrap_or_default();
        let total = self
            .memory
            .collection(world::TOTALS)
            .find_one(doc! {"_id": "all"})
            .ok()
            .flatten()
            .map(|d| world::counter(&d));
        let mut w = self.world.lock();
        let state = final_status.as_ref().map(|s| s.state);
        let halt = final_status.as_ref().and_then(|s| s.halt.clone());
        if let Some(h) = &halt {
            *w.stats.halts.entry(format!("{:?}", h.reason)).or_default() += 1;
        }
        let drop_seq = w.changes.values().find(|c| c.op == Op::Drop).map(|c| c.seq);
        let missing: Vec<u64> = w
            .checked_changes(head)
            .filter(|c| !w.accounted(c))
            .map(|c| c.seq)
            .collect();

        // Invariant 1.
        if !missing.is_empty() {
            let loud = match halt.as_ref().map(|h| h.reason) {
                Some(HaltReason::HistoryLost) => state == Some(StreamState::HistoryLost),
                // Once the operator recreated the collection and restarted, the restart must
                // read it: halting on the same invalidate again excuses nothing.
                Some(HaltReason::Invalidated) => {
                    self.recreated_after.is_none()
                        && drop_seq.is_some_and(|d| missing.iter().all(|s| *s > d))
                }
                _ => false,
            };
            if loud {
                w.log(format!(
                    "unhandled changes {missing:?} are behind a loud halt ({:?})",
                    halt.as_ref().map(|h| h.reason)
                ));
            } else {
                w.violate(
                    Invariant::NoSilentLoss,
                    format!(
                        "changes {missing:?} were never handled, dead-lettered or filtered, and are in no reported gap (final state {state:?}, halt {:?})",
                        halt.as_ref().map(|h| format!("{:?}: {}", h.reason, without_wall_clock(&h.message)))
                    ),
                );
            }
        }

        // Invariants 12 and 14: the projection equals the collection; a start lost during
        // the scan ends HistoryLost.
        let loud = matches!(
            halt.as_ref().map(|h| h.reason),
            Some(HaltReason::HistoryLost | HaltReason::Invalidated)
        );
        w.check_snapshot_end(documents, state, halt.as_ref(), loud, first);

        // Invariant 15: every effect at most once, every handled event's exactly once.
        w.check_effects_end(effects, total);

        if let Some(after) = self.recreated_after {
            if w.checked_changes(head)
                .filter(|c| c.seq > after)
                .all(|c| w.accounted(c))
            {
                w.stats.recreated_read += 1;
            }
        }

        // Invariant 5: a source that cannot tell its oldest position leaves
        // ResumeFromOplogStart nothing to restart at: the stream must show HistoryLost. Judged
        // on the latest open: a later runtime that resumed from a checkpoint still in the
        // retained history runs rightly.
        if w.last_open_refused_oldest
            && !(state == Some(StreamState::HistoryLost)
                && halt
                    .as_ref()
                    .is_some_and(|h| h.reason == HaltReason::HistoryLost))
        {
            w.violate(
                Invariant::TruthfulState,
                format!("the source refused to open at its oldest entry (unknown), yet the stream ends {state:?} with halt {:?}", halt.as_ref().map(|h| h.reason)),
            );
        }

        // Invariant 5: lost history under Fail must show HistoryLost, not Running.
        if self.schedule.settings.on_history_lost == OnHistoryLost::Fail && !missing.is_empty() {
            let resumable = stored.as_ref().is_some_and(|d| {
                ["lastSeenToken", "lastProcessedToken"].iter().any(|f| {
                    d.get_document(f)
                        .ok()
                        .and_then(|t| token_seq(&flowwarden::ResumeToken::from_document(t.clone())))
                        .is_some_and(|s| s + 1 >= first)
                })
            });
            if !resumable && state != Some(StreamState::HistoryLost) && halt.is_none() {
                w.violate(
                    Invariant::TruthfulState,
                    format!("history before #{first} is lost under on_history_lost = Fail, but the stream reports {state:?}"),
                );
            }
        }

        // Invariant 4: without faults, each change is handled at most once; except, with
        // concurrent handlers, a change handled after one whose processing a shutdown timeout
        // cut off (the checkpoint stays before the cut one: both are delivered again).
        if self.schedule.is_fault_free() {
            let dups: Vec<u64> = w
                .successes
                .iter()
                .filter(|(_, v)| **v > 1)
                .map(|(s, _)| *s)
                .filter(|s| {
                    self.schedule.settings.concurrency == 1
                        || !w.left_unsettled.range(..*s).any(|_| true)
                })
                .collect();
            if !dups.is_empty() {
                w.violate(
                    Invariant::DuplicateWithoutFault,
                    format!(
                        "fault-free schedule, yet changes {dups:?} were handled more than once"
                    ),
                );
            }
            if w.stats.redeliveries > 0 {
                let n = w.stats.redeliveries;
                w.violate(
                    Invariant::DuplicateWithoutFault,
                    format!("fault-free schedule, yet the runtime counted {n} redeliveries"),
                );
            }
        }
        if w.gap.iter().next().is_some() && w.history_lost_accounted == 0 {
            w.violate(
                Invariant::NoSilentLoss,
                "a gap was excused without a history-lost report".into(),
            );
        }
        w.log(format!(
            "end: head #{head}, first retained #{first}, missing {missing:?}"
        ));
        w.stats.violations = w.violations.len() as u64;
        w.stats.virtual_ms = w.t0.elapsed().as_millis() as u64;
        SeedOutcome {
            seed: self.schedule.seed,
            violations: w.violations.clone(),
            stats: w.stats.clone(),
            trace: std::mem::take(&mut w.trace),
        }
    }
}
