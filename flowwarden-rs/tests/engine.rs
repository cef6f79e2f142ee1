//! Engine scenarios on the in-memory backend: the regression tests of the delivery promise.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson};
use flowwarden::{
    ErrorAction, HaltReason, HandlerError, MemoryBackend, OnHistoryLost, ResumeStrategy,
    StreamState,
};
use futures::FutureExt;
use support::*;
use tokio::sync::Notify;

fn ids(v: &[i32]) -> Vec<Bson> {
    v.iter().map(|i| Bson::Int32(*i)).collect()
}

#[tokio::test(start_paused = true)]
async fn routes_every_operation_in_order_and_checkpoints_after_the_last() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = start(&backend, &probe, def("basic", |_| {})).await;
    let c = backend.collection("orders");
    c.insert_one(doc! {"_id": 1, "status": "NEW"}).unwrap();
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"status": "PAID"}})
        .unwrap();
    c.replace_one(doc! {"_id": 1}, doc! {"status": "SHIPPED"})
        .unwrap();
    c.delete_one(doc! {"_id": 1}).unwrap();
    wait_until("4 handled", || probe.successes().len() == 4).await;
    let ops: Vec<String> = probe.successes().into_iter().map(|c| c.op).collect();
    assert_eq!(ops, ["insert", "update", "replace", "delete"]);
    rt.shutdown().await;
    let (seen, processed) = stored_tokens(&backend, "basic");
    assert_eq!(processed.as_deref(), Some(token_of(4).as_str()));
    assert_eq!(seen.as_deref(), Some(token_of(4).as_str()));
}

/// A change arrives, its handler starts, the stream is cut by a resumable error while the
/// handler runs; the next change follows. Both are handled, nothing is skipped, and the
/// checkpoint ends after the second.
#[tokio::test(start_paused = true)]
async fn resumable_error_while_a_handler_runs_loses_nothing() {
    let backend = MemoryBackend::new();
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
    let rt = start(&backend, &probe, def("cut", |_| {})).await;
    insert_ids(&backend, [1]);
    started.notified().await;
    // The handler of change 1 is running: cut the stream, then commit change 2.
    backend.faults().fail_next_reads(1);
    insert_ids(&backend, [2]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    gate.notify_one();
    wait_until("2 handled", || {
        probe.handled_keys().contains(&Bson::Int32(2))
    })
    .await;
    let st = rt.handle().status("cut").unwrap();
    assert!(
        st.counters.restarts >= 1,
        "the stream was re-opened: {st:?}"
    );
    assert!(backend.faults().opens() >= 2);
    rt.shutdown().await;
    assert_eq!(probe.handled_keys(), ids(&[1, 2]));
    assert_eq!(
        stored_tokens(&backend, "cut").1.as_deref(),
        Some(token_of(2).as_str())
    );
}

/// The source itself redelivers an event it already delivered (a driver that resumed from an
/// older cached token). The redelivered event is processed again — never dropped by a
/// high-water mark — and the checkpoint ends after the next change.
#[tokio::test(start_paused = true)]
async fn a_redelivered_event_is_processed_again_not_dropped() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = start(&backend, &probe, def("redeliver", |_| {})).await;
    insert_ids(&backend, [1]);
    wait_until("1 handled", || probe.successes().len() == 1).await;
    backend.faults().rewind_cursors(1);
    insert_ids(&backend, [2]);
    wait_until("2 handled", || {
        probe.handled_keys().contains(&Bson::Int32(2))
    })
    .await;
    let st = rt.handle().status("redeliver").unwrap();
    rt.shutdown().await;
    assert_eq!(
        probe.handled_keys(),
        ids(&[1, 1, 2]),
        "1 is handled again, then 2"
    );
    assert_eq!(st.counters.redelivered, 1);
    assert_eq!(
        stored_tokens(&backend, "redeliver").1.as_deref(),
        Some(token_of(2).as_str())
    );
}

