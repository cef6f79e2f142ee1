//! `transactional = true` streams on the in-memory backend: each event's writes commit
//! together with the checkpoint that moves past it, so every event's effects are applied
//! exactly once across crashes at every step, transient failures, lost commit replies and a
//! deposed leader. The MongoDB variant (through the driver, with process aborts) is in
//! `flowwarden-rs-mongo/tests/transactions.rs`.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, Document};
use flowwarden::port::TransactionErrorKind;
use flowwarden::{
    change_stream, checkpoint, retry, AnyStream, Backend, ChangeContext, Deployment, HaltReason,
    HandlerError, HandlerErrorKind, LeaseConfig, MemoryBackend, MemoryTransaction,
    MemoryTransactions, Runtime, StreamDefinition, StreamHandler, StreamState, TransactionStep,
};
use futures::future::{BoxFuture, FutureExt};
use support::{init_logs, wait_status, wait_until};
use tokio::sync::Notify;

/// Where the projector's handler stops (and waits forever) so the test can crash the runtime
/// there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    BeforeWrites,
    BetweenWrites,
}

/// What the test makes the projector do.
#[derive(Default)]
struct Script {
    /// Stop once in the event of this `_id`, at this point.
    stop: Mutex<Option<(i32, Stop)>>,
    reached: Notify,
    /// Fail the first attempt of the event of this `_id` (after writing).
    fail_once: Mutex<Option<i32>>,
    /// Sleep this long in every attempt.
    sleep: Mutex<Option<Duration>>,
    calls: AtomicU32,
}

