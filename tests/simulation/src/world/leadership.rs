//! The lease mirror and the checks of invariants 6–10: one writer per epoch, no backwards
//! checkpoint, no zombie writes, one consumer, liveness.

use super::recorders::pos_seq;
use super::*;

impl WorldState {
    /// The trace prefix of an incarnation (empty in single-instance runs).
    pub(crate) fn tag(&self, inc: u32) -> String {
        self.incs
            .get(&inc)
            .map(|i| i.tag.clone())
            .unwrap_or_default()
    }

    pub(crate) fn ms(&self, at: Instant) -> u128 {
        at.saturating_duration_since(self.t0).as_millis()
    }

    pub(crate) fn lease_label(&self) -> String {
        match &self.lease {
            None => "no lease".into(),
            Some(l) => format!(
                "the lease is held by {} (runtime #{}) with epoch {}, {} at {}ms",
                l.owner,
                l.inc,
                l.epoch,
                if Instant::now() < l.expires {
                    "live until"
                } else {
                    "expired"
                },
                self.ms(l.expires)
            ),
        }
    }

    /// Whether `id` can take a lease within a poll period (not cut off, partitioned, or
    /// slowed down by the harness: a standby waiting for a slow answer does not poll).
    pub(crate) fn reaches_leases(&self, id: &str) -> bool {
        !self.cut_off.contains(id) && !self.slow_lease.contains_key(id)
    }

