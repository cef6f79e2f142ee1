//! Applying a schedule's steps: writes, faults, and the multi-instance and shared-checkpoint
//! crashes and restarts.

use super::*;
use crate::world::Trap;

impl Sim<'_> {
    pub(super) fn write(&self, step: &Step) {
        let coll = self.memory.collection(COLLECTION);
        let before = self.memory.oplog_head();
        // The sequence this write gets: every written document carries it as `v`.
        let v = before as i64 + 1;
        let value = |n: i64, bad: bool| {
            if bad {
                Bson::String(format!("bad-{n}"))
            } else {
                Bson::Int64(n)
            }
        };
        let (key, op, status) = match step {
            Step::Insert {
                key,
                n,
                status,
                bad,
            } => {
                let _ = coll.insert_one(
                    doc! {"_id": *key, "n": value(*n, *bad), "status": *status, "v": v},
                );
                (Some(*key), Op::Insert, Some(*status))
            }
            Step::Update { key, n } => {
                let _ = coll.update_one(doc! {"_id": *key}, doc! {"$set": {"n": *n, "v": v}});
                (Some(*key), Op::Update, None)
            }
            Step::Replace {
                key,
                n,
                status,
                bad,
            } => {
                let _ = coll.replace_one(
                    doc! {"_id": *key},
                    doc! {"n": value(*n, *bad), "status": *status, "v": v},
                );
                (Some(*key), Op::Replace, Some(*status))
            }
            Step::Delete { key } => {
                let _ = coll.delete_one(doc! {"_id": *key});
                (Some(*key), Op::Delete, None)
            }
            Step::Drop => {
                coll.drop_collection();
                (None, Op::Drop, None)
            }
            _ => return,
        };
        let after = self.memory.oplog_head();
        let mut w = self.world.lock();
        if after > before {
            w.commit(after, key, op, status);
        } else {
            w.log(format!("step {step}: no change (nothing to write)"));
        }
    }

    pub(super) async fn step(&mut self, step: &Step) -> Result<(), SimError> {
        if self.leader.is_some() {
            self.sample_running();
        }
        {
            let mut w = self.world.lock();
            if w.settings.leader.is_some() {
                w.check_takeovers();
            }
            if let Some(kind) = step.fault_kind() {
                *w.stats.faults.entry(kind).or_default() += 1;
            }
        }
        let f = self.memory.faults();
        let ms = Duration::from_millis;
        match step {
            Step::Insert { .. }
            | Step::Update { .. }
            | Step::Replace { .. }
            | Step::Delete { .. }
            | Step::Drop => {
                self.write(step);
                return Ok(());
            }
            Step::Advance(t) => {
                tokio::time::sleep(ms(*t)).await;
                return Ok(());
            }
            _ => {}
        }
        self.log(format!("step: {step}"));
        match step {
            Step::ReadErrors(n) => f.fail_next_reads(*n),
            Step::CloseStreams => f.close_streams(),
            Step::Rewind(n) => f.rewind_cursors(*n),
            Step::ReadDelay(d) => f.set_read_delay(d.map(ms)),
            Step::Truncate(keep) => {
                f.truncate_history(*keep);
                self.log(format!(
                    "oplog now #{}..=#{}",
                    self.memory.oplog_first_retained(),
                    self.memory.oplog_head()
                ));
            }
            Step::CheckpointSaveFailures(n) => f.fail_next_checkpoint_saves(*n),
            Step::CheckpointLoadFailures(n) => f.fail_next_checkpoint_loads(*n),
            Step::CheckpointSaveDelay(d) => f.set_checkpoint_save_delay(d.map(ms)),
            Step::DeadLetterPutFailures(n) => f.fail_next_dead_letter_puts(*n),
            Step::OpenFailures(n) => f.fail_next_opens(
                *n,
                flowwarden::port::SourceErrorKind::Resumable,
                "injected open failure",
            ),
            Step::ScanFailures { n, fatal } => f.fail_next_scans(
                *n,
                if *fatal {
                    flowwarden::port::SourceErrorKind::Fatal
                } else {
                    flowwarden::port::SourceErrorKind::Resumable
                },
                "injected scan failure",
            ),
            Step::CommitFailures { n, kind } => f.fail_next_commits(*n, *kind),
            Step::CrashInCommit { applied } => self.crash_in_commit(*applied).await?,
            Step::Crash | Step::Restart | Step::GracefulRestart if self.shared() => {
                self.shared_step(step).await?;
            }
            Step::Crash => self.crash(0).await,
            Step::Restart if self.slots[0].runtime.is_none() => self.start(0).await?,
            Step::GracefulRestart => {
                self.shutdown(0).await;
                self.start(0).await?;
            }
            Step::CrashLeader => match self.leader_slot() {
                Some(i) => {
                    let standbys = self.standbys(Some(i));
                    let inc = self.slots[i].inc;
                    self.crash(i).await;
                    self.expect_takeover("crash of the leader", inc, standbys);
                }
                None => self.log("no running leader to crash"),
            },
            Step::CrashStandby => {
                let leader = self.leader_slot();
                let target = (0..self.slots.len())
                    .find(|i| Some(*i) != leader && self.slots[*i].runtime.is_some());
                match target {
                    Some(i) => self.crash(i).await,
                    None => self.log("no standby to crash"),
                }
            }
            Step::StartInstance { new_identity } => {
                match (0..self.slots.len()).find(|i| self.slots[*i].runtime.is_none()) {
                    Some(i) => {
                        if *new_identity {
                            let slot = &mut self.slots[i];
                            slot.generation += 1;
                            slot.id = format!("i{i}g{}", slot.generation);
                        }
                        self.start(i).await?;
                    }
                    None => self.log("every instance is up"),
                }
            }
            Step::StopInstance { leader } | Step::RestartInstance { leader } => {
                let holder = self.leader_slot();
                let target = if *leader {
                    holder
                } else {
                    (0..self.slots.len())
                        .find(|i| Some(*i) != holder && self.slots[*i].runtime.is_some())
                };
                match target {
                    Some(i) => {
                        let standbys = self.standbys(Some(i));
                        let inc = self.slots[i].inc;
                        self.shutdown(i).await;
                        if matches!(step, Step::RestartInstance { .. }) {
                            self.start(i).await?;
                        }
                        if Some(i) == holder {
                            self.expect_takeover("graceful stop of the leader", inc, standbys);
                        }
                    }
                    None => self.log("no such instance"),
                }
            }
            Step::RestartStream { leader } => {
                let holder = self.leader_slot();
                let target = if *leader {
                    holder
                } else {
                    (0..self.slots.len())
                        .find(|i| Some(*i) != holder && self.slots[*i].runtime.is_some())
                };
                match target {
                    Some(i) => {
                        let standbys = self.standbys(Some(i));
                        let inc = self.slots[i].inc;
                        if let Some(rt) = &self.slots[i].runtime {
                            let h = rt.handle();
                            if let Err(e) = h.restart(STREAM).await {
                                self.log(format!("restart of the stream failed: {e}"));
                            }
                        }
                        if Some(i) == holder {
                            self.expect_takeover("restart of the leader's stream", inc, standbys);
                        }
                    }
                    None => self.log("no such instance"),
                }
            }
            Step::FreezeLeader { cut_off } => match self.leader_slot() {
                Some(i) => {
                    let id = self.slots[i].id.clone();
                    let standbys = self.standbys(Some(i));
                    f.freeze_lease_renewals(&id);
                    {
                        let mut w = self.world.lock();
                        w.frozen.insert(id.clone());
                        if *cut_off {
                            w.cut_off.insert(id.clone());
                        }
                    }
                    let what = format!("renewals of {id} frozen");
                    self.expect_takeover(&what, self.slots[i].inc, standbys);
                }
                None => self.log("no running leader to freeze"),
            },
            Step::SlowLeaseCalls { ms: d, fail } => match self.leader_slot() {
                Some(i) => {
                    let id = self.slots[i].id.clone();
                    let standbys = self.standbys(Some(i));
                    self.world
                        .lock()
                        .slow_lease
                        .insert(id.clone(), (ms(*d), *fail));
                    if *fail {
                        // The partitioned leader cannot renew: a standby must take over.
                        let what = format!("partition of {id}");
                        self.expect_takeover(&what, self.slots[i].inc, standbys);
                    }
                }
                None => self.log("no running leader to slow down"),
            },
            Step::ThawAll => self.thaw_all(),
            Step::Zombie { stall_ms } => match self.leader_slot() {
                Some(i) => {
                    let id = self.slots[i].id.clone();
                    let inc = self.slots[i].inc;
                    let standbys = self.standbys(Some(i));
                    f.freeze_lease_renewals(&id);
                    {
                        let mut w = self.world.lock();
                        w.frozen.insert(id.clone());
                        w.stall_until
                            .insert(inc, tokio::time::Instant::now() + ms(*stall_ms));
                        w.zombies.entry(inc).or_insert(false);
                    }
                    let what = format!("zombie {id}");
                    self.expect_takeover(&what, inc, standbys);
                }
                None => self.log("no running leader to stall"),
            },
            _ => {}
        }
        Ok(())
    }

    /// Invariant 9, sampled: runtimes reporting `Running` at this instant. More than one is
    /// possible (a deposed leader still waits for its in-flight handler, or flushes); at most
    /// one of them may hold the live lease.
    pub(super) fn sample_running(&self) {
        let running: Vec<u32> = (0..self.slots.len())
            .filter(|i| {
                self.status(*i)
                    .is_some_and(|s| s.state == StreamState::Running)
            })
            .map(|i| self.slots[i].inc)
            .collect();
        if running.len() < 2 {
            return;
        }
        let mut w = self.world.lock();
        w.stats.running_overlaps += 1;
        let leading: Vec<u32> = running.iter().copied().filter(|i| w.leads(*i)).collect();
        w.log(format!(
            "runtimes {running:?} report Running; {leading:?} hold the live lease"
        ));
        if leading.len() > 1 {
            w.violate(
                Invariant::OneConsumer,
                format!("runtimes {leading:?} all report Running under the live lease"),
            );
        }
    }

    pub(super) fn thaw_all(&self) {
        let f = self.memory.faults();
        let mut w = self.world.lock();
        for id in std::mem::take(&mut w.frozen) {
            f.thaw_lease_renewals(&id);
        }
        w.cut_off.clear();
        w.slow_lease.clear();
    }

    /// A shared-checkpoint crash of slot `c`: the orchestrator restarts the sibling that halted
    /// `SharedCheckpoint`, which takes over once the crashed guard expires.
    async fn shared_crash(&mut self, c: usize) -> Result<(), SimError> {
        self.crash(c).await;
        for i in 0..self.slots.len() {
            if i != c
                && self
                    .status(i)
                    .as_ref()
                    .and_then(Self::ended_halted)
                    .is_some()
            {
                self.shutdown(i).await;
                self.start(i).await?;
            }
        }
        Ok(())
    }

    /// Arms the commit trap, waits (up to 30 s) for a runtime's commit to reach it, before or
    /// after it `applied`, and crashes that runtime there: a crash while a commit is in flight.
    async fn crash_in_commit(&mut self, applied: bool) -> Result<(), SimError> {
        let notify = Arc::new(tokio::sync::Notify::new());
        self.world.lock().txn.trap = Some(Trap {
            applied,
            hit: None,
            notify: notify.clone(),
        });
        let _ = tokio::time::timeout(Duration::from_secs(30), notify.notified()).await;
        let hit = self.world.lock().txn.trap.take().and_then(|t| t.hit);
        let slot = hit.and_then(|inc| {
            (0..self.slots.len())
                .find(|i| self.slots[*i].inc == inc && self.slots[*i].runtime.is_some())
        });
        let (Some(inc), Some(i)) = (hit, slot) else {
            self.log("no commit reached the trap within 30 s: nothing to crash");
            return Ok(());
        };
        if self.shared() {
            return self.shared_crash(i).await;
        }
        let leader = self.leader.is_some() && self.leader_slot() == Some(i);
        let standbys = self.standbys(Some(i));
        self.crash(i).await;
        if leader {
            self.expect_takeover("crash of the leader in a commit", inc, standbys);
        }
        Ok(())
    }

    /// Crash, restart and graceful restart when two runtimes share one checkpoint: they act on
    /// the runtime that consumes (holds the guard). After a crash the orchestrator restarts the
    /// sibling that halted `SharedCheckpoint`, which takes over once the crashed guard expires.
    pub(super) async fn shared_step(&mut self, step: &Step) -> Result<(), SimError> {
        let consumer = self.leader_slot();
        match step {
            Step::Crash => {
                let Some(c) = consumer else {
                    self.log("no consuming runtime to crash");
                    return Ok(());
                };
                self.shared_crash(c).await?;
            }
            Step::Restart => {
                if let Some(i) = (0..self.slots.len()).find(|i| self.slots[*i].runtime.is_none()) {
                    self.start(i).await?;
                }
            }
            _ => {
                let c = consumer.unwrap_or(0);
                self.shutdown(c).await;
                self.start(c).await?;
            }
        }
        Ok(())
    }
}
