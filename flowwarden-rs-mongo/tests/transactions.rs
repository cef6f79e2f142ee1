//! `transactional = true` streams on MongoDB through the real driver: on the wire-level
//! emulator always, on a live replica set when `FLOWWARDEN_TEST_MONGODB_URI` is set (for the
//! scenarios that need no fault injection). Each event's writes commit in one transaction with
//! the checkpoint, so they are applied exactly once: across a real process abort at every step
//! (a child process of this test binary aborts itself), lost commit replies, transient write
//! conflicts, an unknown commit result, and a deposed leader.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Document};
use flowwarden::{
    change_stream, checkpoint, retry, AnyStream, ChangeContext, Deployment, HaltReason,
    HandlerError, LeaseConfig, Runtime, StreamDefinition, StreamHandler, StreamState,
    TransactionStep,
};
use flowwarden_rs_mongo::{MongoBackend, Transaction};
use futures::future::{BoxFuture, FutureExt};
use futures::TryStreamExt;
use mongo_emulator::CommandError;
use support::*;
use tokio::sync::Notify;

/// What the test makes the projector do.
#[derive(Default)]
struct Control {
    /// Abort the process in the event of this `_id`, at this point (child processes only).
    abort_at: Option<(i32, &'static str)>,
    /// Sleep this long in every attempt.
    sleep: Mutex<Option<Duration>>,
    calls: AtomicU32,
}

/// Projects every change of `orders`, in the stream's transaction: one `effects` document per
/// event (its `n` counts how many times the event's writes were applied) and a running total,
/// in two writes.
#[derive(Default)]
struct Projector {
    control: Arc<Control>,
}

#[change_stream(name = "mongo-projector", collection = "orders", transactional = true)]
#[checkpoint(save_every_n = 1, save_interval_secs = 1)]
#[retry(max_attempts = 2, initial_delay_ms = 10, jitter = false)]
impl Projector {
    #[on_change]
    async fn project(
        &self,
        ctx: &ChangeContext<Document>,
        tx: &Transaction,
    ) -> Result<(), HandlerError> {
        let c = &self.control;
        c.calls.fetch_add(1, Ordering::SeqCst);
        let id = ctx
            .document_key()
            .and_then(|k| k.get_i32("_id").ok())
            .unwrap_or(-1);
        let sleep = *c.sleep.lock().unwrap();
        if let Some(d) = sleep {
            tokio::time::sleep(d).await;
        }
        if c.abort_at == Some((id, "before-writes")) {
            std::process::abort();
        }
        tx.collection::<Document>("effects")
            .update_one(
                doc! {"_id": ctx.event_id().as_str()},
                doc! {"$inc": {"n": 1}, "$set": {"order": id}},
            )
            .upsert(true)
            .session(&mut *tx.session().await)
            .await?;
        if c.abort_at == Some((id, "between-writes")) {
            std::process::abort();
        }
        tx.collection::<Document>("totals")
            .update_one(doc! {"_id": "all"}, doc! {"$inc": {"n": 1}})
            .upsert(true)
            .session(&mut *tx.session().await)
            .await?;
        Ok(())
    }
}

const NAME: &str = "mongo-projector";

fn projector(control: &Arc<Control>) -> Projector {
    Projector {
        control: control.clone(),
    }
}

fn def_with(f: impl FnOnce(&mut StreamDefinition)) -> &'static StreamDefinition {
    let mut d = Projector::definition().clone();
    f(&mut d);
    Box::leak(Box::new(d))
}

/// `effects` as order `_id` → how many times its event's writes were applied.
async fn effects(t: &Target) -> BTreeMap<i32, i32> {
    let docs: Vec<Document> = t
        .coll("effects")
        .find(doc! {})
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("collect");
    docs.into_iter()
        .map(|d| (d.get_i32("order").unwrap(), d.get_i32("n").unwrap()))
        .collect()
}

async fn total(t: &Target) -> i32 {
    t.coll("totals")
        .find_one(doc! {"_id": "all"})
        .await
        .expect("find")
        .map_or(0, |d| d.get_i32("n").unwrap())
}

