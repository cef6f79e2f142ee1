//! The engine scenarios of the runtime, end to end through the real `mongodb` driver: on the
//! wire-level emulator always, and on a live replica set when `FLOWWARDEN_TEST_MONGODB_URI` is
//! set (each scenario has an `emulator` and a `live` test; the live one prints `SKIPPED` and
//! returns when the variable is not set). Real time throughout: the driver does network I/O.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson};
use flowwarden::{AnyStream, HaltReason, HandlerError, OnHistoryLost, ResumeStrategy, StreamState};
use futures::FutureExt;
use mongo_emulator::CommandError;
use support::*;
use tokio::sync::Notify;

scenario!(routes_every_operation_and_checkpoints_after_the_last);
async fn routes_every_operation_and_checkpoints_after_the_last(t: &Target) {
    let probe = Probe::default();
    let rt = start(t, &probe, def("basic", |_| {})).await;
    let c = t.coll("orders");
    c.insert_one(doc! {"_id": 1, "status": "NEW"})
        .await
        .expect("insert");
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"status": "PAID"}})
        .await
        .expect("update");
    c.replace_one(doc! {"_id": 1}, doc! {"status": "SHIPPED"})
        .await
        .expect("replace");
    c.delete_one(doc! {"_id": 1}).await.expect("delete");
    wait_until("4 handled", || probe.successes().len() == 4).await;
    rt.shutdown().await;
    let successes = probe.successes();
    let ops: Vec<&str> = successes.iter().map(|c| c.op.as_str()).collect();
    assert_eq!(ops, ["insert", "update", "replace", "delete"]);
    let last = successes[3].token.clone();
    let (seen, processed) = t.stored_tokens("basic").await;
    assert_eq!(processed.as_deref(), Some(last.as_str()));
    assert!(
        seen.as_deref() >= Some(last.as_str()),
        "seen {seen:?} is at or after {last}"
    );
}

