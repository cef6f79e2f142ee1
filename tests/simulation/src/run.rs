//! Running a schedule on the real runtime, draining, and the end-of-run invariants.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Once};
use std::time::Duration;

use bson::{doc, Bson};
use flowwarden::port::LeaseStore;
use flowwarden::{
    AnyStream, Backend, Deployment, HaltReason, LeaseConfig, MemoryBackend, OnHistoryLost,
    RestartConfig, RetryConfig, Runtime, StreamDefinition, StreamState, StreamStatus,
};

use crate::rng::mix;
use crate::schedule::{LeaderSettings, Schedule, Settings, Step};
use crate::world::{
    self, token_seq, Incarnation, Op, RecCheckpoints, RecDeadLetters, RecLeases, RecSource,
    SimHandler, World,
};
use crate::{Invariant, SeedOutcome, SimError, SimOptions, COLLECTION, STREAM};

/// Runs the schedule of `seed`.
pub fn run_seed(seed: u64, opts: &SimOptions) -> Result<SeedOutcome, SimError> {
    run_schedule(&Schedule::generate(seed), opts)
}

/// Runs one schedule on a fresh current-thread tokio runtime with paused time.
pub fn run_schedule(schedule: &Schedule, opts: &SimOptions) -> Result<SeedOutcome, SimError> {
    install_panic_hook();
    world::set_pipeline(schedule.settings.pipeline);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    rt.block_on(simulate(schedule, *opts))
}

/// Removes steps while the same invariant still fails, within `budget` runs. Returns the
/// smallest failing schedule found and its outcome (the input when nothing smaller fails).
pub fn shrink(
    schedule: &Schedule,
    opts: &SimOptions,
    budget: usize,
) -> Result<(Schedule, SeedOutcome), SimError> {
    let mut best_out = run_schedule(schedule, opts)?;
    let mut best = schedule.clone();
    let Some(target) = best_out.violations.first().map(|v| v.invariant) else {
        return Ok((best, best_out));
    };
    let mut budget = budget;
    let mut chunk = (best.steps.len() / 2).max(1);
    loop {
        let mut progressed = false;
        let mut i = 0;
        while i < best.steps.len() && budget > 0 {
            let mut cand = best.clone();
            let end = (i + chunk).min(cand.steps.len());
            cand.steps.drain(i..end);
            budget -= 1;
            let out = run_schedule(&cand, opts)?;
            if out.violations.iter().any(|v| v.invariant == target) {
                best = cand;
                best_out = out;
                progressed = true;
            } else {
                i += chunk;
            }
        }
        if budget == 0 || (!progressed && chunk == 1) {
            break;
        }
        if !progressed {
            chunk /= 2;
        }
    }
    Ok((best, best_out))
}

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !payload.contains(world::PANIC_MARK) {
                previous(info);
            }
        }));
    });
}

thread_local! {
    static DEFINITIONS: RefCell<HashMap<String, &'static StreamDefinition>> = RefCell::new(HashMap::new());
}

/// The checkpoint guard's timing in shared-checkpoint runs: short, so takeovers after a crash
/// happen within the schedule.
const SHARED_GUARD: LeaseConfig = LeaseConfig {
    lease_secs: 3,
    renew_secs: 1,
    standby_poll_secs: 1,
};

/// The stream definition of these settings (interned: definitions are `'static`).
fn definition(s: &Settings) -> &'static StreamDefinition {
    let mut d = world::DEFAULT_DEF.clone();
    d.checkpoint.save_every_n = s.save_every_n;
    d.checkpoint.save_interval_secs = s.save_interval_secs;
    d.checkpoint.resume_strategy = s.resume_strategy;
    d.checkpoint.on_history_lost = s.on_history_lost;
    d.retry = RetryConfig {
        max_attempts: s.retry_attempts,
        initial_delay_ms: s.retry_delay_ms,
        multiplier: 2.0,
        max_delay_ms: 5_000,
        jitter: s.retry_jitter,
    };
    d.restart = RestartConfig {
        max_attempts: s.restart_attempts,
        initial_delay_ms: s.restart_delay_ms,
        max_delay_ms: 5_000,
    };
    if let Some(l) = s.leader {
        d.deployment = Deployment::SingleLeader(LeaseConfig {
            lease_secs: l.lease_secs,
            renew_secs: l.renew_secs,
            standby_poll_secs: l.poll_secs,
        });
    }
    let key = format!(
        "{:?}{:?}{:?}{:?}",
        d.checkpoint, d.retry, d.restart, d.deployment
    );
    DEFINITIONS.with(|m| {
        *m.borrow_mut()
            .entry(key)
            .or_insert_with(|| Box::leak(Box::new(d)))
    })
}