/// A change whose handling is deferred (its deduplication claim is still held elsewhere, so
/// the handler fails and is retried) meets a resumable failure, and a later change succeeds:
/// no checkpoint written meanwhile passes the change that was not yet handled.
#[tokio::test(start_paused = true)]
async fn checkpoint_never_passes_a_deferred_change() {
    let backend = MemoryBackend::new();
    let handled: Arc<Mutex<Vec<Bson>>> = Arc::default();
    let claims = Arc::new(AtomicU32::new(0));
    let h = handled.clone();
    let probe = Probe::new(move |ctx| {
        let (h, claims) = (h.clone(), claims.clone());
        async move {
            let key = ctx
                .document_key()
                .and_then(|k| k.get("_id").cloned())
                .unwrap();
            if key == Bson::Int32(1) && claims.fetch_add(1, Ordering::SeqCst) < 2 {
                return Err(HandlerError::msg(
                    "dedup claim for order 1 is held by another worker",
                ));
            }
            h.lock().unwrap().push(key);
            Ok(())
        }
        .boxed()
    });
    let d = def("deferred", |d| {
        d.retry.max_attempts = 5;
        d.retry.initial_delay_ms = 2_000;
        d.checkpoint.save_interval_secs = 1;
    });
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [1]);
    wait_until("first attempt failed", || !probe.calls().is_empty()).await;
    backend.faults().fail_next_reads(1);
    insert_ids(&backend, [2]);
    // Watch every checkpoint written while order 1 is deferred.
    let mut observed = Vec::new();
    while !handled.lock().unwrap().contains(&Bson::Int32(2)) {
        let (seen, processed) = stored_tokens(&backend, "deferred");
        let one_done = handled.lock().unwrap().contains(&Bson::Int32(1));
        observed.push((seen.clone(), processed.clone(), one_done));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rt.shutdown().await;
    for (seen, processed, one_done) in observed {
        if !one_done {
            for t in [seen, processed].into_iter().flatten() {
                assert!(
                    t < token_of(1),
                    "checkpoint {t} passed the deferred change 1"
                );
            }
        }
    }
    assert_eq!(*handled.lock().unwrap(), ids(&[1, 2]));
    assert_eq!(
        probe
            .calls()
            .iter()
            .filter(|c| c.key == Some(Bson::Int32(1)))
            .count(),
        3
    );
    assert_eq!(
        stored_tokens(&backend, "deferred").1.as_deref(),
        Some(token_of(2).as_str())
    );
}

async fn crash_after_receive(strategy: ResumeStrategy) {
    let backend = MemoryBackend::new();
    let name: &'static str = match strategy {
        ResumeStrategy::ProcessedFirst => "crash-processed-first",
        ResumeStrategy::SeenFirst => "crash-seen-first",
    };
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
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [1, 2]);
    wait_until("2 received", || probe.calls().len() == 2).await;
    // Let the heartbeat run while change 2 is in flight: it must not record 2.
    tokio::time::sleep(Duration::from_secs(3)).await;
    rt.handle().crash().await;
    assert_eq!(
        stored_tokens(&backend, name).0.as_deref(),
        Some(token_of(1).as_str())
    );

    let again = Probe::default();
    let rt = start(&backend, &again, d).await;
    wait_until("2 redelivered", || again.successes().len() == 1).await;
    rt.shutdown().await;
    assert_eq!(
        again.handled_keys(),
        ids(&[2]),
        "exactly the unsettled change is delivered again"
    );
}

#[tokio::test(start_paused = true)]
async fn crash_before_the_handler_returns_redelivers_processed_first() {
    crash_after_receive(ResumeStrategy::ProcessedFirst).await;
}

#[tokio::test(start_paused = true)]
async fn crash_before_the_handler_returns_redelivers_seen_first() {
    crash_after_receive(ResumeStrategy::SeenFirst).await;
}

/// A stream whose filter rejects everything still records its settled position (the
/// heartbeat), so a restart resumes near the head instead of re-reading everything.
#[tokio::test(start_paused = true)]
async fn filter_heavy_idle_stream_resumes_near_the_head() {
    let backend = MemoryBackend::new();
    let d = def("picky", |d| {
        d.checkpoint.resume_strategy = ResumeStrategy::ProcessedFirst
    });
    let probe = Probe::default().with_filter(|_| false);
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, 1..=200);
    wait_status(&rt, "picky", |s| s.counters.filtered == 200).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    rt.shutdown().await;
    let (seen, processed) = stored_tokens(&backend, "picky");
    assert_eq!(processed, None, "nothing was handled");
    assert_eq!(seen.as_deref(), Some(token_of(200).as_str()));

    let probe = Probe::default().with_filter(|_| false);
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [201]);
    let st = wait_status(&rt, "picky", |s| s.counters.filtered >= 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let st2 = rt.handle().status("picky").unwrap();
    rt.shutdown().await;
    assert_eq!(
        st.counters.received, 1,
        "only the new change was read: {st:?}"
    );
    assert_eq!(st2.counters.received, 1);
}