// A change arrives, its handler starts, the stream is cut by a `getMore` error the driver does
// not resume by itself (10107 without a label) while the handler runs; the next change
// follows. Both are handled, nothing is skipped, the checkpoint ends after the second.
scenario!(resumable_error_while_a_handler_runs_loses_nothing, emulator_only: "needs getMore fault injection");
async fn resumable_error_while_a_handler_runs_loses_nothing(t: &Target) {
    let gate = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let (g, s) = (gate.clone(), started.clone());
    let first = Arc::new(AtomicU32::new(0));
    let probe = Probe::new(move |ctx| {
        let (g, s, first) = (g.clone(), s.clone(), first.clone());
        async move {
            if ctx.document_key() == Some(&doc! {"_id": 1})
                && first.fetch_add(1, Ordering::SeqCst) == 0
            {
                s.notify_one();
                g.notified().await;
            }
            Ok(())
        }
        .boxed()
    });
    let rt = start(t, &probe, def("cut", |_| {})).await;
    let opens_before = t.emu().command_count("aggregate");
    t.insert_ids([1]).await;
    started.notified().await;
    t.emu()
        .fail_get_more(1, CommandError::not_writable_primary());
    tokio::time::sleep(Duration::from_millis(400)).await;
    t.insert_ids([2]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.notify_one();
    wait_until("2 handled", || {
        probe.handled_keys().contains(&Bson::Int32(2))
    })
    .await;
    let st = rt.handle().status("cut").expect("status");
    rt.shutdown().await;
    assert!(
        st.counters.restarts >= 1,
        "the engine re-opened the stream: {st:?}"
    );
    assert!(
        t.emu().command_count("aggregate") > opens_before,
        "re-opened through a new aggregate"
    );
    assert_eq!(probe.handled_keys(), ids(&[1, 2]));
    let (_, processed) = t.stored_tokens("cut").await;
    assert_eq!(processed, probe.token_for(2));
}

// A crash while change 2 is in flight: the stored position never passes it, and a restart
// delivers exactly it again — under both resume strategies.
scenario!(crash_redelivers_the_in_flight_change);
async fn crash_redelivers_the_in_flight_change(t: &Target) {
    for (name, strategy) in [
        ("crash-processed-first", ResumeStrategy::ProcessedFirst),
        ("crash-seen-first", ResumeStrategy::SeenFirst),
    ] {
        t.coll("orders").delete_many(doc! {}).await.expect("clean");
        let d = def(name, |d| d.checkpoint.resume_strategy = strategy);
        let probe = Probe::new(|ctx| {
            async move {
                if ctx.document_key() == Some(&doc! {"_id": 2}) {
                    std::future::pending::<()>().await;
                }
                Ok(())
            }
            .boxed()
        });
        let rt = start(t, &probe, d).await;
        t.insert_ids([1, 2]).await;
        wait_until("2 received", || probe.calls().len() == 2).await;
        // Let the heartbeat run while change 2 is in flight: it must not record 2.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        rt.handle().crash().await;
        let (seen, _) = t.stored_tokens(name).await;
        assert_eq!(
            seen,
            probe.token_for(1),
            "{name}: the stored position stops at change 1"
        );

        let again = Probe::default();
        let rt = start(t, &again, d).await;
        wait_until("2 redelivered", || again.successes().len() == 1).await;
        rt.shutdown().await;
        assert_eq!(
            again.handled_keys(),
            ids(&[2]),
            "{name}: exactly the unsettled change again"
        );
    }
}

scenario!(a_crash_before_the_first_checkpoint_does_not_skip_to_a_later_now);
// Writes that commit while the server opens a stream at "now" arrive in its first batch, and
// the driver reports no start position for a non-empty first batch. The adapter asks for an
// empty first batch (`batchSize: 0`), so the start position is known and written before any
// event: a crash before the first checkpoint replays those writes instead of skipping them.
scenario!(
    writes_racing_the_open_at_now_survive_a_crash_before_the_first_checkpoint,
    emulator_only: "needs writes racing the open on demand"
);
async fn writes_racing_the_open_at_now_survive_a_crash_before_the_first_checkpoint(t: &Target) {
    let d = def("racing-open", |d| {
        d.checkpoint.save_every_n = 1_000;
        d.checkpoint.save_interval_secs = 0;
    });
    let before = t.emu().head_resume_token();
    t.insert_ids([1, 2]).await;
    t.emu().race_writes_since(&before).expect("token");
    let probe = Probe::new(|_| std::future::pending::<Result<(), HandlerError>>().boxed());
    let rt = start(t, &probe, d).await;
    wait_until("1 received", || probe.calls().len() == 1).await;
    let (seen, _) = t.stored_tokens("racing-open").await;
    assert!(
        seen.is_some(),
        "the start position is stored before any event is settled"
    );
    rt.handle().crash().await;
    t.insert_ids([3]).await;
    let again = Probe::default();
    let rt = start(t, &again, d).await;
    wait_until("1, 2 and 3 handled", || again.successes().len() == 3).await;
    rt.shutdown().await;
    assert_eq!(again.handled_keys(), ids(&[1, 2, 3]));
}

async fn a_crash_before_the_first_checkpoint_does_not_skip_to_a_later_now(t: &Target) {
    // No regular checkpoint can be written before the crash: only the start position, which
    // the runtime writes at once from the cursor's initial post-batch token.
    let d = def("first-start", |d| {
        d.checkpoint.save_every_n = 1_000;
        d.checkpoint.save_interval_secs = 0;
    });
    let probe = Probe::new(|_| std::future::pending::<Result<(), HandlerError>>().boxed());
    let rt = start(t, &probe, d).await;
    t.insert_ids([1]).await;
    wait_until("1 received", || probe.calls().len() == 1).await;
    rt.handle().crash().await;
    t.insert_ids([2]).await;
    let again = Probe::default();
    let rt = start(t, &again, d).await;
    wait_until("1 and 2 handled", || again.successes().len() == 2).await;
    rt.shutdown().await;
    assert_eq!(again.handled_keys(), ids(&[1, 2]));
}

async fn history_lost_run(
    t: &Target,
    policy: OnHistoryLost,
) -> (Probe, flowwarden::StreamStatus, &'static str) {
    let name: &'static str = match policy {
        OnHistoryLost::Fail => "lost-fail",
        OnHistoryLost::ResumeFromOplogStart => "lost-oplog-start",
        OnHistoryLost::ResumeFromNow => "lost-now",
    };
    history_lost_run_as(t, name, policy, |_| {}, policy == OnHistoryLost::Fail).await
}