async fn wait_effects(t: &Target, n: usize) {
    for _ in 0..1000 {
        if effects(t).await.len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{n} events applied within 20 s: {:?}", effects(t).await);
}

async fn assert_exactly_once(t: &Target, n: i32) {
    let expected: BTreeMap<i32, i32> = (1..=n).map(|i| (i, 1)).collect();
    assert_eq!(
        effects(t).await,
        expected,
        "each event's writes applied exactly once"
    );
    assert_eq!(
        total(t).await,
        n,
        "the running total counts each event once"
    );
}

async fn insert_orders(t: &Target, ids: std::ops::RangeInclusive<i32>) {
    t.insert_ids(ids).await;
}

async fn start_projector(
    t: &Target,
    control: &Arc<Control>,
    configure: impl FnOnce(flowwarden::Builder) -> flowwarden::Builder,
) -> Runtime {
    start_any_with(t, AnyStream::new(projector(control)), configure).await
}

async fn commits_each_events_writes_with_its_checkpoint(t: &Target) {
    let control = Arc::new(Control::default());
    let rt = start_projector(t, &control, |b| b).await;
    // A plain watcher of the projection sees the transactions' events, tagged with a session.
    let mut projection = t
        .coll("effects")
        .watch()
        .await
        .expect("watch the projection");
    insert_orders(t, 1..=10).await;
    let st = wait_status(&rt, NAME, |s| s.counters.handled == 10).await;
    assert_eq!(st.counters.transactions_committed, 10);
    assert_exactly_once(t, 10).await;
    let stored = t.stored_tokens(NAME).await.1.expect("a checkpoint");
    let last_event = st
        .checkpoint
        .as_ref()
        .and_then(|c| c.last_processed.clone());
    assert_eq!(
        last_event.and_then(|p| p.token.data().map(str::to_owned)),
        Some(stored),
        "the stored checkpoint is the one the last commit wrote"
    );
    let mut first = None;
    for _ in 0..50 {
        first = projection.next_if_any().await.expect("read");
        if first.is_some() {
            break;
        }
    }
    let first = first.expect("an event of the projection");
    assert!(
        first.lsid.is_some() && first.txn_number.is_some(),
        "{first:?}"
    );
    rt.shutdown().await;
    if let Some(emu) = &t.emu {
        assert!(emu.transactions_committed() >= 10);
    }
}
scenario!(commits_each_events_writes_with_its_checkpoint);

async fn a_lost_commit_reply_is_committed_again_and_applies_once(t: &Target) {
    let emu = t.emu();
    let control = Arc::new(Control::default());
    let rt = start_projector(t, &control, |b| b).await;
    insert_orders(t, 1..=1).await;
    wait_status(&rt, NAME, |s| s.counters.handled == 1).await;
    // The next commit applies, and its reply is lost twice: the driver retries once, then the
    // runtime commits again (the commit only, not the handler).
    emu.fail_commit_after_applying(2, CommandError::interrupted_due_to_repl_state_change());
    emu.reset_command_counts();
    insert_orders(t, 2..=3).await;
    let st = wait_status(&rt, NAME, |s| s.counters.handled == 3).await;
    assert!(
        emu.command_count("commitTransaction") >= 4,
        "retried commits"
    );
    assert_eq!(control.calls.load(Ordering::SeqCst), 3, "no handler rerun");
    assert_eq!(st.counters.transactions_retried, 0);
    rt.shutdown().await;
    assert_exactly_once(t, 3).await;
}
scenario!(
    a_lost_commit_reply_is_committed_again_and_applies_once,
    emulator_only: "needs the emulator's lost commit replies"
);

async fn transient_errors_run_the_whole_transaction_again(t: &Target) {
    let emu = t.emu();
    let control = Arc::new(Control::default());
    let rt = start_projector(t, &control, |b| b).await;
    // A write conflict on the handler's first write, then a NoSuchTransaction on a commit:
    // both labelled TransientTransactionError; nothing of either run is committed.
    emu.fail_command("update", 1, CommandError::write_conflict());
    insert_orders(t, 1..=1).await;
    wait_status(&rt, NAME, |s| s.counters.handled == 1).await;
    emu.fail_command(
        "commitTransaction",
        1,
        CommandError::no_such_transaction("injected: the transaction was aborted"),
    );
    insert_orders(t, 2..=2).await;
    let st = wait_status(&rt, NAME, |s| s.counters.handled == 2).await;
    assert_eq!(st.counters.transactions_retried, 2);
    assert_eq!(st.counters.retried, 0, "not counted as failed attempts");
    assert_eq!(control.calls.load(Ordering::SeqCst), 4);
    rt.shutdown().await;
    assert_exactly_once(t, 2).await;
}
scenario!(
    transient_errors_run_the_whole_transaction_again,
    emulator_only: "needs the emulator's injected transaction errors"
);

async fn an_unknown_commit_result_halts_and_the_restart_decides(t: &Target) {
    let emu = t.emu();
    let control = Arc::new(Control::default());
    let rt = start_projector(t, &control, |b| b).await;
    insert_orders(t, 1..=1).await;
    wait_status(&rt, NAME, |s| s.counters.handled == 1).await;
    // MaxTimeMSExpired on a commit: labelled UnknownTransactionCommitResult, not retried.
    emu.fail_commit_after_applying(1, CommandError::max_time_ms_expired());
    insert_orders(t, 2..=3).await;
    let st = wait_status(&rt, NAME, |s| s.halt.is_some()).await;
    let halt = st.halt.expect("halted");
    assert_eq!(halt.reason, HaltReason::TransactionOutcomeUnknown);
    assert!(halt.message.contains("mongo-projector"), "{}", halt.message);
    rt.shutdown().await;
    assert_eq!(effects(t).await.len(), 2, "event 2 committed");

    let again = Arc::new(Control::default());
    let rt = start_projector(t, &again, |b| b).await;
    wait_effects(t, 3).await;
    rt.shutdown().await;
    assert_exactly_once(t, 3).await;
    assert_eq!(again.calls.load(Ordering::SeqCst), 1, "only event 3 runs");
}
scenario!(
    an_unknown_commit_result_halts_and_the_restart_decides,
    emulator_only: "needs the emulator's lost commit replies"
);

async fn a_handler_past_the_lifetime_limit_fails_and_commits_nothing(t: &Target) {
    let control = Arc::new(Control::default());
    *control.sleep.lock().unwrap() = Some(Duration::from_millis(700));
    let backend = t
        .backend
        .clone()
        .with_transaction_lifetime(Duration::from_millis(500));
    let rt = flowwarden::builder()
        .discover(false)
        .stream(projector(&control))
        .backend(backend)
        .max_await(Duration::from_millis(150))
        .start()
        .await
        .expect("starts");
    wait_status(&rt, NAME, |s| s.state == StreamState::Running).await;
    insert_orders(t, 1..=1).await;
    let st = wait_status(&rt, NAME, |s| s.counters.dead_lettered == 1).await;
    assert_eq!(st.counters.retried, 1);
    let records = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .expect("list");
    let chain = records[0].error_chain.join(": ");
    assert!(chain.contains("transaction lifetime limit"), "{chain}");
    rt.shutdown().await;
    assert!(effects(t).await.is_empty(), "nothing committed");
}
scenario!(a_handler_past_the_lifetime_limit_fails_and_commits_nothing);

/// A leads and pauses right before its commit of event 2; the server's clock passes its lease;
/// B takes over and applies 2; A wakes and commits: fenced, nothing of its transaction lands.
async fn a_deposed_leaders_transaction_commits_nothing(t: &Target) {
    let emu = t.emu();
    let d = def_with(|d| {
        d.name = "mongo-projector-leader";
        d.deployment = Deployment::SingleLeader(LeaseConfig {
            lease_secs: 30,
            renew_secs: 10,
            standby_poll_secs: 1,
        });
    });
    let gate = Arc::new(Notify::new());
    let entered = Arc::new(Notify::new());
    let commits = Arc::new(AtomicU32::new(0));
    let (g, e, c) = (gate.clone(), entered.clone(), commits.clone());
    let a = Arc::new(Control::default());
    let rt_a = start_any_with(t, AnyStream::with_definition(projector(&a), d), move |b| {
        b.instance_id("a")
            .on_transaction_step(move |s| -> BoxFuture<'static, ()> {
                if s == TransactionStep::BeforeCommit && c.fetch_add(1, Ordering::SeqCst) == 1 {
                    let (g, e) = (g.clone(), e.clone());
                    return async move {
                        e.notify_one();
                        g.notified().await;
                    }
                    .boxed();
                }
                futures::future::ready(()).boxed()
            })
    })
    .await;
    wait_status(&rt_a, d.name, |s| s.state == StreamState::Running).await;
    let b = Arc::new(Control::default());
    let other = t.another_backend().await;
    let rt_b = flowwarden::builder()
        .discover(false)
        .any_stream(AnyStream::with_definition(projector(&b), d))
        .backend(other)
        .instance_id("b")
        .max_await(Duration::from_millis(150))
        .start()
        .await
        .expect("B starts");
    wait_status(&rt_b, d.name, |s| s.state == StreamState::Standby).await;
    insert_orders(t, 1..=2).await;
    entered.notified().await;
    emu.advance_clock(Duration::from_secs(31));
    wait_effects(t, 2).await;
    gate.notify_one();
    let st = wait_status(&rt_a, d.name, |s| s.halt.is_some()).await;
    assert_eq!(st.halt.map(|h| h.reason), Some(HaltReason::Fenced));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_exactly_once(t, 2).await;
    let cp = t
        .coll("_fw_checkpoints")
        .find_one(doc! {"_id": d.name})
        .await
        .expect("read")
        .expect("checkpoint");
    assert_eq!(cp.get_i64("epoch"), Ok(2), "B's epoch stands");
    rt_a.shutdown().await;
    rt_b.shutdown().await;
}
scenario!(
    a_deposed_leaders_transaction_commits_nothing,
    emulator_only: "moves the server's clock past the lease"
);