impl Script {
    async fn maybe_stop(&self, id: i32, at: Stop) {
        let hit = {
            let mut stop = self.stop.lock().unwrap();
            let hit = *stop == Some((id, at));
            if hit {
                *stop = None;
            }
            hit
        };
        if hit {
            self.reached.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

/// Projects every change of `orders`: one `effects` document per event (its `n` counts how
/// many times the event's writes were applied) and a running total, in two writes.
struct Projector {
    script: Arc<Script>,
}

#[change_stream(name = "projector", collection = "orders", transactional = true)]
#[checkpoint(save_every_n = 1, save_interval_secs = 1)]
#[retry(max_attempts = 2, initial_delay_ms = 10, jitter = false)]
impl Projector {
    #[on_change]
    async fn project(
        &self,
        ctx: &ChangeContext<Document>,
        tx: &MemoryTransaction,
    ) -> Result<(), HandlerError> {
        let s = &self.script;
        s.calls.fetch_add(1, Ordering::SeqCst);
        let id = ctx
            .document_key()
            .and_then(|k| k.get_i32("_id").ok())
            .unwrap_or(-1);
        let sleep = *s.sleep.lock().unwrap();
        if let Some(d) = sleep {
            tokio::time::sleep(d).await;
        }
        s.maybe_stop(id, Stop::BeforeWrites).await;
        tx.upsert_one(
            "effects",
            doc! {"_id": ctx.event_id().as_str()},
            doc! {"$inc": {"n": 1}, "$set": {"order": id}},
        )?;
        s.maybe_stop(id, Stop::BetweenWrites).await;
        tx.upsert_one("totals", doc! {"_id": "all"}, doc! {"$inc": {"n": 1}})?;
        let fail = {
            let mut f = s.fail_once.lock().unwrap();
            let hit = *f == Some(id);
            if hit {
                *f = None;
            }
            hit
        };
        if fail {
            return Err(HandlerError::msg("fails once after writing"));
        }
        Ok(())
    }
}

const NAME: &str = "projector";

fn projector(script: &Arc<Script>) -> Projector {
    Projector {
        script: script.clone(),
    }
}

/// The projector's definition changed by `f`.
fn def_with(f: impl FnOnce(&mut StreamDefinition)) -> &'static StreamDefinition {
    let mut d = Projector::definition().clone();
    f(&mut d);
    Box::leak(Box::new(d))
}

async fn start_on(
    backend: impl Into<Backend>,
    stream: AnyStream,
    configure: impl FnOnce(flowwarden::Builder) -> flowwarden::Builder,
) -> Runtime {
    init_logs();
    let name = stream.definition().name;
    let b = flowwarden::builder()
        .discover(false)
        .any_stream(stream)
        .backend(backend)
        .seed(7)
        .max_await(Duration::from_millis(200))
        .shutdown_timeout(Duration::from_secs(5));
    let rt = configure(b).start().await.expect("runtime starts");
    wait_status(&rt, name, |s| s.state != StreamState::Starting).await;
    rt
}

async fn start(backend: &MemoryBackend, script: &Arc<Script>) -> Runtime {
    start_on(backend.clone(), AnyStream::new(projector(script)), |b| b).await
}

/// A transaction-step hook that holds the stream at the `nth` (0-based) time it reaches `step`:
/// it notifies `reached`, then waits for `release` (forever without one, until the test crashes
/// the runtime).
fn hold_at(
    step: Option<TransactionStep>,
    nth: u32,
    reached: &Arc<Notify>,
    release: Option<&Arc<Notify>>,
) -> impl Fn(TransactionStep) -> BoxFuture<'static, ()> + Send + Sync + 'static {
    let seen = Arc::new(AtomicU32::new(0));
    let (reached, release) = (reached.clone(), release.cloned());
    move |s| {
        if Some(s) == step && seen.fetch_add(1, Ordering::SeqCst) == nth {
            let (reached, release) = (reached.clone(), release.clone());
            return async move {
                reached.notify_one();
                match release {
                    Some(r) => r.notified().await,
                    None => std::future::pending().await,
                }
            }
            .boxed();
        }
        futures::future::ready(()).boxed()
    }
}

/// `effects` as order `_id` → how many times its event's writes were applied.
fn effects(backend: &MemoryBackend) -> BTreeMap<i32, i32> {
    backend
        .collection("effects")
        .find(doc! {})
        .unwrap()
        .into_iter()
        .map(|d| (d.get_i32("order").unwrap(), d.get_i32("n").unwrap()))
        .collect()
}

fn total(backend: &MemoryBackend) -> i32 {
    backend
        .collection("totals")
        .find_one(doc! {"_id": "all"})
        .unwrap()
        .map_or(0, |d| d.get_i32("n").unwrap())
}

fn insert(backend: &MemoryBackend, ids: std::ops::RangeInclusive<i32>) {
    let c = backend.collection("orders");
    for i in ids {
        c.insert_one(doc! {"_id": i}).unwrap();
    }
}

/// Every order of `1..=n` applied exactly once, and the total agrees.
fn assert_exactly_once(backend: &MemoryBackend, n: i32) {
    let e = effects(backend);
    let expected: BTreeMap<i32, i32> = (1..=n).map(|i| (i, 1)).collect();
    assert_eq!(e, expected, "each event's writes applied exactly once");
    assert_eq!(
        total(backend),
        n,
        "the running total counts each event once"
    );
}

fn stored_processed(backend: &MemoryBackend) -> Option<String> {
    backend
        .checkpoint_document(NAME)
        .and_then(|d| d.get_document("lastProcessedToken").ok().cloned())
        .and_then(|t| t.get_str("_data").ok().map(str::to_owned))
}

#[tokio::test(start_paused = true)]
async fn writes_and_checkpoint_commit_together() {
    let backend = MemoryBackend::new();
    let script = Arc::new(Script::default());
    let rt = start(&backend, &script).await;
    insert(&backend, 1..=20);
    let st = wait_status(&rt, NAME, |s| s.counters.handled == 20).await;
    assert_exactly_once(&backend, 20);
    assert_eq!(st.counters.transactions_committed, 20);
    assert_eq!(st.counters.transactions_retried, 0);
    // The checkpoint was written by each commit: it names the last event already.
    let last = format!("{:016X}", backend.oplog_head() - 20);
    assert!(stored_processed(&backend).is_some());
    assert_ne!(stored_processed(&backend), Some(last));
    rt.shutdown().await;
    assert_exactly_once(&backend, 20);
}

/// Crashes the runtime while event 3 is at `step`, restarts it, and checks that every event's
/// writes are applied exactly once.
async fn crash_at(step: &str) {
    let backend = MemoryBackend::new();
    let script = Arc::new(Script::default());
    let reached = Arc::new(Notify::new());
    let hook_step = match step {
        "before-writes" => {
            *script.stop.lock().unwrap() = Some((3, Stop::BeforeWrites));
            None
        }
        "between-writes" => {
            *script.stop.lock().unwrap() = Some((3, Stop::BetweenWrites));
            None
        }
        "before-commit" => Some(TransactionStep::BeforeCommit),
        "after-commit" => Some(TransactionStep::AfterCommit),
        other => panic!("unknown step {other}"),
    };
    // The third event's step: hold the stream there until the crash.
    let hook = hold_at(hook_step, 2, &reached, None);
    let rt = start_on(
        backend.clone(),
        AnyStream::new(projector(&script)),
        move |b| b.on_transaction_step(hook),
    )
    .await;
    insert(&backend, 1..=6);
    if hook_step.is_some() {
        reached.notified().await;
    } else {
        script.reached.notified().await;
    }
    rt.handle().crash().await;
    let before = effects(&backend);
    match step {
        // Nothing of event 3 is committed before the commit returns.
        "before-writes" | "between-writes" | "before-commit" => {
            assert_eq!(
                before.keys().copied().collect::<Vec<_>>(),
                vec![1, 2],
                "{step}"
            )
        }
        // The commit applied (writes and checkpoint), the runtime never recorded it.
        _ => assert_eq!(
            before.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3],
            "{step}"
        ),
    }

    let again = Arc::new(Script::default());
    let rt = start(&backend, &again).await;
    wait_until("every event applied", || effects(&backend).len() == 6).await;
    rt.shutdown().await;
    assert_exactly_once(&backend, 6);
    let redone = again.calls.load(Ordering::SeqCst);
    match step {
        "after-commit" => assert_eq!(redone, 3, "events 4..=6 only: 3 is not redelivered"),
        _ => assert_eq!(redone, 4, "events 3..=6: 3 runs again"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_crash_before_the_handlers_writes_applies_each_event_once() {
    crash_at("before-writes").await;
}

#[tokio::test(start_paused = true)]
async fn a_crash_between_the_handlers_writes_applies_each_event_once() {
    crash_at("between-writes").await;
}

#[tokio::test(start_paused = true)]
async fn a_crash_before_the_commit_applies_each_event_once() {
    crash_at("before-commit").await;
}

#[tokio::test(start_paused = true)]
async fn a_crash_after_the_commit_before_it_is_recorded_applies_each_event_once() {
    crash_at("after-commit").await;
}

/// The checker can fail: with the checkpoint written outside the transaction (after the
/// commit, as a plain write), a crash between the two applies an event's writes twice.
#[tokio::test(start_paused = true)]
async fn the_checkpoint_outside_the_transaction_applies_writes_twice() {
    let backend = MemoryBackend::new();
    let script = Arc::new(Script::default());
    let reached = Arc::new(Notify::new());
    let hook = hold_at(Some(TransactionStep::AfterCommit), 2, &reached, None);
    let rt = start_on(
        backend.clone(),
        AnyStream::new(projector(&script)),
        move |b| {
            b.checkpoint_outside_transaction(true)
                .on_transaction_step(hook)
        },
    )
    .await;
    insert(&backend, 1..=6);
    reached.notified().await;
    rt.handle().crash().await;
    let rt = start(&backend, &Arc::new(Script::default())).await;
    wait_until("every event applied", || effects(&backend).len() == 6).await;
    rt.shutdown().await;
    let e = effects(&backend);
    assert_eq!(e.get(&3), Some(&2), "event 3's writes applied twice: {e:?}");
    assert_eq!(total(&backend), 7);
}

/// A graceful stop whose shutdown timeout abandons an attempt after its commit applied must
/// not write the older checkpoint over the committed one: the final flush of the settled
/// prefix (here an idle position after event 2, never written without a heartbeat) is skipped.
#[tokio::test(start_paused = true)]
async fn a_stop_that_abandons_a_committed_transaction_keeps_the_committed_checkpoint() {
    let backend = MemoryBackend::new();
    let script = Arc::new(Script::default());
    let reached = Arc::new(Notify::new());
    let d = def_with(|d| d.checkpoint.save_interval_secs = 0);
    let hook = hold_at(Some(TransactionStep::AfterCommit), 2, &reached, None);
    let rt = start_on(
        backend.clone(),
        AnyStream::with_definition(projector(&script), d),
        move |b| {
            b.shutdown_timeout(Duration::from_secs(1))
                .on_transaction_step(hook)
        },
    )
    .await;
    insert(&backend, 1..=2);
    wait_status(&rt, NAME, |s| s.counters.handled == 2).await;
    // Idle reads settle positions after event 2: the tracker has unsaved progress.
    tokio::time::sleep(Duration::from_secs(1)).await;
    insert(&backend, 3..=4);
    reached.notified().await;
    rt.shutdown().await;
    let rt = start_on(
        backend.clone(),
        AnyStream::with_definition(projector(&Arc::new(Script::default())), d),
        |b| b,
    )
    .await;
    wait_until("every event applied", || effects(&backend).len() == 4).await;
    rt.shutdown().await;
    assert_exactly_once(&backend, 4);
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempts_writes_are_discarded_and_the_retry_applies_once() {
    let backend = MemoryBackend::new();
    let script = Arc::new(Script::default());
    *script.fail_once.lock().unwrap() = Some(2);
    let rt = start(&backend, &script).await;
    insert(&backend, 1..=3);
    let st = wait_status(&rt, NAME, |s| s.counters.handled == 3).await;
    assert_eq!(st.counters.retried, 1, "one failed attempt, retried");
    assert_eq!(script.calls.load(Ordering::SeqCst), 4);
    rt.shutdown().await;
    assert_exactly_once(&backend, 3);
}

#[tokio::test(start_paused = true)]
async fn transient_commit_failures_run_the_whole_transaction_again() {
    let backend = MemoryBackend::new();
    let script = Arc::new(Script::default());
    let rt = start(&backend, &script).await;
    backend
        .faults()
        .fail_next_commits(2, TransactionErrorKind::Transient);
    insert(&backend, 1..=2);
    let st = wait_status(&rt, NAME, |s| s.counters.handled == 2).await;
    assert_eq!(st.counters.transactions_retried, 2);
    assert_eq!(st.counters.retried, 0, "not counted as failed attempts");
    assert_eq!(
        script.calls.load(Ordering::SeqCst),
        4,
        "the handler ran again with each transaction"
    );
    rt.shutdown().await;
    assert_exactly_once(&backend, 2);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_commit_result_halts_and_the_restart_goes_on_from_the_stored_checkpoint() {
    let backend = MemoryBackend::new();
    let script = Arc::new(Script::default());
    let rt = start(&backend, &script).await;
    insert(&backend, 1..=2);
    wait_status(&rt, NAME, |s| s.counters.handled == 2).await;
    // The next commit applies, then its reply is lost.
    backend
        .faults()
        .fail_next_commits(1, TransactionErrorKind::CommitUnknown);
    insert(&backend, 3..=4);
    let st = wait_status(&rt, NAME, |s| s.halt.is_some()).await;
    let halt = st.halt.unwrap();
    assert_eq!(halt.reason, HaltReason::TransactionOutcomeUnknown);
    assert_eq!(halt.runbook, "docs/runbooks/transaction-outcome-unknown.md");
    assert!(halt.message.contains("'projector'"), "{}", halt.message);
    assert_eq!(
        script.calls.load(Ordering::SeqCst),
        3,
        "the handler is not run again"
    );
    rt.shutdown().await;

    let again = Arc::new(Script::default());
    let rt = start(&backend, &again).await;
    wait_until("4 applied", || effects(&backend).len() == 4).await;
    rt.shutdown().await;
    assert_exactly_once(&backend, 4);
    assert_eq!(
        again.calls.load(Ordering::SeqCst),
        1,
        "the stored checkpoint (committed with event 3) says 3 is done"
    );
}

#[tokio::test(start_paused = true)]
async fn a_rejected_transaction_is_dead_lettered_at_once_and_applies_nothing() {
    let backend = MemoryBackend::new();
    let script = Arc::new(Script::default());
    let rt = start(&backend, &script).await;
    backend
        .faults()
        .fail_next_commits(1, TransactionErrorKind::Rejected);
    insert(&backend, 1..=2);
    let st = wait_status(&rt, NAME, |s| {
        s.counters.handled == 1 && s.counters.dead_lettered == 1
    })
    .await;
    assert_eq!(
        st.counters.retried, 0,
        "a rejected transaction is not retried"
    );
    let records = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].error_kind, "TransactionRejected");
    assert_eq!(
        records[0].document_key.as_ref().and_then(|k| k.get("_id")),
        Some(&Bson::Int32(1))
    );
    rt.shutdown().await;
    assert_eq!(
        effects(&backend).keys().copied().collect::<Vec<_>>(),
        vec![2]
    );

    // Replayed, the dead letter runs in a transaction of its own.
    let rt = start(&backend, &script).await;
    rt.handle()
        .dead_letters()
        .replay(&records[0].id)
        .await
        .expect("replay commits");
    rt.shutdown().await;
    assert_exactly_once(&backend, 2);
}

#[tokio::test(start_paused = true)]
async fn a_handler_past_the_lifetime_limit_fails_loudly_and_commits_nothing() {
    let memory = MemoryBackend::new();
    let script = Arc::new(Script::default());
    *script.sleep.lock().unwrap() = Some(Duration::from_secs(3));
    let backend = Backend {
        transactions: Some(Arc::new(
            MemoryTransactions::new(memory.clone()).with_lifetime_limit(Duration::from_secs(2)),
        )),
        ..Backend::from(memory.clone())
    };
    let rt = start_on(backend, AnyStream::new(projector(&script)), |b| b).await;
    insert(&memory, 1..=1);
    let st = wait_status(&rt, NAME, |s| s.counters.dead_lettered == 1).await;
    assert_eq!(
        st.counters.retried, 1,
        "retried per #[retry], then dead-lettered"
    );
    let records = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    let chain = records[0].error_chain.join(": ");
    assert!(chain.contains("transaction lifetime limit"), "{chain}");
    rt.shutdown().await;
    assert!(effects(&memory).is_empty(), "nothing committed");
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leaders_transaction_commits_nothing() {
    let backend = MemoryBackend::new();
    let d = def_with(|d| {
        d.name = "projector-leader";
        d.deployment = Deployment::SingleLeader(LeaseConfig {
            lease_secs: 30,
            renew_secs: 10,
            standby_poll_secs: 5,
        });
    });
    let as_instance = |id: &'static str| {
        move |b: flowwarden::Builder| b.instance_id(id).shutdown_timeout(Duration::from_secs(600))
    };
    let a_script = Arc::new(Script::default());
    *a_script.stop.lock().unwrap() = Some((2, Stop::BetweenWrites));
    // A stops between its writes in event 2 until woken: after waking it finishes, and its
    // commit must be refused.
    let rt_a = start_on(
        backend.clone(),
        AnyStream::with_definition(projector(&a_script), d),
        as_instance("a"),
    )
    .await;
    let b_script = Arc::new(Script::default());
    let rt_b = start_on(
        backend.clone(),
        AnyStream::with_definition(projector(&b_script), d),
        as_instance("b"),
    )
    .await;
    insert(&backend, 1..=2);
    a_script.reached.notified().await;
    backend.faults().freeze_lease_renewals("a");
    wait_until("B took over and applied 2", || effects(&backend).len() == 2).await;
    insert(&backend, 3..=3);
    wait_until("B applied 3", || effects(&backend).len() == 3).await;
    assert_eq!(b_script.calls.load(Ordering::SeqCst), 2);

    // A is still stuck inside event 2's transaction; it cannot be woken from here (its
    // handler waits forever), so its transaction is the deposed leader's: it must never
    // commit. Stop A (the shutdown timeout abandons the handler) and check nothing moved.
    rt_a.handle().crash().await;
    assert_exactly_once(&backend, 3);
    let cp = backend.checkpoint_document("projector-leader").unwrap();
    assert_eq!(cp.get_i64("epoch").unwrap(), 2, "B's epoch");
    rt_b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leader_that_wakes_up_is_fenced_at_its_commit() {
    let backend = MemoryBackend::new();
    let d = def_with(|d| {
        d.name = "projector-zombie";
        d.deployment = Deployment::SingleLeader(LeaseConfig {
            lease_secs: 30,
            renew_secs: 10,
            standby_poll_secs: 5,
        });
    });
    let a_script = Arc::new(Script::default());
    let gate = Arc::new(Notify::new());
    let entered = Arc::new(Notify::new());
    let hook = hold_at(
        Some(TransactionStep::BeforeCommit),
        1,
        &entered,
        Some(&gate),
    );
    // A pauses before its second commit (event 2) until the test wakes it: a long GC pause, a
    // frozen VM.
    let rt_a = start_on(
        backend.clone(),
        AnyStream::with_definition(projector(&a_script), d),
        move |b| {
            b.instance_id("a")
                .shutdown_timeout(Duration::from_secs(600))
                .on_transaction_step(hook)
        },
    )
    .await;
    let b_script = Arc::new(Script::default());
    let rt_b = start_on(
        backend.clone(),
        AnyStream::with_definition(projector(&b_script), d),
        |b| {
            b.instance_id("b")
                .shutdown_timeout(Duration::from_secs(600))
        },
    )
    .await;
    insert(&backend, 1..=2);
    entered.notified().await;
    backend.faults().freeze_lease_renewals("a");
    wait_until("B took over and applied 2", || effects(&backend).len() == 2).await;
    // A wakes and commits its transaction of event 2: fenced, nothing applied.
    gate.notify_one();
    let st = wait_status(&rt_a, "projector-zombie", |s| {
        s.state == StreamState::Standby || s.halt.is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_exactly_once(&backend, 2);
    assert!(
        st.halt
            .as_ref()
            .is_none_or(|h| h.reason == HaltReason::Fenced),
        "{st:?}"
    );
    let cp = backend.checkpoint_document("projector-zombie").unwrap();
    assert_eq!(cp.get_i64("epoch").unwrap(), 2, "B's epoch stands");
    rt_a.shutdown().await;
    rt_b.shutdown().await;
}

/// A transactional stream with an initial snapshot commits each scanned document's writes
/// with the scan's progress: a crash mid-scan applies every document once.
#[tokio::test(start_paused = true)]
async fn a_snapshot_read_commits_its_writes_with_the_scans_progress() {
    let backend = MemoryBackend::new();
    insert(&backend, 1..=5);
    let d = def_with(|d| {
        d.name = "projector-snapshot";
        d.checkpoint.start_position = flowwarden::StartPosition::Snapshot;
    });
    let script = Arc::new(Script::default());
    *script.stop.lock().unwrap() = Some((3, Stop::BetweenWrites));
    let rt = start_on(
        backend.clone(),
        AnyStream::with_definition(projector(&script), d),
        |b| b.batch_size(2),
    )
    .await;
    script.reached.notified().await;
    rt.handle().crash().await;
    assert_eq!(effects(&backend).len(), 2, "documents 1 and 2 committed");
    let stored = backend.checkpoint_document("projector-snapshot").unwrap();
    assert_eq!(stored.get_i32("snapshotLastId"), Ok(2), "{stored}");

    let again = Arc::new(Script::default());
    let rt = start_on(
        backend.clone(),
        AnyStream::with_definition(projector(&again), d),
        |b| b.batch_size(2),
    )
    .await;
    wait_until("every document read", || effects(&backend).len() == 5).await;
    insert(&backend, 6..=6);
    wait_until("then the stream", || effects(&backend).len() == 6).await;
    let st = rt.handle().status("projector-snapshot").unwrap();
    assert_eq!(st.counters.transactions_committed, 4);
    assert!(
        st.counters.checkpoints_saved >= 4,
        "each commit's checkpoint is counted: {:?}",
        st.counters
    );
    rt.shutdown().await;
    assert_exactly_once(&backend, 6);
    assert_eq!(
        again.calls.load(Ordering::SeqCst),
        4,
        "3, 4, 5 scanned, then 6"
    );
}

#[tokio::test]
async fn startup_refuses_what_cannot_be_transactional() {
    init_logs();
    let script = Arc::new(Script::default());
    // No transactions on the backend.
    let memory = MemoryBackend::new();
    let without = Backend {
        transactions: None,
        ..Backend::from(memory)
    };
    let err = flowwarden::builder()
        .discover(false)
        .stream(projector(&script))
        .backend(without)
        .start()
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("'projector' is transactional but the backend offers no transactions"),
        "{text}"
    );

    // Concurrency with a hand-changed definition.
    let d = def_with(|d| d.concurrency.concurrency = 4);
    let err = flowwarden::builder()
        .discover(false)
        .any_stream(AnyStream::with_definition(projector(&script), d))
        .backend(MemoryBackend::new())
        .start()
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("remove `concurrency = 4`"),
        "{err}"
    );

    // A backend whose handles are another type than the handler takes.
    let other = Backend {
        transactions: Some(Arc::new(ForeignTransactions(MemoryBackend::new()))),
        ..Backend::from(MemoryBackend::new())
    };
    let err = flowwarden::builder()
        .discover(false)
        .stream(projector(&script))
        .backend(other)
        .start()
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("takes a `&flowwarden::memory::transactions::MemoryTransaction`")
            || err
                .to_string()
                .contains("MemoryTransaction` but the backend's transactions"),
        "{err}"
    );
}

/// A transaction store that hands out another handle type.
struct ForeignTransactions(MemoryBackend);

#[derive(Clone)]
struct ForeignHandle;

impl flowwarden::port::TransactionHandleType for ForeignHandle {}

#[async_trait::async_trait]
impl flowwarden::port::TransactionStore for ForeignTransactions {
    async fn begin(
        &self,
        _key: &str,
    ) -> Result<Box<dyn flowwarden::port::StreamTransaction>, flowwarden::port::TransactionError>
    {
        Err(flowwarden::port::TransactionError::new(
            TransactionErrorKind::Unavailable,
            "never used",
        ))
    }
    fn checkpoints(&self) -> Arc<dyn flowwarden::port::CheckpointStore> {
        Arc::new(self.0.clone())
    }
    fn handle_type(&self) -> flowwarden::port::HandleType {
        flowwarden::port::HandleType::of::<ForeignHandle>()
    }
    fn lifetime_limit(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn describe(&self) -> String {
        "foreign".into()
    }
}

#[test]
fn the_error_kind_of_a_rejected_transaction_is_not_retryable() {
    assert!(!HandlerErrorKind::TransactionRejected.is_retryable());
}