/// [`history_lost_run`] under stream `name`, with `restrict` applied to the server before the
/// restart; `halts` says whether the restarted stream is expected to halt.
async fn history_lost_run_as(
    t: &Target,
    name: &'static str,
    policy: OnHistoryLost,
    restrict: impl FnOnce(&Target),
    halts: bool,
) -> (Probe, flowwarden::StreamStatus, &'static str) {
    let d = def(name, |d| d.checkpoint.on_history_lost = policy);
    let probe = Probe::default();
    let rt = start(t, &probe, d).await;
    t.insert_ids([1, 2]).await;
    wait_until("2 handled", || probe.successes().len() == 2).await;
    rt.shutdown().await;
    // While the stream is down, more changes happen and history is truncated past its position.
    t.insert_ids([3, 4, 5]).await;
    t.emu().keep_last_oplog_entries(2); // keeps 4 and 5: 3 is gone
    restrict(t);
    let probe = Probe::default();
    let rt = start(t, &probe, d).await;
    let st = match halts {
        true => {
            wait_status(&rt, name, |s| {
                s.state == StreamState::HistoryLost && s.halt.is_some()
            })
            .await
        }
        _ => {
            t.insert_ids([6]).await;
            wait_until("6 handled", || {
                probe.handled_keys().contains(&Bson::Int32(6))
            })
            .await;
            rt.handle().status(name).expect("status")
        }
    };
    rt.shutdown().await;
    (probe, st, name)
}

scenario!(history_lost_with_fail_refuses_to_start_and_says_why, emulator_only: "needs oplog truncation");
async fn history_lost_with_fail_refuses_to_start_and_says_why(t: &Target) {
    let (probe, st, name) = history_lost_run(t, OnHistoryLost::Fail).await;
    let halt = st.halt.expect("halted");
    assert_eq!(halt.reason, HaltReason::HistoryLost);
    assert_eq!(halt.runbook, "docs/runbooks/history-lost.md");
    assert!(halt.message.contains(name), "{}", halt.message);
    assert!(probe.calls().is_empty());
    assert_eq!(st.counters.history_lost, 0);
    let (_, processed) = t.stored_tokens(name).await;
    assert!(processed.is_some(), "the checkpoint was not reset");
}

scenario!(history_lost_with_resume_from_oplog_start_replays_what_is_retained, emulator_only: "needs oplog truncation");
async fn history_lost_with_resume_from_oplog_start_replays_what_is_retained(t: &Target) {
    let (probe, st, _) = history_lost_run(t, OnHistoryLost::ResumeFromOplogStart).await;
    assert_eq!(probe.handled_keys(), ids(&[4, 5, 6]));
    assert_eq!(st.counters.history_lost, 1);
    assert_eq!(st.state, StreamState::Running);
}

fn unauthorized() -> CommandError {
    CommandError::new(13, "Unauthorized", "not authorized on admin")
}

scenario!(resume_from_oplog_start_without_local_reads_finds_the_oldest_through_server_status, emulator_only: "needs oplog truncation and privilege denial");
async fn resume_from_oplog_start_without_local_reads_finds_the_oldest_through_server_status(
    t: &Target,
) {
    let (probe, st, _) = history_lost_run_as(
        t,
        "lost-no-local",
        OnHistoryLost::ResumeFromOplogStart,
        |t| t.emu().deny_oplog_reads(true),
        false,
    )
    .await;
    assert_eq!(
        probe.handled_keys(),
        ids(&[4, 5, 6]),
        "the retained history is replayed"
    );
    assert_eq!(st.counters.history_lost, 1);
    assert_eq!(st.state, StreamState::Running);
}