/// One place for a runtime: a single-instance run has one slot; a multi-instance run has one
/// per instance, each with its identity (a new one when restarted "with a new identity").
struct Slot {
    id: String,
    generation: u32,
    runtime: Option<Runtime>,
    /// The incarnation of its current (or last) runtime.
    inc: u32,
}

struct Sim<'a> {
    schedule: &'a Schedule,
    opts: SimOptions,
    world: Arc<World>,
    memory: MemoryBackend,
    def: &'static StreamDefinition,
    leader: Option<LeaderSettings>,
    slots: Vec<Slot>,
    next_inc: u32,
    /// The oplog head once the operator recreated the dropped collection (and restarted the
    /// stream): from then on an `Invalidated` halt excuses nothing.
    recreated_after: Option<u64>,
}

async fn simulate(schedule: &Schedule, opts: SimOptions) -> Result<SeedOutcome, SimError> {
    let memory = MemoryBackend::new();
    let coll = memory.collection(COLLECTION);
    for k in &schedule.initial_keys {
        let _ = coll.insert_one(doc! {"_id": *k, "n": 0i64, "status": "NEW"});
    }
    let world = World::new(schedule.seed, schedule.settings.clone());
    let leader = schedule.settings.leader;
    let shared = schedule.settings.shared_checkpoint;
    let instances = match (leader, shared) {
        (Some(l), _) => l.instances,
        (None, true) => 2,
        (None, false) => 1,
    };
    let slots = (0..instances)
        .map(|i| Slot {
            // Shared-checkpoint runtimes configure no identity: the id only tags the trace.
            id: if leader.is_some() {
                format!("i{i}")
            } else if shared {
                format!("s{i}")
            } else {
                String::new()
            },
            generation: 0,
            runtime: None,
            inc: 0,
        })
        .collect();
    let mut sim = Sim {
        schedule,
        opts,
        world: world.clone(),
        memory,
        def: definition(&schedule.settings),
        leader,
        slots,
        next_inc: 1,
        recreated_after: None,
    };
    {
        let mut w = world.lock();
        w.sabotage = opts.sabotage;
        w.stats.seeds = 1;
        w.stats.fault_free_seeds = u64::from(schedule.is_fault_free());
        w.stats.multi_instance_seeds = u64::from(leader.is_some());
        w.stats.shared_checkpoint_seeds = u64::from(shared);
        w.log(format!(
            "seed {} settings {:?}",
            schedule.seed, schedule.settings
        ));
    }
    for i in 0..sim.slots.len() {
        sim.start(i).await?;
    }
    let t0 = tokio::time::Instant::now();
    while world.lock().start_seq.is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            return Err(SimError::NeverStarted(schedule.seed));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for step in &schedule.steps {
        sim.step(step).await?;
    }
    sim.drain().await?;
    Ok(sim.finish().await)
}

