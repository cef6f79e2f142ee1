//! Keyed concurrency (`#[change_stream(concurrency = N)]`) on the in-memory backend, in virtual
//! time: same key in order and one at a time, different keys in parallel, barriers, the
//! `max_in_flight` bound, the checkpoint on the settled prefix, halts and stops, and a `#[key]`
//! method that orders by a field of the document instead of the `documentKey`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, Document};
use flowwarden::{
    change_stream, checkpoint, ChangeContext, ConcurrencyConfig, ErrorAction, HaltReason,
    HandlerError, MemoryBackend,
};
use futures::FutureExt;
use support::*;
use tokio::sync::Notify;
use tokio::time::Instant;

/// One handler run: what it handled and when (virtual time).
#[derive(Debug, Clone)]
struct Run {
    label: String,
    key: Option<Bson>,
    start: Instant,
    end: Option<Instant>,
}

#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<Run>>>);

impl Runs {
    fn begin(&self, label: String, key: Option<Bson>) -> usize {
        let mut v = self.0.lock().unwrap();
        v.push(Run {
            label,
            key,
            start: Instant::now(),
            end: None,
        });
        v.len() - 1
    }

    fn end(&self, i: usize) {
        self.0.lock().unwrap()[i].end = Some(Instant::now());
    }

    fn all(&self) -> Vec<Run> {
        self.0.lock().unwrap().clone()
    }

    /// The most runs ever in progress at once.
    fn max_overlap(&self) -> usize {
        let runs = self.all();
        runs.iter()
            .map(|r| {
                runs.iter()
                    .filter(|o| o.start <= r.start && o.end.is_none_or(|e| e > r.start))
                    .count()
            })
            .max()
            .unwrap_or(0)
    }
}

fn label(doc: Option<&Document>, op: &str) -> String {
    match doc.and_then(|d| d.get("_id")) {
        Some(id) => format!("{op} {id}"),
        None => op.to_owned(),
    }
}

/// A probe that records each run and sleeps `ms` of the document (100 ms without one).
fn sleeping_probe(runs: &Runs) -> Probe {
    let runs = runs.clone();
    Probe::new(move |ctx| {
        let runs = runs.clone();
        async move {
            let key = ctx.document_key().and_then(|k| k.get("_id").cloned());
            let i = runs.begin(
                label(ctx.document_key(), ctx.operation_type().as_str()),
                key,
            );
            let ms = ctx
                .document()
                .and_then(|d| d.get_i32("ms").ok())
                .unwrap_or(100);
            tokio::time::sleep(Duration::from_millis(ms as u64)).await;
            runs.end(i);
            Ok(())
        }
        .boxed()
    })
}

fn concurrent(n: u32, max_in_flight: u32) -> impl FnOnce(&mut flowwarden::StreamDefinition) {
    move |d| {
        d.concurrency = ConcurrencyConfig {
            concurrency: n,
            max_in_flight,
        };
        d.checkpoint.save_every_n = 1;
    }
}

#[tokio::test(start_paused = true)]
async fn one_key_runs_in_order_one_at_a_time_while_keys_run_in_parallel() {
    let backend = MemoryBackend::new();
    let runs = Runs::default();
    let probe = sleeping_probe(&runs);
    let rt = start(&backend, &probe, def("keyed", concurrent(4, 0))).await;
    let c = backend.collection("orders");
    // Six keys, three changes each, interleaved; key 0's first change is slow.
    for round in 0..3 {
        for k in 0..6 {
            let ms = if round == 0 && k == 0 {
                700
            } else {
                100 + 10 * k
            };
            if round == 0 {
                c.insert_one(doc! {"_id": k, "round": round, "ms": ms})
                    .unwrap();
            } else {
                c.replace_one(doc! {"_id": k}, doc! {"round": round, "ms": ms})
                    .unwrap();
            }
        }
    }
    wait_until("18 handled", || probe.successes().len() == 18).await;
    rt.shutdown().await;

    let all = runs.all();
    for k in 0..6 {
        let of_key: Vec<&Run> = all
            .iter()
            .filter(|r| r.key == Some(Bson::Int32(k)))
            .collect();
        let ops: Vec<&str> = of_key.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            ops,
            [
                format!("insert {k}"),
                format!("replace {k}"),
                format!("replace {k}")
            ],
            "key {k} in stream order"
        );
        for w in of_key.windows(2) {
            assert!(
                w[0].end.is_some_and(|e| e <= w[1].start),
                "key {k}: a change started before the previous one of its key finished: {w:?}"
            );
        }
    }
    assert_eq!(
        runs.max_overlap(),
        4,
        "up to concurrency = 4 at once, never more"
    );
    // The slow first change of key 0 did not hold up the other keys.
    let slow_end = all[0].end.expect("finished");
    assert!(
        all.iter()
            .filter(|r| r.key != Some(Bson::Int32(0)) && r.end.is_some_and(|e| e <= slow_end))
            .count()
            >= 5,
        "other keys ran while key 0's slow change did: {all:?}"
    );
    let (seen, processed) = stored_tokens(&backend, "keyed");
    assert_eq!(processed.as_deref(), Some(token_of(18).as_str()));
    assert_eq!(seen.as_deref(), Some(token_of(18).as_str()));
}

