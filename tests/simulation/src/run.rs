//! Running a schedule on the real runtime, draining, and the end-of-run invariants.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Once};
use std::time::Duration;

use bson::{doc, Bson};
use flowwarden::{
    AnyStream, Backend, HaltReason, MemoryBackend, OnHistoryLost, RestartConfig, RetryConfig,
    Runtime, StreamDefinition, StreamState, StreamStatus,
};

use crate::schedule::{Schedule, Settings, Step};
use crate::world::{
    self, token_seq, Op, RecCheckpoints, RecDeadLetters, RecSource, SimHandler, World,
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
    let key = format!("{:?}{:?}{:?}", d.checkpoint, d.retry, d.restart);
    DEFINITIONS.with(|m| {
        *m.borrow_mut()
            .entry(key)
            .or_insert_with(|| Box::leak(Box::new(d)))
    })
}

struct Sim<'a> {
    schedule: &'a Schedule,
    opts: SimOptions,
    world: Arc<World>,
    memory: MemoryBackend,
    backend: Backend,
    def: &'static StreamDefinition,
    runtime: Option<Runtime>,
    last_status: Option<StreamStatus>,
}

async fn simulate(schedule: &Schedule, opts: SimOptions) -> Result<SeedOutcome, SimError> {
    let memory = MemoryBackend::new();
    let coll = memory.collection(COLLECTION);
    for k in &schedule.initial_keys {
        let _ = coll.insert_one(doc! {"_id": *k, "n": 0i64, "status": "NEW"});
    }
    let world = World::new(schedule.seed, schedule.settings.clone());
    let backend = Backend {
        source: Arc::new(RecSource {
            world: world.clone(),
            memory: memory.clone(),
        }),
        checkpoints: Arc::new(RecCheckpoints {
            world: world.clone(),
            memory: memory.clone(),
        }),
        dead_letters: Some(Arc::new(RecDeadLetters {
            world: world.clone(),
            memory: memory.clone(),
        })),
        // One instance per schedule: no leader election is simulated yet.
        leases: None,
        default_database: memory.default_database(),
    };
    let mut sim = Sim {
        schedule,
        opts,
        world: world.clone(),
        memory,
        backend,
        def: definition(&schedule.settings),
        runtime: None,
        last_status: None,
    };
    {
        let mut w = world.lock();
        w.stats.seeds = 1;
        w.stats.fault_free_seeds = u64::from(schedule.is_fault_free());
        w.log(format!(
            "seed {} settings {:?}",
            schedule.seed, schedule.settings
        ));
    }
    sim.start().await?;
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

    async fn start(&mut self) -> Result<(), SimError> {
        let s = &self.schedule.settings;
        let handler = SimHandler {
            world: self.world.clone(),
        };
        let rt = flowwarden::builder()
            .discover(false)
            .any_stream(AnyStream::with_definition(handler, self.def))
            .backend(self.backend.clone())
            .seed(self.schedule.seed)
            .max_await(Duration::from_millis(s.max_await_ms))
            .batch_size(s.batch_size)
            .shutdown_timeout(Duration::from_millis(s.shutdown_timeout_ms))
            .dead_letter_write_attempts(s.dead_letter_write_attempts)
            .__checkpoint_on_receipt(self.opts.checkpoint_on_receipt)
            .start()
            .await?;
        {
            let mut w = self.world.lock();
            w.handle = Some(rt.handle());
            w.stats.runtimes += 1;
            w.log("runtime started");
        }
        self.runtime = Some(rt);
        Ok(())
    }

    /// Accounts for a runtime that ended (crash or shutdown) and checks invariant 5 on it.
    fn ended(&mut self, how: &str, status: Option<StreamStatus>) {
        let mut w = self.world.lock();
        w.handle = None;
        let Some(st) = status else { return };
        let c = &st.counters;
        w.log(format!(
            "runtime ended ({how}): state {:?}, halt {:?}, received {} handled {} filtered {} unrouted {} retried {} dead-lettered {} redelivered {} restarts {} history_lost {} checkpoints {} (failed {})",
            st.state,
            st.halt.as_ref().map(|h| format!("{:?}: {}", h.reason, h.message)),
            c.received, c.handled, c.filtered, c.unrouted, c.retried, c.dead_lettered, c.redelivered, c.restarts, c.history_lost, c.checkpoints_saved, c.checkpoint_failures
        ));
        w.history_lost_finished += c.history_lost;
        w.stats.redeliveries += c.redelivered;
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
        drop(w);
        self.last_status = Some(st);
    }

    async fn crash(&mut self) {
        if let Some(rt) = self.runtime.take() {
            let h = rt.handle();
            h.__crash().await;
            let st = h.status(STREAM);
            drop(rt);
            self.ended("crash", st);
        }
    }

    async fn shutdown(&mut self) {
        if let Some(rt) = self.runtime.take() {
            let h = rt.handle();
            rt.shutdown().await;
            let st = h.status(STREAM);
            self.ended("graceful shutdown", st);
        }
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
        if let Some(kind) = step.fault_kind() {
            let mut w = self.world.lock();
            *w.stats.faults.entry(kind).or_default() += 1;
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
                flowwarden::SourceErrorKind::Resumable,
                "injected open failure",
            ),
            Step::Crash => self.crash().await,
            Step::Restart if self.runtime.is_none() => self.start().await?,
            Step::GracefulRestart => {
                self.shutdown().await;
                self.start().await?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether every checked change up to the head is accounted for.
    fn caught_up(&self) -> bool {
        let head = self.memory.oplog_head();
        let w = self.world.lock();
        let done = w.checked_changes(head).all(|c| w.accounted(c));
        done
    }

    /// No more faults: wait until the stream caught up or halted; an operator restarts a
    /// stream halted for a transient reason (store or source unavailable) up to 12 times.
    async fn drain(&mut self) -> Result<(), SimError> {
        self.log("drain: no more faults");
        let f = self.memory.faults();
        f.set_read_delay(None);
        f.set_checkpoint_save_delay(None);
        if self.runtime.is_none() {
            self.start().await?;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(900);
        let mut operator_restarts = 0;
        loop {
            if self.caught_up() {
                break;
            }
            let status = self
                .runtime
                .as_ref()
                .and_then(|rt| rt.handle().status(STREAM));
            if let Some(h) = status.as_ref().and_then(|s| s.halt.as_ref()) {
                match h.reason {
                    HaltReason::HistoryLost | HaltReason::Invalidated => break,
                    _ if operator_restarts < 12 => {
                        operator_restarts += 1;
                        self.log(format!(
                            "drain: operator restarts the stream halted by {:?}",
                            h.reason
                        ));
                        self.shutdown().await;
                        self.start().await?;
                        continue;
                    }
                    _ => break,
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

    /// Graceful shutdown, then invariants 1, 4 and 5 over the whole run.
    async fn finish(mut self) -> SeedOutcome {
        let final_status = self
            .runtime
            .as_ref()
            .and_then(|rt| rt.handle().status(STREAM));
        self.shutdown().await;
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
                Some(HaltReason::Invalidated) => {
                    drop_seq.is_some_and(|d| missing.iter().all(|s| *s > d))
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