/// An idle stream advances its stored position with the source's post-batch tokens.
#[tokio::test(start_paused = true)]
async fn idle_post_batch_tokens_advance_the_seen_position() {
    let backend = MemoryBackend::new();
    backend
        .collection("elsewhere")
        .insert_many((0..50).map(|i| doc! {"_id": i}))
        .unwrap();
    let probe = Probe::default();
    let rt = start(&backend, &probe, def("quiet", |_| {})).await;
    backend
        .collection("elsewhere")
        .insert_many((50..60).map(|i| doc! {"_id": i}))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    rt.shutdown().await;
    assert!(probe.calls().is_empty());
    assert_eq!(
        stored_tokens(&backend, "quiet").0.as_deref(),
        Some(token_of(60).as_str())
    );
}

async fn history_lost_run(
    policy: OnHistoryLost,
) -> (MemoryBackend, Probe, flowwarden::StreamStatus) {
    let backend = MemoryBackend::new();
    let name: &'static str = match policy {
        OnHistoryLost::Fail => "lost-fail",
        OnHistoryLost::ResumeFromOplogStart => "lost-oplog-start",
        OnHistoryLost::ResumeFromNow => "lost-now",
    };
    let d = def(name, |d| d.checkpoint.on_history_lost = policy);
    let probe = Probe::default();
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [1, 2]);
    wait_until("2 handled", || probe.successes().len() == 2).await;
    rt.shutdown().await;
    // While the stream is down, more changes happen and history is truncated past its position.
    insert_ids(&backend, [3, 4, 5]);
    backend.faults().truncate_history(2); // keeps 4 and 5: 3 is gone
    let probe = Probe::default();
    let rt = start(&backend, &probe, d).await;
    let st = match policy {
        OnHistoryLost::Fail => {
            wait_status(&rt, name, |s| s.state == StreamState::HistoryLost).await
        }
        _ => {
            insert_ids(&backend, [6]);
            wait_until("6 handled", || {
                probe.handled_keys().contains(&Bson::Int32(6))
            })
            .await;
            rt.handle().status(name).unwrap()
        }
    };
    rt.shutdown().await;
    (backend, probe, st)
}

#[tokio::test(start_paused = true)]
async fn history_lost_with_fail_refuses_to_start_and_says_why() {
    let (backend, probe, st) = history_lost_run(OnHistoryLost::Fail).await;
    let halt = st.halt.expect("halted");
    assert_eq!(halt.reason, HaltReason::HistoryLost);
    assert_eq!(halt.runbook, "docs/runbooks/history-lost.md");
    assert!(halt.message.contains("lost-fail"), "{}", halt.message);
    assert!(
        halt.message.contains("2026-"),
        "names the last checkpoint time: {}",
        halt.message
    );
    assert!(probe.calls().is_empty());
    assert_eq!(st.counters.history_lost, 0);
    // The checkpoint was not reset.
    assert_eq!(
        stored_tokens(&backend, "lost-fail").1.as_deref(),
        Some(token_of(2).as_str())
    );
}

#[tokio::test(start_paused = true)]
async fn history_lost_with_resume_from_oplog_start_replays_what_is_retained() {
    let (_b, probe, st) = history_lost_run(OnHistoryLost::ResumeFromOplogStart).await;
    assert_eq!(probe.handled_keys(), ids(&[4, 5, 6]));
    assert_eq!(st.counters.history_lost, 1);
    assert_eq!(st.state, StreamState::Running);
}

#[tokio::test(start_paused = true)]
async fn history_lost_with_resume_from_now_skips_to_new_changes_loudly() {
    let (_b, probe, st) = history_lost_run(OnHistoryLost::ResumeFromNow).await;
    assert_eq!(probe.handled_keys(), ids(&[6]));
    assert_eq!(st.counters.history_lost, 1, "the gap is counted");
}