// ----- a real process abort at every step -----------------------------------------------

/// Set in a child process: `<uri> <database> <step or none> <events to wait for>`.
const CHILD_ENV: &str = "FLOWWARDEN_TXN_CRASH_CHILD";

/// The child process of the crash tests: runs the projector against the parent's emulator,
/// aborting itself at the step it was given; without a step it runs until every event is
/// applied and exits normally. Run by the tests below with `--ignored`.
#[test]
#[ignore = "the child process of the crash tests (they run it with --ignored); not a test on its own"]
fn crash_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        panic!("{CHILD_ENV} is not set: this is the crash tests' child process, not a test");
    };
    let parts: Vec<String> = spec.split(' ').map(str::to_owned).collect();
    let [uri, db, step, wait_for] = parts.as_slice() else {
        panic!("bad {CHILD_ENV}: {spec}");
    };
    let step: Option<&'static str> = match step.as_str() {
        "none" => None,
        s => Some(Box::leak(s.to_owned().into_boxed_str())),
    };
    let wait_for: usize = wait_for.parse().expect("a count");
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    runtime.block_on(async move {
        init_logs();
        let backend = MongoBackend::connect(uri, db).await.expect("connects");
        let control = Arc::new(Control {
            abort_at: step.filter(|s| s.ends_with("writes")).map(|s| (3, s)),
            ..Control::default()
        });
        let hook_step = match step {
            Some("before-commit") => Some(TransactionStep::BeforeCommit),
            Some("after-commit" | "after-commit-sabotaged") => Some(TransactionStep::AfterCommit),
            _ => None,
        };
        let sabotaged = step == Some("after-commit-sabotaged");
        let commits = Arc::new(AtomicU32::new(0));
        let rt = flowwarden::builder()
            .discover(false)
            .stream(projector(&control))
            .backend(backend.clone())
            // A stable identity, as a deployed replica has: the restarted process takes the
            // checkpoint over at once (no checkpoint guard of a crashed instance to wait for).
            .instance_id("txn-child")
            .checkpoint_outside_transaction(sabotaged)
            .max_await(Duration::from_millis(100))
            .on_transaction_step(move |s| -> BoxFuture<'static, ()> {
                // The third event's step: the process dies here.
                if Some(s) == hook_step && commits.fetch_add(1, Ordering::SeqCst) == 2 {
                    std::process::abort();
                }
                futures::future::ready(()).boxed()
            })
            .start()
            .await
            .expect("runtime starts");
        wait_status(&rt, NAME, |s| s.state == StreamState::Running).await;
        let control_coll = backend
            .client()
            .database(db)
            .collection::<Document>("control");
        control_coll
            .insert_one(doc! {"ready": std::process::id()})
            .await
            .expect("ready marker");
        let effects = backend
            .client()
            .database(db)
            .collection::<Document>("effects");
        // Up to 150 s: on a real server the aborted process's transaction keeps its write
        // locks until the server's lifetime limit (60 s) aborts it; until then the restarted
        // stream's writes conflict and its transaction runs again.
        for _ in 0..7500 {
            if effects.count_documents(doc! {}).await.expect("count") as usize >= wait_for {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        rt.shutdown().await;
    });
}