impl Sim<'_> {
    fn log(&self, msg: impl AsRef<str>) {
        self.world.lock().log(msg);
    }

    /// Two runtimes share one checkpoint (no identity, the checkpoint guard).
    fn shared(&self) -> bool {
        self.schedule.settings.shared_checkpoint
    }

    fn poll(&self) -> Duration {
        Duration::from_secs(self.leader.map(|l| l.poll_secs).unwrap_or(0))
    }

    /// The source and stores of one runtime, wrapped so that each write names its runtime.
    fn backend_for(&self, inc: u32) -> Backend {
        let (world, memory) = (self.world.clone(), self.memory.clone());
        Backend {
            source: Arc::new(RecSource {
                world: world.clone(),
                memory: memory.clone(),
                inc,
            }),
            checkpoints: Arc::new(RecCheckpoints {
                world: world.clone(),
                memory: memory.clone(),
                inc,
            }),
            dead_letters: Some(Arc::new(RecDeadLetters {
                world: world.clone(),
                memory: memory.clone(),
                inc,
            })),
            // Single-instance runs have no lease store (the stream is `AllInstances`); shared-
            // checkpoint runs have one, for the checkpoint guard.
            leases: (self.leader.is_some() || self.shared()).then(|| {
                Arc::new(RecLeases {
                    world,
                    memory: memory.clone(),
                    inc,
                }) as Arc<dyn LeaseStore>
            }),
            default_database: memory.default_database(),
        }
    }

    /// Starts a runtime in slot `i`.
    async fn start(&mut self, i: usize) -> Result<(), SimError> {
        let s = &self.schedule.settings;
        let inc = self.next_inc;
        self.next_inc += 1;
        let id = self.slots[i].id.clone();
        let multi = self.leader.is_some() || self.shared();
        let tag = if multi {
            format!("[{id} #{inc}] ")
        } else {
            String::new()
        };
        self.world.lock().incs.insert(
            inc,
            Incarnation {
                id: id.clone(),
                tag: tag.clone(),
                ended: None,
            },
        );
        let handler = SimHandler {
            world: self.world.clone(),
            inc,
        };
        let mut builder = flowwarden::builder()
            .discover(false)
            .any_stream(AnyStream::with_definition(handler, self.def))
            .backend(self.backend_for(inc))
            .seed(if multi {
                self.schedule.seed ^ mix(u64::from(inc))
            } else {
                self.schedule.seed
            })
            .max_await(Duration::from_millis(s.max_await_ms))
            .batch_size(s.batch_size)
            .shutdown_timeout(Duration::from_millis(s.shutdown_timeout_ms))
            .dead_letter_write_attempts(s.dead_letter_write_attempts)
            .checkpoint_on_receipt(self.opts.checkpoint_on_receipt);
        if self.leader.is_some() {
            builder = builder.instance_id(id);
        } else if self.shared() {
            // Unconfigured, as generated for each new process, but deterministic.
            builder = builder
                .checkpoint_guard(SHARED_GUARD)
                .instance_identity(flowwarden::InstanceId::unconfigured(format!("{id}-p{inc}")));
        }
        let rt = builder.start().await?;
        {
            let mut w = self.world.lock();
            w.handles.insert(inc, rt.handle());
            w.stats.runtimes += 1;
            w.log(format!("{tag}runtime started"));
        }
        self.slots[i].runtime = Some(rt);
        self.slots[i].inc = inc;
        Ok(())
    }

    /// Accounts for a runtime that ended (crash or shutdown) and checks invariant 5 on it.
    fn ended(&mut self, inc: u32, how: &str, status: Option<StreamStatus>) {
        let mut w = self.world.lock();
        w.handles.remove(&inc);
        if let Some(i) = w.incs.get_mut(&inc) {
            i.ended = Some(tokio::time::Instant::now());
        }
        let tag = w.tag(inc);
        let Some(st) = status else { return };
        let c = &st.counters;
        w.log(format!(
            "{tag}runtime ended ({how}): state {:?}, halt {:?}, received {} handled {} filtered {} unrouted {} retried {} dead-lettered {} redelivered {} restarts {} history_lost {} checkpoints {} (failed {})",
            st.state,
            st.halt.as_ref().map(|h| format!("{:?}: {}", h.reason, h.message)),
            c.received, c.handled, c.filtered, c.unrouted, c.retried, c.dead_lettered, c.redelivered, c.restarts, c.history_lost, c.checkpoints_saved, c.checkpoint_failures
        ));
        w.history_lost_finished += c.history_lost;
        w.stats.redeliveries += c.redelivered;
        if st
            .halt
            .as_ref()
            .is_some_and(|h| h.reason == HaltReason::SharedCheckpoint)
        {
            w.stats.shared_checkpoint_halts += 1;
        }
        if let Some(h) = &st.halt {
            if h.reason == HaltReason::HistoryLost && st.state != StreamState::HistoryLost {
                w.violate(
                    Invariant::TruthfulState,
                    format!("halted for lost history but the state is {:?}", st.state),
                );
            }
            if h.runbook.is_empty() {
                w.violate(
                    Invariant::TruthfulState,
                    format!("halt {:?} names no runbook", h.reason),
                );
            }
        }
        if self.schedule.settings.on_history_lost == OnHistoryLost::Fail && c.history_lost > 0 {
            w.violate(
                Invariant::TruthfulState,
                "on_history_lost = Fail, yet a history-lost gap was accepted".into(),
            );
        }
    }

    async fn crash(&mut self, i: usize) {
        if let Some(rt) = self.slots[i].runtime.take() {
            let h = rt.handle();
            h.crash().await;
            let st = h.status(STREAM);
            drop(rt);
            self.ended(self.slots[i].inc, "crash", st);
        }
    }

    async fn shutdown(&mut self, i: usize) {
        if let Some(rt) = self.slots[i].runtime.take() {
            let h = rt.handle();
            rt.shutdown().await;
            let st = h.status(STREAM);
            self.ended(self.slots[i].inc, "graceful shutdown", st);
        }
    }

    fn status(&self, i: usize) -> Option<StreamStatus> {
        self.slots[i]
            .runtime
            .as_ref()
            .and_then(|rt| rt.handle().status(STREAM))
    }

    /// The slot whose runtime acquired the stream's current lease (live or not) and still
    /// runs the stream (not halted after releasing it).
    fn leader_slot(&self) -> Option<usize> {
        let holder = self.world.lock().lease.as_ref().map(|l| l.inc)?;
        let i = self
            .slots
            .iter()
            .position(|s| s.runtime.is_some() && s.inc == holder)?;
        let ended = self
            .status(i)
            .is_none_or(|s| matches!(s.state, StreamState::Stopped | StreamState::HistoryLost));
        (!ended).then_some(i)
    }

    /// Runtimes (other than slot `except`) standing by now.
    fn standbys(&self, except: Option<usize>) -> Vec<u32> {
        (0..self.slots.len())
            .filter(|i| Some(*i) != except)
            .filter(|i| {
                self.status(*i)
                    .is_some_and(|s| s.state == StreamState::Standby)
            })
            .map(|i| self.slots[i].inc)
            .collect()
    }

    /// Expects a takeover after `what` happened to the leader in slot `i` (runtime `inc`),
    /// unless another runtime already holds the lease.
    fn expect_takeover(&self, what: &str, inc: u32, standbys: Vec<u32>) {
        let mut w = self.world.lock();
        if w.lease.as_ref().is_some_and(|l| l.inc != inc) {
            w.log(format!("{what}: the lease is already with another runtime"));
            return;
        }
        w.expect_takeover(what.to_owned(), standbys, self.poll());
    }

    fn write(&self, step: &Step) {
        let coll = self.memory.collection(COLLECTION);
        let before = self.memory.oplog_head();
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
                let _ =
                    coll.insert_one(doc! {"_id": *key, "n": value(*n, *bad), "status": *status});
                (Some(*key), Op::Insert, Some(*status))
            }
            Step::Update { key, n } => {
                let _ = coll.update_one(doc! {"_id": *key}, doc! {"$set": {"n": *n}});
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
                    doc! {"n": value(*n, *bad), "status": *status},
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

    async fn step(&mut self, step: &Step) -> Result<(), SimError> {
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
    fn sample_running(&self) {
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

    fn thaw_all(&self) {
        let f = self.memory.faults();
        let mut w = self.world.lock();
        for id in std::mem::take(&mut w.frozen) {
            f.thaw_lease_renewals(&id);
        }
        w.cut_off.clear();
        w.slow_lease.clear();
    }

    /// Whether every checked change up to the head is accounted for.
    fn caught_up(&self) -> bool {
        let head = self.memory.oplog_head();
        let w = self.world.lock();
        let done = w.checked_changes(head).all(|c| w.accounted(c));
        done
    }

    /// Multi-instance: exactly one runtime is `Running` holding the live lease; every other
    /// runtime that is up stands by.
    fn leadership_settled(&self) -> bool {
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
    fn ended_halted(status: &StreamStatus) -> Option<HaltReason> {
        let h = status.halt.as_ref()?;
        matches!(
            status.state,
            StreamState::Stopped | StreamState::HistoryLost
        )
        .then_some(h.reason)
    }

    /// No more faults: wait until the stream caught up (and, with several instances, one
    /// leads and the others stand by) or halted loudly; an operator restarts a runtime whose
    /// stream halted for a transient reason (store or source unavailable), up to 12 times.
    async fn drain(&mut self) -> Result<(), SimError> {
        self.log("drain: no more faults");
        let f = self.memory.faults();
        f.set_read_delay(None);
        f.set_checkpoint_save_delay(None);
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

    /// Crash, restart and graceful restart when two runtimes share one checkpoint: they act on
    /// the runtime that consumes (holds the guard). After a crash the orchestrator restarts the
    /// sibling that halted `SharedCheckpoint`, which takes over once the crashed guard expires.
    async fn shared_step(&mut self, step: &Step) -> Result<(), SimError> {
        let consumer = self.leader_slot();
        match step {
            Step::Crash => {
                let Some(c) = consumer else {
                    self.log("no consuming runtime to crash");
                    return Ok(());
                };
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

    /// Shared checkpoint: exactly one runtime consumes, holding the live guard; every other
    /// runtime that is up halted `SharedCheckpoint`.
    fn shared_settled(&self) -> bool {
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
    async fn recreate_and_restart(&mut self) -> Result<(), SimError> {
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

    /// Graceful shutdown, then invariants 1, 4, 5 and 10 over the whole run.
    async fn finish(mut self) -> SeedOutcome {
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
                        halt.as_ref().map(|h| format!("{:?}: {}", h.reason, h.message))
                    ),
                );
            }
        }

        if let Some(after) = self.recreated_after {
            if w.checked_changes(head)
                .filter(|c| c.seq > after)
                .all(|c| w.accounted(c))
            {
                w.stats.recreated_read += 1;
            }
        }

        // Invariant 5: a source that cannot tell its oldest position leaves
        // ResumeFromOplogStart nothing to restart at: the stream must show HistoryLost.
        if w.stats.oldest_unknown_refusals > 0
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

        // Invariant 4: without faults, each change is handled at most once.
        if self.schedule.is_fault_free() {
            let dups: Vec<u64> = w
                .successes
                .iter()
                .filter(|(_, v)| **v > 1)
                .map(|(s, _)| *s)
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
