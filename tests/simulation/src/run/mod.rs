//! Running a schedule on the real runtime, draining, and the end-of-run invariants.
//!
//! By concept: this module sets a run up and owns its runtimes (start, crash, shutdown);
//! `steps` applies the schedule's writes and faults; `drain` waits, with the operator's
//! restarts, until the stream caught up; `finish` checks the end-of-run invariants.

mod drain;
mod finish;
mod steps;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Once};
use std::time::Duration;

use bson::{doc, Bson};
use flowwarden::port::{LeaseStore, TransactionStore};
use flowwarden::{
    AnyStream, Backend, ConcurrencyConfig, Deployment, HaltReason, LeaseConfig, MemoryBackend,
    MemoryTransactions, OnHistoryLost, RestartConfig, RetryConfig, Runtime, StartPosition,
    StreamDefinition, StreamState, StreamStatus,
};

use crate::rng::mix;
use crate::schedule::{LeaderSettings, Schedule, Settings, Step};
use crate::world::{
    self, token_seq, Incarnation, Op, RecCheckpoints, RecDeadLetters, RecLeases, RecSource,
    RecTransactions, SimHandler, World,
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
    shrink_for(schedule, opts, budget, None)
}

/// [`shrink`], keeping `invariant` failing (`None`: the first one the schedule violates).
pub fn shrink_for(
    schedule: &Schedule,
    opts: &SimOptions,
    budget: usize,
    invariant: Option<Invariant>,
) -> Result<(Schedule, SeedOutcome), SimError> {
    let mut best_out = run_schedule(schedule, opts)?;
    let mut best = schedule.clone();
    let first = best_out.violations.first().map(|v| v.invariant);
    let Some(target) = invariant.or(first) else {
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

/// A halt message without the wall-clock time an initial snapshot's halt names ("began at
/// <date> and"): the trace stays the same on every replay.
pub(super) fn without_wall_clock(message: &str) -> String {
    const FROM: &str = "began at ";
    let Some(at) = message.find(FROM).map(|i| i + FROM.len()) else {
        return message.to_owned();
    };
    match message[at..].find(" and ") {
        Some(end) => format!("{}<time>{}", &message[..at], &message[at + end..]),
        None => message.to_owned(),
    }
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
    if s.snapshot.is_some() {
        d.checkpoint.start_position = StartPosition::Snapshot;
    }
    d.transactional = s.transactional.is_some();
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
    d.concurrency = ConcurrencyConfig {
        concurrency: s.concurrency,
        max_in_flight: 0,
    };
    if let Some(l) = s.leader {
        d.deployment = Deployment::SingleLeader(LeaseConfig {
            lease_secs: l.lease_secs,
            renew_secs: l.renew_secs,
            standby_poll_secs: l.poll_secs,
        });
    }
    let key = format!(
        "{:?}{:?}{:?}{:?}{:?}{}",
        d.checkpoint, d.retry, d.restart, d.deployment, d.concurrency, d.transactional
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
    let snapshot = schedule.settings.snapshot.as_ref();
    let world = World::new(schedule.seed, schedule.settings.clone());
    for k in &schedule.initial_keys {
        // Every written document carries the sequence of its write (`v`), which the snapshot
        // checks use as its version.
        let v = memory.oplog_head() as i64 + 1;
        let unusual = snapshot.and_then(|s| s.unusual.iter().find(|u| u.0 == *k));
        let (n, status) = match unusual {
            Some((_, status, true)) => (Bson::String("bad-0".into()), *status),
            Some((_, status, false)) => (Bson::Int64(0), *status),
            None => (Bson::Int64(0), "NEW"),
        };
        if status == "hidden" {
            world.lock().snap.hidden.insert(*k);
        }
        let _ = coll.insert_one(doc! {"_id": *k, "n": n, "status": status, "v": v});
    }
    if let Some(s) = snapshot {
        // The documents were there long before the stream started (or, with no document,
        // the backend stayed empty for a while).
        tokio::time::sleep(Duration::from_millis(s.start_delay_ms)).await;
    }
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
        w.stats.concurrent_seeds = u64::from(schedule.settings.concurrency > 1);
        w.stats.in_process_read_seeds = u64::from(schedule.settings.read_in_process);
        w.stats.shared_checkpoint_seeds = u64::from(shared);
        w.stats.snapshot_seeds = u64::from(snapshot.is_some());
        w.stats.transactional_seeds = u64::from(schedule.is_transactional());
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
    pub(super) fn log(&self, msg: impl AsRef<str>) {
        self.world.lock().log(msg);
    }

    /// Two runtimes share one checkpoint (no identity, the checkpoint guard).
    pub(super) fn shared(&self) -> bool {
        self.schedule.settings.shared_checkpoint
    }

    pub(super) fn poll(&self) -> Duration {
        Duration::from_secs(self.leader.map(|l| l.poll_secs).unwrap_or(0))
    }

    /// The source and stores of one runtime, wrapped so that each write names its runtime.
    pub(super) fn backend_for(&self, inc: u32) -> Backend {
        let (world, memory) = (self.world.clone(), self.memory.clone());
        let checkpoints = Arc::new(RecCheckpoints {
            world: world.clone(),
            memory: memory.clone(),
            inc,
        });
        // A transactional stream's commits write its checkpoint: recorded by this wrapper,
        // whose `checkpoints()` is the recording store above.
        let transactions = self.schedule.is_transactional().then(|| {
            Arc::new(RecTransactions {
                world: world.clone(),
                memory: memory.clone(),
                inc,
                inner: MemoryTransactions::new(memory.clone()),
                checkpoints: checkpoints.clone(),
            }) as Arc<dyn TransactionStore>
        });
        Backend {
            source: Arc::new(RecSource {
                world: world.clone(),
                memory: memory.clone(),
                inc,
            }),
            checkpoints,
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
            transactions,
            default_database: memory.default_database(),
        }
    }

    /// Starts a runtime in slot `i`.
    pub(super) async fn start(&mut self, i: usize) -> Result<(), SimError> {
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
            .checkpoint_on_receipt(self.opts.checkpoint_on_receipt)
            .checkpoint_highest_completed(self.opts.checkpoint_highest_completed)
            .unkeyed_concurrency(self.opts.unkeyed_concurrency)
            .snapshot_start_after_scan(self.opts.snapshot_start_after_scan)
            .snapshot_rescan_from_zero(self.opts.snapshot_rescan_from_zero)
            .checkpoint_outside_transaction(self.opts.checkpoint_outside_transaction)
            .no_freeze_after_unknown_outcome(self.opts.no_freeze_after_unknown_outcome)
            // Lag sampling observes, it decides nothing; off, so that schedules (and the seeds
            // of known regressions) replay exactly as recorded.
            .lag_sampling(flowwarden::LagConfig {
                interval: Duration::ZERO,
                ..flowwarden::LagConfig::default()
            });
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
    pub(super) fn ended(&mut self, inc: u32, how: &str, status: Option<StreamStatus>) {
        let mut w = self.world.lock();
        w.handles.remove(&inc);
        if let Some(i) = w.incs.get_mut(&inc) {
            i.ended = Some(tokio::time::Instant::now());
        }
        let tag = w.tag(inc);
        w.unanswered(inc);
        let Some(st) = status else { return };
        if how == "graceful shutdown" {
            w.on_graceful_end(inc);
        }
        let c = &st.counters;
        w.log(format!(
            "{tag}runtime ended ({how}): state {:?}, halt {:?}, received {} handled {} filtered {} unrouted {} retried {} dead-lettered {} redelivered {} restarts {} history_lost {} checkpoints {} (failed {})",
            st.state,
            st.halt.as_ref().map(|h| format!("{:?}: {}", h.reason, without_wall_clock(&h.message))),
            c.received, c.handled, c.filtered, c.unrouted, c.retried, c.dead_lettered, c.redelivered, c.restarts, c.history_lost, c.checkpoints_saved, c.checkpoint_failures
        ));
        if self.schedule.is_transactional() {
            w.log(format!(
                "{tag}transactions: {} committed, {} run again",
                c.transactions_committed, c.transactions_retried
            ));
        }
        w.history_lost_finished += c.history_lost;
        w.stats.transient_reruns += c.transactions_retried;
        let first = self.memory.oplog_first_retained();
        w.on_snapshot_runtime_end(inc, st.halt.as_ref(), first);
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

    pub(super) async fn crash(&mut self, i: usize) {
        if let Some(rt) = self.slots[i].runtime.take() {
            let h = rt.handle();
            h.crash().await;
            let st = h.status(STREAM);
            drop(rt);
            self.ended(self.slots[i].inc, "crash", st);
        }
    }

    pub(super) async fn shutdown(&mut self, i: usize) {
        if let Some(rt) = self.slots[i].runtime.take() {
            let h = rt.handle();
            rt.shutdown().await;
            let st = h.status(STREAM);
            self.ended(self.slots[i].inc, "graceful shutdown", st);
        }
    }

    pub(super) fn status(&self, i: usize) -> Option<StreamStatus> {
        self.slots[i]
            .runtime
            .as_ref()
            .and_then(|rt| rt.handle().status(STREAM))
    }

    /// The slot whose runtime acquired the stream's current lease (live or not) and still
    /// runs the stream (not halted after releasing it).
    pub(super) fn leader_slot(&self) -> Option<usize> {
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
    pub(super) fn standbys(&self, except: Option<usize>) -> Vec<u32> {
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
    pub(super) fn expect_takeover(&self, what: &str, inc: u32, standbys: Vec<u32>) {
        let mut w = self.world.lock();
        if w.lease.as_ref().is_some_and(|l| l.inc != inc) {
            w.log(format!("{what}: the lease is already with another runtime"));
            return;
        }
        w.expect_takeover(what.to_owned(), standbys, self.poll());
    }
}