#[tokio::test(start_paused = true)]
async fn a_change_without_a_document_key_is_a_barrier() {
    let backend = MemoryBackend::new();
    let runs = Runs::default();
    let probe = sleeping_probe(&runs);
    let rt = start(&backend, &probe, def("barrier", concurrent(8, 0))).await;
    let c = backend.collection("orders");
    c.insert_one(doc! {"_id": 1, "ms": 300}).unwrap();
    c.insert_one(doc! {"_id": 2, "ms": 200}).unwrap();
    c.drop_collection();
    wait_status(&rt, "barrier", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    let all = runs.all();
    let labels: Vec<&str> = all.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["insert 1", "insert 2", "drop", "invalidate"]);
    let last_insert_end = all[..2].iter().filter_map(|r| r.end).max().expect("ended");
    assert!(
        all[2].start >= last_insert_end,
        "the drop started before the inserts settled: {all:?}"
    );
    assert!(
        all[3].start >= all[2].end.expect("drop ended"),
        "the invalidate started while the drop ran: {all:?}"
    );
    assert!(
        all[0].start == all[1].start,
        "the inserts (two keys) ran in parallel"
    );
}

#[tokio::test(start_paused = true)]
async fn the_reader_waits_when_max_in_flight_events_are_unsettled() {
    let backend = MemoryBackend::new();
    let gate = Arc::new(Notify::new());
    let g = gate.clone();
    let probe = Probe::new(move |_| {
        let g = g.clone();
        async move {
            g.notified().await;
            Ok(())
        }
        .boxed()
    });
    let rt = start(&backend, &probe, def("bounded", concurrent(2, 5))).await;
    insert_ids(&backend, 1..=20);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let st = rt.handle().status("bounded").expect("stream");
    assert_eq!(
        st.counters.received, 5,
        "max_in_flight = 5 received and unsettled"
    );
    assert_eq!(probe.calls().len(), 2, "concurrency = 2 handlers running");
    for _ in 0..40 {
        gate.notify_waiters();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_until("20 handled", || probe.successes().len() == 20).await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_checkpoint_never_passes_an_in_flight_event() {
    let backend = MemoryBackend::new();
    let gate = Arc::new(Notify::new());
    let probe = stalling_on(1, gate.clone());
    let rt = start(&backend, &probe, def("prefix", concurrent(4, 0))).await;
    let (start_seen, _) = stored_tokens(&backend, "prefix");
    insert_ids(&backend, [1, 2, 3]);
    wait_until("2 and 3 handled", || probe.successes().len() == 2).await;
    // A heartbeat and save_every_n = 1 both had their chance.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (seen, processed) = stored_tokens(&backend, "prefix");
    assert_eq!(seen, start_seen, "#2 and #3 settled, but #1 is in flight");
    assert_eq!(processed, None);
    gate.notify_one();
    wait_until("1 handled", || probe.successes().len() == 3).await;
    rt.shutdown().await;
    let (seen, processed) = stored_tokens(&backend, "prefix");
    assert_eq!(seen.as_deref(), Some(token_of(3).as_str()));
    assert_eq!(processed.as_deref(), Some(token_of(3).as_str()));
}

#[tokio::test(start_paused = true)]
async fn a_retrying_event_holds_back_only_its_own_key() {
    let backend = MemoryBackend::new();
    let runs = Runs::default();
    let r = runs.clone();
    let probe = Probe::new(move |ctx| {
        let r = r.clone();
        async move {
            let key = ctx.document_key().and_then(|k| k.get("_id").cloned());
            let i = r.begin(format!("attempt {}", ctx.attempt()), key.clone());
            r.end(i);
            let op = ctx.operation_type().as_str();
            if key == Some(Bson::Int32(1)) && op == "insert" && ctx.attempt() < 3 {
                return Err(HandlerError::msg("not yet"));
            }
            Ok(())
        }
        .boxed()
    });
    // Retries after 100 ms and 200 ms.
    let rt = start(&backend, &probe, def("retrying", concurrent(4, 0))).await;
    let c = backend.collection("orders");
    c.insert_one(doc! {"_id": 1}).unwrap();
    c.insert_one(doc! {"_id": 2}).unwrap();
    c.replace_one(doc! {"_id": 1}, doc! {"v": 2}).unwrap();
    c.replace_one(doc! {"_id": 2}, doc! {"v": 2}).unwrap();
    wait_until("4 handled", || probe.successes().len() == 4).await;
    rt.shutdown().await;
    let order: Vec<(Option<Bson>, String)> = probe
        .successes()
        .into_iter()
        .map(|c| (c.key, c.op))
        .collect();
    assert_eq!(
        order,
        [
            (Some(Bson::Int32(2)), "insert".to_owned()),
            (Some(Bson::Int32(2)), "replace".to_owned()),
            (Some(Bson::Int32(1)), "insert".to_owned()),
            (Some(Bson::Int32(1)), "replace".to_owned()),
        ],
        "key 2 went on while key 1 retried; key 1 kept its order"
    );
    let key1: Vec<String> = runs
        .all()
        .into_iter()
        .filter(|r| r.key == Some(Bson::Int32(1)))
        .map(|r| r.label)
        .collect();
    assert_eq!(key1, ["attempt 1", "attempt 2", "attempt 3", "attempt 1"]);
}

#[tokio::test(start_paused = true)]
async fn a_halt_waits_for_the_in_flight_handlers_and_keeps_the_failed_event_unsettled() {
    let backend = MemoryBackend::new();
    let runs = Runs::default();
    let r = runs.clone();
    let probe = Probe::new(move |ctx| {
        let r = r.clone();
        async move {
            let key = ctx.document_key().and_then(|k| k.get("_id").cloned());
            let i = r.begin("run".into(), key.clone());
            if key == Some(Bson::Int32(2)) {
                // Late enough for #1 and #3 to be in flight.
                tokio::time::sleep(Duration::from_millis(100)).await;
                r.end(i);
                return Err(HandlerError::msg("halt me"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            r.end(i);
            Ok(())
        }
        .boxed()
    })
    .with_on_error(|_| ErrorAction::Halt);
    let rt = start(&backend, &probe, def("halting", concurrent(4, 0))).await;
    insert_ids(&backend, [1, 2, 3]);
    let st = wait_status(&rt, "halting", |s| s.halt.is_some()).await;
    assert_eq!(st.halt.map(|h| h.reason), Some(HaltReason::HaltRequested));
    let handled: Vec<Bson> = probe.handled_keys();
    assert_eq!(
        handled.len(),
        2,
        "#1 and #3 were in flight when #2 asked to halt; they finished: {handled:?}"
    );
    rt.shutdown().await;
    let (seen, processed) = stored_tokens(&backend, "halting");
    assert_eq!(
        processed.as_deref(),
        Some(token_of(1).as_str()),
        "the checkpoint stops before the failed #2, though #3 was handled"
    );
    assert_eq!(seen.as_deref(), Some(token_of(1).as_str()));
}

#[tokio::test(start_paused = true)]
async fn a_stop_waits_for_the_in_flight_handlers_then_checkpoints_the_settled_prefix() {
    let backend = MemoryBackend::new();
    let runs = Runs::default();
    let probe = sleeping_probe(&runs);
    let rt = start(&backend, &probe, def("stopping", concurrent(8, 0))).await;
    let c = backend.collection("orders");
    for k in 1..=3 {
        c.insert_one(doc! {"_id": k, "ms": 300 * k}).unwrap();
    }
    wait_until("3 running", || runs.all().len() == 3).await;
    rt.shutdown().await;
    assert_eq!(
        probe.successes().len(),
        3,
        "every in-flight handler finished"
    );
    let (seen, processed) = stored_tokens(&backend, "stopping");
    assert_eq!(seen.as_deref(), Some(token_of(3).as_str()));
    assert_eq!(processed.as_deref(), Some(token_of(3).as_str()));
}

/// An order as the `#[key]` stream below decodes it.
#[derive(Debug, serde::Deserialize)]
struct Order {
    #[serde(rename = "_id")]
    id: i32,
    customer: String,
    ms: u64,
}

/// Keyed by `customer` (a field of the full document), not by `documentKey`.
#[derive(Clone, Default)]
struct ByCustomer {
    runs: Runs,
}

#[change_stream(name = "by-customer", collection = "orders", document = Order, concurrency = 4)]
#[checkpoint(save_every_n = 1)]
impl ByCustomer {
    #[key]
    fn customer(&self, ctx: &ChangeContext<Order>) -> Option<String> {
        ctx.document().map(|o| o.customer.clone())
    }

    #[on_insert]
    async fn created(&self, order: Order) {
        let i = self.runs.begin(
            format!("{} {}", order.customer, order.id),
            Some(Bson::String(order.customer.clone())),
        );
        tokio::time::sleep(Duration::from_millis(order.ms)).await;
        self.runs.end(i);
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_method_orders_by_its_value_instead_of_the_document_key() {
    init_logs();
    let backend = MemoryBackend::new();
    let stream = ByCustomer::default();
    let runs = stream.runs.clone();
    let rt = flowwarden::builder()
        .discover(false)
        .stream(stream)
        .backend(backend.clone())
        .seed(7)
        .max_await(Duration::from_millis(200))
        .start()
        .await
        .expect("runtime starts");
    wait_status(&rt, "by-customer", |s| {
        s.state == flowwarden::StreamState::Running
    })
    .await;
    let c = backend.collection("orders");
    // Five documents (five documentKeys), two customers. ada's first order is slow.
    c.insert_one(doc! {"_id": 1, "customer": "ada", "ms": 300})
        .unwrap();
    c.insert_one(doc! {"_id": 2, "customer": "ada", "ms": 100})
        .unwrap();
    c.insert_one(doc! {"_id": 3, "customer": "bob", "ms": 100})
        .unwrap();
    c.insert_one(doc! {"_id": 4, "customer": "ada", "ms": 100})
        .unwrap();
    c.insert_one(doc! {"_id": 5, "customer": "bob", "ms": 100})
        .unwrap();
    // Does not decode into `Order`: not keyed by the method (it is never called), ordered by
    // its documentKey, and dead-lettered as with `concurrency = 1`.
    c.insert_one(doc! {"_id": 6, "customer": 42, "ms": 100})
        .unwrap();
    wait_status(&rt, "by-customer", |s| {
        s.counters.handled == 5 && s.counters.dead_lettered == 1
    })
    .await;
    rt.shutdown().await;

    let all = runs.all();
    let of = |customer: &str| -> Vec<Run> {
        all.iter()
            .filter(|r| r.key == Some(Bson::String(customer.to_owned())))
            .cloned()
            .collect()
    };
    let (ada, bob) = (of("ada"), of("bob"));
    let labels = |runs: &[Run]| runs.iter().map(|r| r.label.clone()).collect::<Vec<_>>();
    assert_eq!(
        labels(&ada),
        ["ada 1", "ada 2", "ada 4"],
        "ada in stream order"
    );
    assert_eq!(labels(&bob), ["bob 3", "bob 5"], "bob in stream order");
    // The proof that the key method is used: orders 1, 2 and 4 have three different
    // documentKeys, so ordered by documentKey (the key method ignored) all four first orders
    // would start at once with concurrency = 4, and "ada 2" would start while the slow "ada 1"
    // still runs. Ordered by customer, each order of ada starts only after the previous one
    // finished.
    for runs in [&ada, &bob] {
        for w in runs.windows(2) {
            assert!(
                w[0].end.is_some_and(|e| e <= w[1].start),
                "one customer, one order at a time: {w:?}"
            );
        }
    }
    // Different customers still run in parallel: bob's orders ran while ada's slow first one
    // did.
    let slow_end = ada[0].end.expect("finished");
    assert!(
        bob.iter().all(|r| r.start < slow_end),
        "bob waited for ada: {all:?}"
    );
    let (seen, processed) = stored_tokens(&backend, "by-customer");
    assert_eq!(processed.as_deref(), Some(token_of(6).as_str()));
    assert_eq!(seen.as_deref(), Some(token_of(6).as_str()));
}