/// A transient error during the resume check is retried, not treated as lost history.
#[tokio::test(start_paused = true)]
async fn a_step_down_during_the_resume_check_is_not_history_lost() {
    let backend = MemoryBackend::new();
    let d = def("stepdown", |d| {
        d.checkpoint.on_history_lost = OnHistoryLost::ResumeFromNow
    });
    let probe = Probe::default();
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [1]);
    wait_until("1 handled", || probe.successes().len() == 1).await;
    rt.shutdown().await;
    insert_ids(&backend, [2]);
    backend.faults().fail_next_opens(
        3,
        flowwarden::port::SourceErrorKind::Resumable,
        "not primary (10107)",
    );
    let probe = Probe::default();
    let rt = start(&backend, &probe, d).await;
    wait_until("2 handled", || probe.successes().len() == 1).await;
    let st = rt.handle().status("stepdown").unwrap();
    rt.shutdown().await;
    assert_eq!(
        probe.handled_keys(),
        ids(&[2]),
        "resumed from the checkpoint, not from now"
    );
    assert_eq!(st.counters.history_lost, 0);
    assert_eq!(st.counters.restarts, 3);
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_fails_twice_then_succeeds_is_retried() {
    let backend = MemoryBackend::new();
    let probe = Probe::new(|ctx| {
        async move {
            if ctx.attempt() < 3 {
                Err(HandlerError::msg("transient"))
            } else {
                Ok(())
            }
        }
        .boxed()
    });
    let rt = start(&backend, &probe, def("flaky", |_| {})).await;
    insert_ids(&backend, [1]);
    wait_until("handled", || probe.successes().len() == 1).await;
    let st = rt.handle().status("flaky").unwrap();
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    rt.shutdown().await;
    assert_eq!(
        probe.calls().iter().map(|c| c.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(st.counters.retried, 2);
    assert!(dead.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_always_fails_is_dead_lettered_and_the_stream_goes_on() {
    #[derive(Debug, thiserror::Error)]
    #[error("payment service refused")]
    struct Refused(#[source] std::io::Error);
    let backend = MemoryBackend::new();
    let probe = Probe::new(|ctx| {
        async move {
            if ctx.document_key() == Some(&doc! {"_id": 1}) {
                Err(Refused(std::io::Error::other("connection reset")).into())
            } else {
                Ok(())
            }
        }
        .boxed()
    });
    let rt = start(&backend, &probe, def("poison", |_| {})).await;
    insert_ids(&backend, [1, 2]);
    wait_until("2 handled", || probe.handled_keys() == ids(&[2])).await;
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    rt.shutdown().await;
    assert_eq!(dead.len(), 1);
    let r = &dead[0];
    assert_eq!(r.stream, "poison");
    assert_eq!(r.attempts, 3);
    assert_eq!(
        r.error_chain,
        ["payment service refused", "connection reset"]
    );
    assert_eq!(r.operation_type, "insert");
    assert_eq!(r.document_key, Some(doc! {"_id": 1}));
    assert_eq!(r.token.data(), Some(token_of(1).as_str()));
    assert_eq!(
        r.event.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "n": 1}
    );
    assert!(r.first_failed_at <= r.last_failed_at);
    assert_eq!(
        stored_tokens(&backend, "poison").1.as_deref(),
        Some(token_of(2).as_str())
    );
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_counts_as_a_failure() {
    let backend = MemoryBackend::new();
    let probe = Probe::new(|ctx| {
        async move {
            if ctx.document_key() == Some(&doc! {"_id": 1}) {
                panic!("index out of bounds");
            }
            Ok(())
        }
        .boxed()
    });
    let rt = start(&backend, &probe, def("panics", |_| {})).await;
    insert_ids(&backend, [1, 2]);
    wait_until("2 handled", || probe.handled_keys() == ids(&[2])).await;
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    rt.shutdown().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error_kind, "Panicked");
    assert!(dead[0].error_chain[0].contains("index out of bounds"));
    assert_eq!(dead[0].attempts, 3);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_filter_fails_the_event_not_the_stream() {
    let backend = MemoryBackend::new();
    let probe = Probe::default().with_filter(|ctx| {
        if ctx.document_key() == Some(&doc! {"_id": 1}) {
            panic!("filter bug");
        }
        true
    });
    let rt = start(&backend, &probe, def("bad-filter", |_| {})).await;
    insert_ids(&backend, [1, 2]);
    wait_until("2 handled", || probe.handled_keys() == ids(&[2])).await;
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    rt.shutdown().await;
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].error_chain[0].contains("filter bug"),
        "{:?}",
        dead[0].error_chain
    );
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_lets_the_in_flight_handler_finish_and_checkpoints_it() {
    let backend = MemoryBackend::new();
    let probe = Probe::new(|_| {
        async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(())
        }
        .boxed()
    });
    let rt = start(
        &backend,
        &probe,
        def("graceful", |d| d.checkpoint.save_every_n = 100),
    )
    .await;
    insert_ids(&backend, [1]);
    wait_until("received", || probe.calls().len() == 1).await;
    rt.shutdown().await;
    assert_eq!(probe.successes().len(), 1, "the in-flight handler finished");
    assert_eq!(
        stored_tokens(&backend, "graceful").1.as_deref(),
        Some(token_of(1).as_str())
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_past_the_shutdown_timeout_is_abandoned_unsettled() {
    let backend = MemoryBackend::new();
    let probe = Probe::new(|_| {
        async {
            tokio::time::sleep(Duration::from_secs(600)).await;
            Ok(())
        }
        .boxed()
    });
    let rt = start(&backend, &probe, def("slow-stop", |_| {})).await;
    insert_ids(&backend, [1]);
    wait_until("received", || probe.calls().len() == 1).await;
    rt.shutdown().await;
    assert!(probe.successes().is_empty());
    assert_eq!(
        stored_tokens(&backend, "slow-stop").1,
        None,
        "the abandoned event is not checkpointed"
    );
}

#[tokio::test(start_paused = true)]
async fn stopping_a_stream_flushes_its_settled_progress() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let d = def("flush", |d| {
        d.checkpoint.save_every_n = 10;
        d.checkpoint.save_interval_secs = 0;
    });
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [1, 2, 3]);
    wait_until("3 handled", || probe.successes().len() == 3).await;
    assert_eq!(stored_tokens(&backend, "flush").1, None, "not yet due");
    rt.handle().stop("flush").await.unwrap();
    assert_eq!(
        stored_tokens(&backend, "flush").1.as_deref(),
        Some(token_of(3).as_str())
    );
    assert_eq!(
        rt.handle().status("flush").unwrap().state,
        StreamState::Stopped
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn exhausted_retries_without_a_dead_letter_store_halt_instead_of_dropping() {
    let backend = MemoryBackend::new();
    let probe = Probe::new(|_| async { Err(HandlerError::msg("always")) }.boxed());
    let rt = start_with(&backend, &probe, def("no-dlq", |_| {}), |b| {
        b.without_dead_letters()
    })
    .await;
    insert_ids(&backend, [1]);
    let st = wait_status(&rt, "no-dlq", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    let halt = st.halt.unwrap();
    assert_eq!(halt.reason, HaltReason::NoDeadLetterStore);
    assert_eq!(halt.runbook, "docs/runbooks/handler-failures.md");
    assert_eq!(
        stored_tokens(&backend, "no-dlq").1,
        None,
        "the failed event is not settled"
    );
    // On restart (with a store) the event comes back.
    let probe = Probe::default();
    let rt = start(&backend, &probe, def("no-dlq", |_| {})).await;
    wait_until("redelivered", || probe.successes().len() == 1).await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_dead_letter_write_leaves_the_event_unsettled_then_halts() {
    let backend = MemoryBackend::new();
    backend.faults().fail_next_dead_letter_puts(1_000);
    let probe = Probe::new(|_| async { Err(HandlerError::msg("always")) }.boxed());
    let rt = start_with(&backend, &probe, def("dlq-down", |_| {}), |b| {
        b.dead_letter_write_attempts(3)
    })
    .await;
    insert_ids(&backend, [1]);
    let st = wait_status(&rt, "dlq-down", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    assert_eq!(st.halt.unwrap().reason, HaltReason::DeadLetterStoreFailed);
    assert_eq!(st.counters.dead_lettered, 0);
    assert_eq!(stored_tokens(&backend, "dlq-down").1, None);
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_write_that_recovers_settles_the_event() {
    let backend = MemoryBackend::new();
    backend.faults().fail_next_dead_letter_puts(2);
    let probe = Probe::new(|_| async { Err(HandlerError::msg("always")) }.boxed());
    let rt = start(&backend, &probe, def("dlq-flaky", |_| {})).await;
    insert_ids(&backend, [1]);
    wait_status(&rt, "dlq-flaky", |s| s.counters.dead_lettered == 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    rt.shutdown().await;
    assert_eq!(
        stored_tokens(&backend, "dlq-flaky").1.as_deref(),
        Some(token_of(1).as_str())
    );
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_record_too_large_is_truncated_with_a_marker() {
    let backend = MemoryBackend::new();
    backend.set_dead_letter_max_bytes(4_096);
    let probe = Probe::new(|_| async { Err(HandlerError::msg("always")) }.boxed());
    let rt = start(&backend, &probe, def("huge", |_| {})).await;
    backend
        .collection("orders")
        .insert_one(doc! {"_id": 1, "blob": "x".repeat(20_000)})
        .unwrap();
    wait_status(&rt, "huge", |s| s.counters.dead_lettered == 1).await;
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    rt.shutdown().await;
    assert!(dead[0].truncated);
    let marker = dead[0].event.get_document("_fw_truncated").unwrap();
    assert!(marker.get_i64("originalBytes").unwrap() > 20_000);
    assert_eq!(dead[0].document_key, Some(doc! {"_id": 1}));
}

#[tokio::test(start_paused = true)]
async fn dead_letter_records_are_idempotent_per_event() {
    let backend = MemoryBackend::new();
    let probe = Probe::new(|_| async { Err(HandlerError::msg("always")) }.boxed());
    let rt = start(&backend, &probe, def("idem", |_| {})).await;
    insert_ids(&backend, [1]);
    wait_status(&rt, "idem", |s| s.counters.dead_lettered == 1).await;
    // The source redelivers the same event; it fails again.
    backend.faults().rewind_cursors(1);
    insert_ids(&backend, [2]);
    wait_status(&rt, "idem", |s| s.counters.dead_lettered == 3).await;
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    rt.shutdown().await;
    assert_eq!(dead.len(), 2, "one record per event, not per delivery");
    assert_eq!(dead[0].attempts, 6, "attempts of both deliveries are kept");
}

#[tokio::test(start_paused = true)]
async fn dead_letters_can_be_replayed_and_discarded() {
    let backend = MemoryBackend::new();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = fail.clone();
    let probe = Probe::new(move |_| {
        let f = f.clone();
        async move {
            if f.load(Ordering::SeqCst) {
                Err(HandlerError::msg("down"))
            } else {
                Ok(())
            }
        }
        .boxed()
    });
    let rt = start(&backend, &probe, def("replay", |_| {})).await;
    insert_ids(&backend, [1, 2]);
    wait_status(&rt, "replay", |s| s.counters.dead_lettered == 2).await;
    let dl = rt.handle().dead_letters();
    let records = dl.list(&Default::default()).await.unwrap();
    assert!(matches!(
        dl.replay(&records[0].id).await,
        Err(flowwarden::DeadLetterError::ReplayFailed { .. })
    ));
    fail.store(false, Ordering::SeqCst);
    dl.replay(&records[0].id).await.unwrap();
    dl.discard(&records[1].id).await.unwrap();
    let after = dl.list(&Default::default()).await.unwrap();
    rt.shutdown().await;
    assert_eq!(
        after[0].status,
        flowwarden::port::DeadLetterStatus::Replayed
    );
    assert_eq!(
        after[1].status,
        flowwarden::port::DeadLetterStatus::Discarded
    );
    assert_eq!(probe.handled_keys(), ids(&[1]));
}

#[tokio::test(start_paused = true)]
async fn skip_is_counted_and_settles_and_halt_stops_without_settling() {
    let backend = MemoryBackend::new();
    let probe = Probe::new(|_| async { Err(HandlerError::msg("nope")) }.boxed())
        .with_on_error(|_| ErrorAction::Skip);
    let rt = start(&backend, &probe, def("skipper", |_| {})).await;
    insert_ids(&backend, [1]);
    let st = wait_status(&rt, "skipper", |s| s.counters.skipped == 1).await;
    rt.shutdown().await;
    assert_eq!(st.counters.dead_lettered, 0);
    assert_eq!(probe.calls().len(), 1, "skip does not retry");
    assert_eq!(
        stored_tokens(&backend, "skipper").1.as_deref(),
        Some(token_of(1).as_str())
    );

    let backend = MemoryBackend::new();
    let probe = Probe::new(|_| async { Err(HandlerError::msg("nope")) }.boxed())
        .with_on_error(|_| ErrorAction::Halt);
    let rt = start(&backend, &probe, def("halter", |_| {})).await;
    insert_ids(&backend, [1]);
    let st = wait_status(&rt, "halter", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    assert_eq!(st.halt.unwrap().reason, HaltReason::HaltRequested);
    assert_eq!(stored_tokens(&backend, "halter").1, None);
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_checkpoint_stops_the_stream_naming_it_and_the_field() {
    let backend = MemoryBackend::new();
    backend.put_checkpoint_document(
        "scarred",
        doc! {"_id": "scarred", "lastSeenToken": 42, "updatedAt": bson::DateTime::now()},
    );
    let probe = Probe::default();
    let rt = start(&backend, &probe, def("scarred", |_| {})).await;
    let st = wait_status(&rt, "scarred", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    let halt = st.halt.unwrap();
    assert_eq!(halt.reason, HaltReason::CorruptCheckpoint);
    assert!(
        halt.message.contains("scarred") && halt.message.contains("lastSeenToken"),
        "{}",
        halt.message
    );
    assert_eq!(halt.runbook, "docs/runbooks/corrupt-checkpoint.md");
    assert!(
        backend
            .checkpoint_document("scarred")
            .unwrap()
            .get_i32("lastSeenToken")
            .is_ok(),
        "not reset"
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_collection_delivers_drop_and_invalidate_then_stops_with_the_runbook() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = start(&backend, &probe, def("dropped", |_| {})).await;
    insert_ids(&backend, [1]);
    backend.collection("orders").drop_collection();
    let st = wait_status(&rt, "dropped", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    let ops: Vec<String> = probe.successes().into_iter().map(|c| c.op).collect();
    assert_eq!(ops, ["insert", "drop", "invalidate"]);
    let halt = st.halt.unwrap();
    assert_eq!(halt.reason, HaltReason::Invalidated);
    assert_eq!(halt.runbook, "docs/runbooks/invalidate.md");
    assert_eq!(st.state, StreamState::Stopped);
}

/// A stream without `#[on_change]` leaves drop and invalidate unrouted. The invalidate is
/// settled all the same, so a restart after the collection was recreated starts after it
/// (under the default `ProcessedFirst` too) and reads the new collection, instead of replaying
/// the drop and halting `Invalidated` again.
#[tokio::test(start_paused = true)]
async fn a_restart_after_an_unrouted_invalidate_reads_the_recreated_collection() {
    let backend = MemoryBackend::new();
    let probe = Probe::default().routing_only(&["insert"]);
    let d = def("recreated", |_| {});
    assert_eq!(d.checkpoint.resume_strategy, ResumeStrategy::ProcessedFirst);
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [1]);
    wait_until("1 handled", || probe.successes().len() == 1).await;
    backend.collection("orders").drop_collection();
    let st = wait_status(&rt, "recreated", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    assert_eq!(st.halt.unwrap().reason, HaltReason::Invalidated);

    insert_ids(&backend, [2, 3]);
    let rt = start(&backend, &probe, d).await;
    wait_until("the recreated collection's inserts", || {
        probe.handled_keys() == ids(&[1, 2, 3])
    })
    .await;
    let st = rt.handle().status("recreated").unwrap();
    rt.shutdown().await;
    assert!(st.halt.is_none(), "halted again: {:?}", st.halt);
    assert_eq!(st.state, StreamState::Running);
}

/// Found by the simulation (seeds 22 and 1362 once drop + recreate + restart was modelled):
/// when the checkpoint store refused the write of the settled invalidate, the stream halted
/// `Invalidated` with the checkpoint still before the drop, so the operator's restart replayed
/// the drop and halted again. The stream now halts only once the invalidate is stored
/// (retrying with the restart backoff), so the restart reads the recreated collection.
#[tokio::test(start_paused = true)]
async fn an_invalidate_is_stored_before_the_stream_halts_even_through_store_failures() {
    let backend = MemoryBackend::new();
    let probe = Probe::default().routing_only(&["insert"]);
    let d = def("invalidate-stored", |d| d.restart.max_attempts = 0);
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [1]);
    wait_until("1 handled", || probe.successes().len() == 1).await;
    backend.faults().fail_next_checkpoint_saves(3);
    backend.collection("orders").drop_collection();
    let st = wait_status(&rt, "invalidate-stored", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    assert_eq!(st.halt.unwrap().reason, HaltReason::Invalidated);
    assert!(st.counters.checkpoint_failures >= 3, "{:?}", st.counters);
    let stored = backend
        .checkpoint_document("invalidate-stored")
        .expect("a checkpoint");
    assert_eq!(
        stored.get_bool("lastSeenStartAfter").ok(),
        Some(true),
        "the invalidate's token is stored for startAfter before the halt: {stored}"
    );

    insert_ids(&backend, [2, 3]);
    let rt = start(&backend, &probe, d).await;
    wait_until("the recreated collection's inserts", || {
        probe.handled_keys() == ids(&[1, 2, 3])
    })
    .await;
    let st = rt.handle().status("invalidate-stored").unwrap();
    rt.shutdown().await;
    assert!(st.halt.is_none(), "halted again: {:?}", st.halt);
}

#[tokio::test(start_paused = true)]
async fn checkpoint_store_outages_delay_progress_but_lose_nothing() {
    let backend = MemoryBackend::new();
    backend.faults().fail_next_checkpoint_saves(3);
    let probe = Probe::default();
    let rt = start(&backend, &probe, def("cp-outage", |_| {})).await;
    insert_ids(&backend, [1, 2, 3, 4]);
    wait_until("4 handled", || probe.successes().len() == 4).await;
    rt.shutdown().await;
    let st_tokens = stored_tokens(&backend, "cp-outage");
    assert_eq!(st_tokens.1.as_deref(), Some(token_of(4).as_str()));
}

#[tokio::test(start_paused = true)]
async fn restart_control_resumes_from_the_checkpoint() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = start(&backend, &probe, def("ctl", |_| {})).await;
    insert_ids(&backend, [1]);
    wait_until("1", || probe.successes().len() == 1).await;
    rt.handle().stop("ctl").await.unwrap();
    insert_ids(&backend, [2]);
    rt.handle().start("ctl").unwrap();
    wait_until("2", || probe.successes().len() == 2).await;
    rt.handle().restart("ctl").await.unwrap();
    insert_ids(&backend, [3]);
    wait_until("3", || probe.successes().len() == 3).await;
    rt.shutdown().await;
    assert_eq!(probe.handled_keys(), ids(&[1, 2, 3]));
}

/// The crash test must be able to fail: with the classic bug switched on (a position counted
/// as done when it is received), the change in flight at the crash is lost — and the same
/// assertions that pass above detect it.
#[tokio::test(start_paused = true)]
async fn the_crash_test_catches_the_classic_seen_as_done_bug() {
    let backend = MemoryBackend::new();
    let d = def("buggy", |_| {});
    let probe = Probe::new(|ctx| {
        async move {
            if ctx.document_key() == Some(&doc! {"_id": 2}) {
                std::future::pending::<()>().await;
            }
            Ok(())
        }
        .boxed()
    });
    let rt = start_with(&backend, &probe, d, |b| b.checkpoint_on_receipt(true)).await;
    insert_ids(&backend, [1, 2]);
    wait_until("2 received", || probe.calls().len() == 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    rt.handle().crash().await;
    assert_eq!(
        stored_tokens(&backend, "buggy").0.as_deref(),
        Some(token_of(2).as_str()),
        "the bug checkpoints the in-flight change"
    );
    let again = Probe::default();
    let rt = start(&backend, &again, d).await;
    insert_ids(&backend, [3]);
    wait_until("3 handled", || !again.successes().is_empty()).await;
    rt.shutdown().await;
    assert_eq!(
        again.handled_keys(),
        ids(&[3]),
        "change 2 was silently lost: the check would fail"
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_can_dead_letter_its_event_and_force_a_checkpoint() {
    let backend = MemoryBackend::new();
    let probe = Probe::new(|ctx| {
        async move {
            match ctx.document_key().and_then(|k| k.get_i32("_id").ok()) {
                Some(1) => ctx.dead_letter("order 1 references an unknown customer"),
                Some(2) => ctx.save_checkpoint_now(),
                _ => {}
            }
            Ok(())
        }
        .boxed()
    });
    let d = def("requests", |d| {
        d.checkpoint.save_every_n = 1_000;
        d.checkpoint.save_interval_secs = 0;
    });
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [1]);
    wait_status(&rt, "requests", |s| s.counters.dead_lettered == 1).await;
    assert_eq!(
        stored_tokens(&backend, "requests").1,
        None,
        "nothing forces a save yet"
    );
    insert_ids(&backend, [2]);
    wait_until("saved now", || {
        stored_tokens(&backend, "requests").1.is_some()
    })
    .await;
    assert_eq!(
        stored_tokens(&backend, "requests").1.as_deref(),
        Some(token_of(2).as_str())
    );
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    rt.shutdown().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error_kind, "DeadLetterRequested");
    assert_eq!(
        dead[0].error_chain,
        ["order 1 references an unknown customer"]
    );
    assert_eq!(
        probe.calls().len(),
        2,
        "a requested dead letter is not retried"
    );
}

/// A stream that starts with no checkpoint starts at the head — and makes that start durable
/// at once, so a crash before its first checkpoint does not restart it at a later "now".
#[tokio::test(start_paused = true)]
async fn a_crash_before_the_first_checkpoint_does_not_skip_to_a_later_now() {
    let backend = MemoryBackend::new();
    let d = def("first-start", |d| {
        d.checkpoint.save_every_n = 1_000;
        d.checkpoint.save_interval_secs = 0;
    });
    let probe = Probe::new(|_| std::future::pending::<Result<(), HandlerError>>().boxed());
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [1]);
    wait_until("1 received", || probe.calls().len() == 1).await;
    rt.handle().crash().await;
    insert_ids(&backend, [2]);
    let again = Probe::default();
    let rt = start(&backend, &again, d).await;
    wait_until("1 and 2 handled", || again.successes().len() == 2).await;
    rt.shutdown().await;
    assert_eq!(again.handled_keys(), ids(&[1, 2]));
}