    /// Whether the lease is live and was acquired by `inc`.
    pub(crate) fn leads(&self, inc: u32) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|l| l.inc == inc && Instant::now() < l.expires)
    }

    /// A lease acquisition, as the store granted it.
    pub(crate) fn on_acquire(&mut self, inc: u32, owner: &str, epoch: i64, ttl: Duration) {
        let now = Instant::now();
        let tag = self.tag(inc);
        self.stats.lease_acquisitions += 1;
        if let Some(prev) = &self.lease {
            if epoch <= prev.epoch {
                let prev = prev.epoch;
                self.violate(
                    Invariant::OneWriterPerEpoch,
                    format!("{tag}the lease was acquired with epoch {epoch}, not above the previous epoch {prev}"),
                );
            }
            if self.lease.as_ref().is_some_and(|p| p.owner != owner) {
                self.stats.takeovers += 1;
            }
        }
        self.log(format!(
            "{tag}acquires the lease: epoch {epoch}, until {}ms",
            self.ms(now + ttl)
        ));
        self.lease = Some(LeaseMirror {
            owner: owner.to_owned(),
            epoch,
            expires: now + ttl,
            inc,
        });
        self.acquired.insert(inc, epoch);
        self.epoch_holder.insert(epoch, inc);
        let t0 = self.t0;
        let mut lines = Vec::new();
        for t in self.takeovers.iter_mut() {
            if !t.satisfied && now <= t.deadline {
                t.satisfied = true;
                lines.push(format!(
                    "takeover after `{}`: lease taken {}ms after it was free",
                    t.what,
                    now.saturating_duration_since(t.free_at.max(t0)).as_millis()
                ));
            }
        }
        for l in lines {
            self.log(l);
        }
    }

    /// Expects a takeover (invariant 10): the lease is free from now or from its expiry, and
    /// `standbys` are polling for it.
    pub(crate) fn expect_takeover(&mut self, what: String, standbys: Vec<u32>, poll: Duration) {
        let now = Instant::now();
        let free_at = self
            .lease
            .as_ref()
            .map(|l| l.expires.max(now))
            .unwrap_or(now);
        let standbys: Vec<u32> = standbys
            .into_iter()
            .filter(|i| {
                self.incs
                    .get(i)
                    .is_some_and(|inc| self.reaches_leases(&inc.id))
            })
            .collect();
        if standbys.is_empty() {
            self.log(format!("{what}: no standby, no takeover expected"));
            return;
        }
        // Timers fire on whole milliseconds: a little slack over the poll period.
        let deadline = free_at + poll + Duration::from_millis(10);
        self.log(format!(
            "{what}: lease free at {}ms; a standby of {standbys:?} must take it by {}ms",
            self.ms(free_at),
            self.ms(deadline)
        ));
        self.takeovers.push(Takeover {
            what,
            free_at,
            deadline,
            standbys,
            satisfied: false,
        });
    }

    /// The holder renewed its lease (a thawed leader): no takeover is due any more.
    pub(crate) fn on_renewed(&mut self, inc: u32) {
        let before = self.takeovers.len();
        self.takeovers.retain(|t| t.satisfied);
        if self.takeovers.len() != before {
            let tag = self.tag(inc);
            self.log(format!(
                "{tag}renewed its lease: no takeover is expected any more"
            ));
        }
    }

    /// Invariant 10, at every observation: an expected takeover whose deadline passed must
    /// have happened, unless every standby it relied on was crashed, stopped or cut off.
    pub(crate) fn check_takeovers(&mut self) {
        let now = Instant::now();
        let pending = std::mem::take(&mut self.takeovers);
        for t in pending {
            if t.satisfied {
                continue;
            }
            if now <= t.deadline {
                self.takeovers.push(t);
                continue;
            }
            let poll = Duration::from_secs(self.settings.leader.map_or(0, |l| l.poll_secs));
            let alive: Vec<u32> = t
                .standbys
                .iter()
                .copied()
                .filter(|i| {
                    self.incs.get(i).is_some_and(|inc| {
                        inc.ended.is_none_or(|e| e > t.deadline)
                            && self.reaches_leases(&inc.id)
                            && self
                                .busy_until
                                .get(i)
                                .is_none_or(|b| *b + poll <= t.deadline)
                    })
                })
                .collect();
            if !alive.is_empty() {
                let label = self.lease_label();
                self.violate(
                    Invariant::Liveness,
                    format!(
                        "after `{}`, the lease was free from {}ms and runtime(s) {alive:?} stood by, yet no instance took it within standby_poll_secs (by {}ms); {label}",
                        t.what,
                        self.ms(t.free_at),
                        self.ms(t.deadline)
                    ),
                );
            }
        }
    }

    /// Invariant 9, when `inc` begins processing an event (its first attempt).
    pub(crate) fn check_consumer(&mut self, inc: u32, what: &str) {
        if self.leads(inc) {
            return;
        }
        let tag = self.tag(inc);
        let label = self.lease_label();
        let own = self
            .acquired
            .get(&inc)
            .map(|e| format!("its last epoch is {e}"))
            .unwrap_or_else(|| "it never acquired the lease".into());
        self.violate(
            Invariant::OneConsumer,
            format!("{tag}began processing {what} without holding the live lease ({own}); {label}"),
        );
    }

    /// Invariants 6, 7 and 8, when the store accepted a checkpoint write of `inc`.
    pub(crate) fn on_checkpoint_accepted(
        &mut self,
        inc: u32,
        cp: &Checkpoint,
        current: Option<&Lease>,
    ) {
        self.stats.checkpoints_saved += 1;
        let seen = cp.last_seen.as_ref().and_then(|p| token_seq(&p.token));
        let processed = cp.last_processed.as_ref().and_then(|p| token_seq(&p.token));
        let tag = self.tag(inc);
        let carried = match (&cp.owner, cp.epoch) {
            (Some(o), Some(e)) => format!("owner {o} epoch {e}"),
            (None, Some(e)) => format!("epoch {e}"),
            _ => "no epoch".into(),
        };
        // Fencing is the leader's (SingleLeader): a shared checkpoint's writes carry no epoch;
        // its guard is checked by invariant 9 alone.
        if self.settings.leader.is_some() && (self.lease.is_some() || current.is_some()) {
            let store = current
                .map(|l| format!("{} with epoch {}", l.owner, l.epoch))
                .unwrap_or_else(|| "nobody".into());
            // 6: it carries the epoch of the lease current at this instant ...
            let current_epoch = current.is_some_and(|l| {
                cp.epoch == Some(l.epoch) && cp.owner.as_deref() == Some(l.owner.as_str())
            });
            if !current_epoch {
                self.violate(
                    Invariant::OneWriterPerEpoch,
                    format!("{tag}an accepted checkpoint write carries {carried}, but the lease current at that instant is held by {store}"),
                );
            }
            if let Some(e) = cp.epoch {
                // ... accepted epochs never decrease, and one epoch has one writer.
                self.check_epoch_writer(inc, e, "checkpoint");
            }
            // 8: the writer still holds the current lease (fencing is by epoch: a write after
            // expiry is fine while nobody else acquired).
            let holds = current.is_some_and(|l| self.acquired.get(&inc) == Some(&l.epoch));
            if !holds {
                let own = self
                    .acquired
                    .get(&inc)
                    .map(|e| format!("acquired epoch {e}"))
                    .unwrap_or_else(|| "never acquired the lease".into());
                self.violate(
                    Invariant::ZombieWrite,
                    format!("{tag}a deposed leader's checkpoint write was accepted (it {own}; the store's lease is held by {store}): seen {}, processed {}", pos_seq(seen), pos_seq(processed)),
                );
            }
        }
        // 7: the stored checkpoint never moves backwards. One allowance: down to what this
        // runtime's source delivered again after moving back (the in-memory `rewind` fault; the
        // runtime processes redeliveries again). A `ProcessedFirst` replay gets none: the
        // runtime keeps the stored lastSeen until the replay passes it.
        if let Some(prev) = self.last_written.clone() {
            let floor = self.rewound_to.get(&inc).copied();
            for (label, before, after) in [
                ("lastSeen", prev.seen, seen),
                ("lastProcessed", prev.processed, processed),
            ] {
                if let Some(b) = before {
                    if after.is_some_and(|a| a < b && floor.is_some_and(|f| f <= a)) {
                        let (a, f) = (after.unwrap_or(0), floor.unwrap_or(0));
                        self.log(format!("{tag}the stored {label} moves back from #{b} to #{a}: the source redelivered from #{f}"));
                    } else if after.is_none_or(|a| a < b) {
                        self.violate(
                            Invariant::CheckpointMovesBackwards,
                            format!(
                                "{tag}the stored checkpoint's {label} moved back from #{b} (written by runtime #{}) to {}",
                                prev.inc,
                                pos_seq(after)
                            ),
                        );
                    }
                }
            }
        }
        self.last_written = Some(Written {
            seen,
            processed,
            inc,
        });
    }

    /// Invariant 6 on an accepted write (checkpoint or claim) of `inc` under epoch `e`:
    /// accepted epochs never decrease, and the writer is the runtime that acquired `e`.
    pub(crate) fn check_epoch_writer(&mut self, inc: u32, e: i64, what: &str) {
        let tag = self.tag(inc);
        if let Some(prev) = self.last_epoch {
            if e < prev {
                self.violate(
                    Invariant::OneWriterPerEpoch,
                    format!("{tag}accepted {what} epochs went back from {prev} to {e}"),
                );
            }
        }
        self.last_epoch = Some(self.last_epoch.map_or(e, |p| p.max(e)));
        let writer = *self.epoch_writer.entry(e).or_insert(inc);
        let holder = self.epoch_holder.get(&e).copied();
        if writer != inc || holder != Some(inc) {
            let holder = holder
                .map(|h| format!("runtime #{h}"))
                .unwrap_or_else(|| "nobody".into());
            self.violate(
                Invariant::OneWriterPerEpoch,
                format!("{tag}{what} accepted under epoch {e}, which was acquired by {holder} and first written by runtime #{writer}: two writers for one epoch"),
            );
        }
    }

    /// Invariants 6 and 8, when the store accepted a checkpoint claim of `inc` (a new
    /// leader fences the checkpoint before it loads it).
    pub(crate) fn on_claim_accepted(
        &mut self,
        inc: u32,
        fence: &flowwarden::port::Fence,
        current: Option<&Lease>,
    ) {
        let tag = self.tag(inc);
        self.log(format!(
            "{tag}claims the checkpoint (epoch {})",
            fence.epoch
        ));
        let store = current
            .map(|l| format!("{} with epoch {}", l.owner, l.epoch))
            .unwrap_or_else(|| "nobody".into());
        if !current.is_some_and(|l| l.epoch == fence.epoch && l.owner == fence.owner) {
            self.violate(
                Invariant::OneWriterPerEpoch,
                format!("{tag}an accepted checkpoint claim carries owner {} epoch {}, but the lease current at that instant is held by {store}", fence.owner, fence.epoch),
            );
        }
        self.check_epoch_writer(inc, fence.epoch, "checkpoint claim");
        if current.is_none_or(|l| self.acquired.get(&inc) != Some(&l.epoch)) {
            self.violate(
                Invariant::ZombieWrite,
                format!("{tag}a deposed leader's checkpoint claim was accepted (the store's lease is held by {store})"),
            );
        }
    }

    /// Invariant 8, when the store accepted a dead letter of `inc`.
    pub(crate) fn on_dead_letter_accepted(
        &mut self,
        inc: u32,
        rec: &DeadLetterRecord,
        current: Option<&Lease>,
    ) {
        if self.settings.leader.is_none() || (self.lease.is_none() && current.is_none()) {
            return;
        }
        let carries = current.is_some_and(|l| {
            rec.epoch == Some(l.epoch) && rec.owner.as_deref() == Some(l.owner.as_str())
        });
        let holds = current.is_some_and(|l| self.acquired.get(&inc) == Some(&l.epoch));
        if !carries || !holds {
            let tag = self.tag(inc);
            let store = current
                .map(|l| format!("{} with epoch {}", l.owner, l.epoch))
                .unwrap_or_else(|| "nobody".into());
            let own = self
                .acquired
                .get(&inc)
                .map(|e| format!("acquired epoch {e}"))
                .unwrap_or_else(|| "never acquired the lease".into());
            self.violate(
                Invariant::ZombieWrite,
                format!(
                    "{tag}a dead letter for #{} carrying epoch {:?} was accepted from a runtime that {own}, while the store's lease is held by {store}",
                    token_seq(&rec.token).unwrap_or(0),
                    rec.epoch
                ),
            );
        }
    }

    /// A write of `inc` was rejected as fenced.
    pub(crate) fn on_fenced(&mut self, inc: u32, what: &str, e: &StoreError) {
        let tag = self.tag(inc);
        self.log(format!("{tag}{what} REJECTED (fenced): {}", e.message));
        if let Some(z) = self.zombies.get_mut(&inc) {
            if !*z {
                *z = true;
                self.stats.zombies_fenced += 1;
            }
        }
    }
}