/// Runs the child with `step`, waits until it is ready (once `ready` markers exist), lets
/// `insert` write, and returns how it exited.
async fn run_child(
    t: &Target,
    step: &str,
    wait_for: usize,
    ready_before: u64,
    insert: Option<std::ops::RangeInclusive<i32>>,
) -> std::process::ExitStatus {
    let exe = std::env::current_exe().expect("test binary");
    let mut child = tokio::process::Command::from(Command::new(exe))
        .args(["crash_child", "--exact", "--ignored", "--nocapture"])
        .env(CHILD_ENV, format!("{} {} {step} {wait_for}", t.uri, t.db))
        .kill_on_drop(true)
        .spawn()
        .expect("child starts");
    let control = t.coll("control");
    for _ in 0..1500 {
        if control.count_documents(doc! {}).await.expect("count") > ready_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(ids) = insert {
        insert_orders(t, ids).await;
    }
    tokio::time::timeout(Duration::from_secs(180), child.wait())
        .await
        .expect("the child ends within 180 s")
        .expect("child status")
}

async fn a_process_abort_at(t: &Target, step: &str) {
    let crashed = run_child(t, step, 6, 0, Some(1..=6)).await;
    assert!(
        !crashed.success(),
        "the child aborted at {step}: {crashed:?}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(crashed.signal(), Some(6), "SIGABRT at {step}: {crashed:?}");
    }
    let before: Vec<i32> = effects(t).await.keys().copied().collect();
    match step {
        "after-commit" | "after-commit-sabotaged" => {
            assert_eq!(before, vec![1, 2, 3], "event 3 committed before the abort")
        }
        _ => assert_eq!(
            before,
            vec![1, 2],
            "nothing of event 3 committed before the abort"
        ),
    }
    let restarted = run_child(t, "none", 6, 1, None).await;
    assert!(
        restarted.success(),
        "the restarted child ran to the end: {restarted:?}"
    );
    if step == "after-commit-sabotaged" {
        let e = effects(t).await;
        assert_eq!(e.get(&3), Some(&2), "event 3 applied twice: {e:?}");
        assert_eq!(total(t).await, 7);
    } else {
        assert_exactly_once(t, 6).await;
    }
}

/// The check can fail: with the checkpoint written outside the transaction (after the commit),
/// the same abort after the commit applies event 3's writes twice.
async fn a_process_abort_after_the_commit_applies_twice_with_the_checkpoint_outside(t: &Target) {
    a_process_abort_at(t, "after-commit-sabotaged").await;
}
scenario!(a_process_abort_after_the_commit_applies_twice_with_the_checkpoint_outside);

async fn a_process_abort_before_the_handlers_writes_applies_each_event_once(t: &Target) {
    a_process_abort_at(t, "before-writes").await;
}
scenario!(a_process_abort_before_the_handlers_writes_applies_each_event_once);

async fn a_process_abort_between_the_handlers_writes_applies_each_event_once(t: &Target) {
    a_process_abort_at(t, "between-writes").await;
}
scenario!(a_process_abort_between_the_handlers_writes_applies_each_event_once);

async fn a_process_abort_before_the_commit_applies_each_event_once(t: &Target) {
    a_process_abort_at(t, "before-commit").await;
}
scenario!(a_process_abort_before_the_commit_applies_each_event_once);

async fn a_process_abort_after_the_commit_before_it_is_recorded_applies_each_event_once(
    t: &Target,
) {
    a_process_abort_at(t, "after-commit").await;
}
scenario!(a_process_abort_after_the_commit_before_it_is_recorded_applies_each_event_once);