// Neither `local.oplog.rs` nor `serverStatus` may be read: the oldest retained entry cannot
// be known, and the stream halts instead of starting at "now" (which would skip 4 and 5).
scenario!(resume_from_oplog_start_that_cannot_find_the_oldest_halts_and_skips_nothing, emulator_only: "needs oplog truncation and privilege denial");
async fn resume_from_oplog_start_that_cannot_find_the_oldest_halts_and_skips_nothing(t: &Target) {
    let name = "lost-no-privilege";
    let (probe, st, _) = history_lost_run_as(
        t,
        name,
        OnHistoryLost::ResumeFromOplogStart,
        |t| {
            t.emu().deny_oplog_reads(true);
            t.emu().fail_command("serverStatus", 1_000, unauthorized());
        },
        true,
    )
    .await;
    t.emu().fail_command("serverStatus", 0, unauthorized());
    let halt = st.halt.expect("halted");
    assert_eq!(halt.reason, HaltReason::HistoryLost);
    assert_eq!(halt.runbook, "docs/runbooks/history-lost.md");
    for part in [name, "local.oplog.rs", "serverStatus", "ResumeFromNow"] {
        assert!(halt.message.contains(part), "{part}: {}", halt.message);
    }
    assert!(probe.calls().is_empty(), "nothing was handled from 'now'");
    assert_eq!(st.counters.history_lost, 0, "no gap was taken");
    let (_, processed) = t.stored_tokens(name).await;
    assert!(processed.is_some(), "the checkpoint was not reset");
}

scenario!(history_lost_with_resume_from_now_skips_to_new_changes_loudly, emulator_only: "needs oplog truncation");
async fn history_lost_with_resume_from_now_skips_to_new_changes_loudly(t: &Target) {
    let (probe, st, _) = history_lost_run(t, OnHistoryLost::ResumeFromNow).await;
    assert_eq!(probe.handled_keys(), ids(&[6]));
    assert_eq!(st.counters.history_lost, 1, "the gap is counted");
}

/// A step-down while the stream re-opens is retried, never treated as lost history.
mod a_step_down_during_the_resume_check_is_not_history_lost {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn emulator() {
        let t = Target::emulator_direct().await;
        let d = def("stepdown", |d| {
            d.checkpoint.on_history_lost = OnHistoryLost::ResumeFromNow
        });
        // A configured identity: no checkpoint guard, whose lease the step-down would make
        // the second runtime wait for before it opens (and re-opens) the stream at all.
        let start_as_one = |probe: &Probe| {
            flowwarden::builder()
                .discover(false)
                .any_stream(AnyStream::with_definition(probe.clone(), d))
                .backend(t.backend.clone())
                .instance_id("stepdown-test")
                .max_await(Duration::from_millis(150))
                .start()
        };
        let probe = Probe::default();
        let rt = start_as_one(&probe).await.expect("starts");
        wait_status(&rt, "stepdown", |s| {
            s.state == flowwarden::StreamState::Running
        })
        .await;
        t.insert_ids([1]).await;
        wait_until("1 handled", || probe.successes().len() == 1).await;
        rt.shutdown().await;
        t.insert_ids([2]).await;
        t.emu().step_down();
        let probe = Probe::default();
        let rt = start_as_one(&probe).await.expect("starts");
        wait_status(&rt, "stepdown", |s| s.counters.restarts >= 2).await;
        t.emu().step_up();
        wait_until("2 handled", || probe.successes().len() == 1).await;
        let st = rt.handle().status("stepdown").expect("status");
        rt.shutdown().await;
        assert_eq!(
            probe.handled_keys(),
            ids(&[2]),
            "resumed from the checkpoint, not from now"
        );
        assert_eq!(st.counters.history_lost, 0);
    }
    #[tokio::test]
    async fn live() {
        Target::skip_live(
            "a_step_down_during_the_resume_check_is_not_history_lost",
            "needs a step-down on demand",
        );
    }
}

// A stream whose filter rejects everything still records its settled position, so a restart
// resumes near the head instead of re-reading everything.
scenario!(filter_heavy_idle_stream_resumes_near_the_head);
async fn filter_heavy_idle_stream_resumes_near_the_head(t: &Target) {
    let d = def("picky", |d| {
        d.checkpoint.resume_strategy = ResumeStrategy::ProcessedFirst
    });
    let probe = Probe::default().with_filter(|_| false);
    let rt = start(t, &probe, d).await;
    t.coll("orders")
        .insert_many((1..=50).map(|i| doc! {"_id": i, "n": i}))
        .await
        .expect("insert");
    wait_status(&rt, "picky", |s| s.counters.filtered == 50).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    rt.shutdown().await;
    let (seen, processed) = t.stored_tokens("picky").await;
    assert_eq!(processed, None, "nothing was handled");
    assert!(seen.is_some(), "the settled position was stored");

    let probe = Probe::default().with_filter(|_| false);
    let rt = start(t, &probe, d).await;
    t.insert_ids([51]).await;
    let st = wait_status(&rt, "picky", |s| s.counters.filtered >= 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st2 = rt.handle().status("picky").expect("status");
    rt.shutdown().await;
    assert_eq!(
        st.counters.received, 1,
        "only the new change was read: {st:?}"
    );
    assert_eq!(st2.counters.received, 1);
}

// An idle stream advances its stored position with the server's post-batch tokens.
scenario!(idle_post_batch_tokens_advance_the_seen_position);
async fn idle_post_batch_tokens_advance_the_seen_position(t: &Target) {
    let probe = Probe::default();
    let rt = start(t, &probe, def("quiet", |_| {})).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (first, _) = t.stored_tokens("quiet").await;
    t.coll("elsewhere")
        .insert_many((0..10).map(|i| doc! {"_id": i}))
        .await
        .expect("insert");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    rt.shutdown().await;
    assert!(probe.calls().is_empty());
    let (after, processed) = t.stored_tokens("quiet").await;
    assert_eq!(processed, None);
    assert!(after.is_some(), "the idle stream stored a position");
    assert_ne!(first, after, "the position moved with writes elsewhere");
}

// Dropping the watched collection: an on-change handler sees the drop and the invalidate,
// then the stream stops with its runbook.
scenario!(dropping_the_collection_delivers_drop_and_invalidate_then_stops);
async fn dropping_the_collection_delivers_drop_and_invalidate_then_stops(t: &Target) {
    let probe = Probe::default();
    let rt = start(t, &probe, def("dropped", |_| {})).await;
    t.insert_ids([1]).await;
    t.coll("orders").drop().await.expect("drop");
    let st = wait_status(&rt, "dropped", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    let ops: Vec<String> = probe.successes().into_iter().map(|c| c.op).collect();
    assert_eq!(ops, ["insert", "drop", "invalidate"]);
    let halt = st.halt.expect("halted");
    assert_eq!(halt.reason, HaltReason::Invalidated);
    assert_eq!(halt.runbook, "docs/runbooks/invalidate.md");
    assert_eq!(st.state, StreamState::Stopped);
}

// A handler that fails twice then succeeds is retried; one that always fails is
// dead-lettered in `_fw_dlq` and the stream goes on; the record can be discarded.
scenario!(retries_and_dead_letters);
async fn retries_and_dead_letters(t: &Target) {
    let probe = Probe::new(|ctx| {
        async move {
            match ctx.document_key().and_then(|k| k.get_i32("_id").ok()) {
                Some(1) => Err(HandlerError::msg("payment service refused")),
                Some(2) if ctx.attempt() < 3 => Err(HandlerError::msg("transient")),
                _ => Ok(()),
            }
        }
        .boxed()
    });
    let rt = start(t, &probe, def("poison", |_| {})).await;
    t.insert_ids([1, 2, 3]).await;
    wait_until("3 handled", || {
        probe.handled_keys().contains(&Bson::Int32(3))
    })
    .await;
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .expect("list");
    assert_eq!(dead.len(), 1, "{dead:?}");
    let r = &dead[0];
    assert_eq!(r.stream, "poison");
    assert_eq!(r.attempts, 3);
    assert_eq!(r.error_chain[0], "payment service refused");
    assert_eq!(r.document_key, Some(doc! {"_id": 1}));
    assert_eq!(
        r.event.get_document("fullDocument").expect("event kept"),
        &doc! {"_id": 1, "n": 1}
    );
    let calls_for_2 = probe
        .calls()
        .iter()
        .filter(|c| c.key == Some(Bson::Int32(2)))
        .count();
    assert_eq!(calls_for_2, 3, "2 was retried until it succeeded");
    let raw = t
        .coll("_fw_dlq")
        .find_one(doc! {"_id": &r.id})
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(raw.get_str("status"), Ok("pending"));
    rt.handle()
        .dead_letters()
        .discard(&r.id)
        .await
        .expect("discard");
    let raw = t
        .coll("_fw_dlq")
        .find_one(doc! {"_id": &r.id})
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(raw.get_str("status"), Ok("discarded"));
    rt.shutdown().await;
    assert_eq!(probe.handled_keys(), ids(&[2, 3]));
    let (_, processed) = t.stored_tokens("poison").await;
    assert_eq!(processed, probe.token_for(3));
}

// An event whose document does not decode into the stream's type is dead-lettered (not
// skipped, not retried forever) and the stream goes on.
scenario!(an_undecodable_event_is_dead_lettered);
async fn an_undecodable_event_is_dead_lettered(t: &Target) {
    let probe = TypedProbe::default();
    let rt = start_any(
        t,
        AnyStream::with_definition(probe.clone(), def("typed", |_| {})),
    )
    .await;
    let c = t.coll("orders");
    c.insert_one(doc! {"_id": 1, "n": "not a number"})
        .await
        .expect("insert");
    c.insert_one(doc! {"_id": 2, "n": 2}).await.expect("insert");
    wait_until("2 handled", || {
        probe.handled.lock().expect("lock").contains(&2)
    })
    .await;
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .expect("list");
    let st = rt.handle().status("typed").expect("status");
    rt.shutdown().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].error_kind, "Decode", "{:?}", dead[0]);
    assert_eq!(dead[0].document_key, Some(doc! {"_id": 1}));
    assert_eq!(*probe.handled.lock().expect("lock"), [2]);
    assert_eq!(st.counters.dead_lettered, 1);
}

// A stop lets the in-flight handler finish, then checkpoints it.
scenario!(graceful_shutdown_lets_the_in_flight_handler_finish);
async fn graceful_shutdown_lets_the_in_flight_handler_finish(t: &Target) {
    let probe = Probe::new(|_| {
        async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok(())
        }
        .boxed()
    });
    let rt = start(
        t,
        &probe,
        def("graceful", |d| d.checkpoint.save_every_n = 100),
    )
    .await;
    t.insert_ids([1]).await;
    wait_until("received", || probe.calls().len() == 1).await;
    rt.shutdown().await;
    assert_eq!(probe.successes().len(), 1, "the in-flight handler finished");
    let (_, processed) = t.stored_tokens("graceful").await;
    assert_eq!(processed, probe.token_for(1));
}

// A stored checkpoint that does not parse stops the stream, naming it and the field, and is
// not reset.
scenario!(a_corrupt_checkpoint_stops_the_stream_naming_it);
async fn a_corrupt_checkpoint_stops_the_stream_naming_it(t: &Target) {
    t.coll("_fw_checkpoints")
        .insert_one(
            doc! {"_id": "scarred", "lastSeenToken": 42, "updatedAt": bson::DateTime::now()},
        )
        .await
        .expect("insert");
    let probe = Probe::default();
    let rt = start(t, &probe, def("scarred", |_| {})).await;
    let st = wait_status(&rt, "scarred", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    let halt = st.halt.expect("halted");
    assert_eq!(halt.reason, HaltReason::CorruptCheckpoint);
    assert!(
        halt.message.contains("scarred") && halt.message.contains("lastSeenToken"),
        "{}",
        halt.message
    );
    assert_eq!(halt.runbook, "docs/runbooks/corrupt-checkpoint.md");
    let raw = t
        .coll("_fw_checkpoints")
        .find_one(doc! {"_id": "scarred"})
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(raw.get_i32("lastSeenToken"), Ok(42), "not reset");
}

// An event over 16 MB without `$changeStreamSplitLargeEvent` halts the stream with the
// event-too-large runbook (it is never skipped).
scenario!(an_event_too_large_halts_with_the_runbook, emulator_only: "writes 18 MB events; run the adapter test instead");
async fn an_event_too_large_halts_with_the_runbook(t: &Target) {
    t.emu().fail_get_more(
        1,
        CommandError::new(
            10334,
            "BSONObjectTooLarge",
            "BSONObj size: 18000000 is invalid",
        ),
    );
    let probe = Probe::default();
    let rt = start(t, &probe, def("huge", |_| {})).await;
    let st = wait_status(&rt, "huge", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    let halt = st.halt.expect("halted");
    assert_eq!(halt.reason, HaltReason::EventTooLarge);
    assert_eq!(halt.runbook, "docs/runbooks/event-too-large.md");
}

// An event over 16 MB with `$changeStreamSplitLargeEvent` reaches the handler whole (both
// images, no `splitEvent`), and the checkpoint passes it only as a whole: a restart continues
// with the next change, not in the middle of the split event. Needs MongoDB 7.0+/6.0.9+ live.
scenario!(split_large_events_reach_the_handler_whole);
async fn split_large_events_reach_the_handler_whole(t: &Target) {
    let db = t.backend.client().database(&t.db);
    db.create_collection("orders")
        .change_stream_pre_and_post_images(
            mongodb::options::ChangeStreamPreAndPostImages::builder()
                .enabled(true)
                .build(),
        )
        .await
        .expect("create with images");
    let blob = "x".repeat(9 * 1024 * 1024);
    t.coll("orders")
        .insert_one(doc! {"_id": 1, "blob": &blob, "n": 0})
        .await
        .expect("insert 9 MB");
    let d = def("split", |d| {
        d.full_document = flowwarden::FullDocument::WhenAvailable;
        d.full_document_before_change = flowwarden::FullDocumentBeforeChange::WhenAvailable;
    });
    let seen: Arc<std::sync::Mutex<Vec<bson::Document>>> = Arc::default();
    let s = seen.clone();
    let probe = Probe::new(move |ctx| {
        let s = s.clone();
        async move {
            let raw = ctx.raw_event();
            s.lock().expect("lock").push(doc! {
                "op": raw.get_str("operationType").unwrap_or("?"),
                "split": raw.contains_key("splitEvent"),
                "after": raw.get_document("fullDocument").ok().and_then(|d| d.get_i32("n").ok()),
                "before": raw.get_document("fullDocumentBeforeChange").ok().and_then(|d| d.get_i32("n").ok()),
                "blobs": raw.get_document("fullDocument").map(|d| d.contains_key("blob")).unwrap_or(false)
                    && raw.get_document("fullDocumentBeforeChange").map(|d| d.contains_key("blob")).unwrap_or(false),
            });
            Ok(())
        }
        .boxed()
    });
    let rt = start_any(t, AnyStream::with_definition(SplitProbe(probe.clone()), d)).await;
    t.coll("orders")
        .update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
        .await
        .expect("update");
    wait_until("the large update handled", || probe.successes().len() == 1).await;
    let st = rt.handle().status("split").expect("status");
    rt.shutdown().await;
    assert_eq!(
        st.counters.received, 1,
        "one event, not one per fragment: {st:?}"
    );
    assert_eq!(
        seen.lock().expect("lock")[0],
        doc! {"op": "update", "split": false, "after": 1, "before": 0, "blobs": true}
    );
    let (_, processed) = t.stored_tokens("split").await;
    assert_eq!(processed, probe.token_for(1));

    // A restart resumes after the whole event.
    let again = Probe::default();
    let rt = start_any(t, AnyStream::with_definition(SplitProbe(again.clone()), d)).await;
    t.coll("orders")
        .delete_one(doc! {"_id": 1})
        .await
        .expect("delete");
    wait_until("the delete handled", || again.successes().len() == 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    rt.shutdown().await;
    let ops: Vec<String> = again.successes().into_iter().map(|c| c.op).collect();
    assert_eq!(
        ops,
        ["delete"],
        "nothing of the split event is delivered again"
    );
}

// Checkpoint writes failing for a while (step-down, network) delay the stored progress but
// lose nothing: the progress is kept in memory and written at the next opportunity.
scenario!(checkpoint_store_outages_delay_progress_but_lose_nothing, emulator_only: "needs write fault injection");
async fn checkpoint_store_outages_delay_progress_but_lose_nothing(t: &Target) {
    let probe = Probe::default();
    let rt = start(t, &probe, def("outage", |d| d.checkpoint.save_every_n = 1)).await;
    t.emu().fail_command(
        "update",
        3,
        CommandError::new(11600, "InterruptedAtShutdown", "shutting down"),
    );
    t.insert_ids([1, 2, 3]).await;
    wait_until("3 handled", || probe.successes().len() == 3).await;
    t.insert_ids([4]).await;
    wait_until("4 handled", || probe.successes().len() == 4).await;
    // Written at the next opportunity once the store answers again (a later write behind the
    // stream, or the heartbeat's every second), however many writes the outage refused: with
    // writes behind the stream, how many are tried during the outage depends on timing.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, processed) = t.stored_tokens("outage").await;
        if processed == probe.token_for(4) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "event 4's position was never stored: {processed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let st = rt.handle().status("outage").expect("status");
    rt.shutdown().await;
    assert!(st.counters.checkpoint_failures >= 1, "{st:?}");
    let (_, processed) = t.stored_tokens("outage").await;
    assert_eq!(processed, probe.token_for(4));
    assert_eq!(probe.handled_keys(), ids(&[1, 2, 3, 4]));
}

// Keyed concurrency through the driver (whose reader hands events over encoded): eight
// handlers of different keys run at once, never more, each key's changes are handled one at a
// time in stream order, and the checkpoint ends after the last change.
scenario!(keyed_concurrency_through_the_driver_keeps_each_keys_order);
async fn keyed_concurrency_through_the_driver_keeps_each_keys_order(t: &Target) {
    const KEYS: i32 = 10;
    const ROUNDS: i32 = 5;
    let (open_tx, open_rx) = tokio::sync::watch::channel(false);
    let running = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let (r, m) = (running.clone(), most.clone());
    let probe = Probe::new(move |_| {
        let (r, m, mut open) = (r.clone(), m.clone(), open_rx.clone());
        async move {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            // Held until eight handlers run at once.
            let _ = open.wait_for(|o| *o).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
            r.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
        .boxed()
    });
    let rt = start(
        t,
        &probe,
        def("keyed", |d| {
            d.concurrency = flowwarden::ConcurrencyConfig {
                concurrency: 8,
                max_in_flight: 32,
            };
        }),
    )
    .await;
    let c = t.coll("orders");
    for round in 0..ROUNDS {
        for k in 0..KEYS {
            if round == 0 {
                c.insert_one(doc! {"_id": k, "n": 0}).await.expect("insert");
            } else {
                c.update_one(doc! {"_id": k}, doc! {"$set": {"n": round}})
                    .await
                    .expect("update");
            }
        }
    }
    // Ten keys have changes waiting: eight handlers run at once, held at the gate.
    wait_until("eight handlers running at once", || {
        running.load(Ordering::SeqCst) == 8
    })
    .await;
    open_tx.send_replace(true);
    let total = (KEYS * ROUNDS) as usize;
    wait_until("every change handled", || probe.successes().len() == total).await;
    rt.shutdown().await;
    assert_eq!(
        most.load(Ordering::SeqCst),
        8,
        "eight handlers at once, never more"
    );
    let successes = probe.successes();
    for k in 0..KEYS {
        let of_key: Vec<_> = successes
            .iter()
            .filter(|c| c.key == Some(Bson::Int32(k)))
            .collect();
        let ops: Vec<&str> = of_key.iter().map(|c| c.op.as_str()).collect();
        assert_eq!(
            ops,
            ["insert", "update", "update", "update", "update"],
            "key {k}"
        );
        assert!(
            of_key.windows(2).all(|w| w[0].token < w[1].token),
            "key {k} handled in stream order: {of_key:?}"
        );
    }
    let last = successes.iter().map(|c| c.token.clone()).max();
    let (_, processed) = t.stored_tokens("keyed").await;
    assert_eq!(processed, last, "the checkpoint ends after the last change");
}
