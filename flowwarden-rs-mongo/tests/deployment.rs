//! `SingleLeader` streams end to end through the real `mongodb` driver: two runtimes, each with
//! its own client, share one server. Takeover after a crash runs on the emulator and on a live
//! replica set (`FLOWWARDEN_TEST_MONGODB_URI`); the zombie tests need the emulator's movable
//! clock (a leader "paused" past its lease while its own timers did not move).

mod support;

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};
use flowwarden::{
    Deployment, HaltReason, HandlerError, LeaseConfig, Runtime, StreamDefinition, StreamState,
};
use flowwarden_rs_mongo::MongoBackend;
use futures::FutureExt;
use support::*;
use tokio::sync::Notify;

fn leader_def(name: &'static str, lease: LeaseConfig) -> &'static StreamDefinition {
    def(name, |d| d.deployment = Deployment::SingleLeader(lease))
}

const FAST: LeaseConfig = LeaseConfig {
    lease_secs: 2,
    renew_secs: 1,
    standby_poll_secs: 1,
};

/// Long enough that no renewal happens during a test: only the emulator's clock expires it.
const LONG: LeaseConfig = LeaseConfig {
    lease_secs: 30,
    renew_secs: 10,
    standby_poll_secs: 1,
};

async fn start_instance(
    backend: MongoBackend,
    probe: &Probe,
    d: &'static StreamDefinition,
    id: &str,
) -> Runtime {
    flowwarden::builder()
        .discover(false)
        .any_stream(flowwarden::AnyStream::with_definition(probe.clone(), d))
        .backend(backend)
        .instance_id(id)
        .seed(7)
        .max_await(Duration::from_millis(150))
        .shutdown_timeout(Duration::from_secs(5))
        .start()
        .await
        .expect("runtime starts")
}

fn state(rt: &Runtime, name: &str) -> StreamState {
    rt.handle().status(name).expect("stream").state
}

async fn checkpoint_doc(t: &Target, name: &str) -> Document {
    t.coll("_fw_checkpoints")
        .find_one(doc! {"_id": name})
        .await
        .expect("read")
        .expect("a checkpoint")
}

fn processed_data(d: &Document) -> Option<String> {
    d.get_document("lastProcessedToken")
        .ok()
        .and_then(|t| t.get_str("_data").ok())
        .map(str::to_owned)
}

async fn takeover_after_a_crash_loses_nothing(t: &Target) {
    let d = leader_def("leader", FAST);
    let (a, b) = (Probe::default(), Probe::default());
    let rt_a = start_instance(t.backend.clone(), &a, d, "a").await;
    wait_status(&rt_a, "leader", |s| s.state == StreamState::Running).await;
    let rt_b = start_instance(t.another_backend().await, &b, d, "b").await;
    wait_status(&rt_b, "leader", |s| s.state == StreamState::Standby).await;

    t.insert_ids([1, 2, 3]).await;
    wait_until("A handled 3", || a.successes().len() == 3).await;
    assert!(b.calls().is_empty(), "the standby consumes nothing");
    assert_eq!(state(&rt_b, "leader"), StreamState::Standby);

    rt_a.handle().crash().await;
    t.insert_ids([4, 5, 6]).await;
    wait_until("B took over and handled 4..6", || {
        let keys = b.handled_keys();
        (4..=6).all(|k| keys.contains(&Bson::Int32(k)))
    })
    .await;
    assert_eq!(state(&rt_b, "leader"), StreamState::Running);
    let mut all: Vec<Bson> = a.handled_keys();
    all.extend(b.handled_keys());
    for k in 1..=6 {
        assert!(all.contains(&Bson::Int32(k)), "change {k} handled");
    }
    let by_b: Vec<i32> = b.handled_keys().iter().filter_map(|k| k.as_i32()).collect();
    assert!(
        by_b.windows(2).all(|w| w[0] < w[1]),
        "B handled in source order: {by_b:?}"
    );
    wait_until("B checkpointed 6", || b.successes().len() >= 3).await;
    rt_b.shutdown().await;
    let cp = checkpoint_doc(t, "leader").await;
    assert_eq!(cp.get_str("owner"), Ok("b"));
    assert_eq!(cp.get_i64("epoch"), Ok(2), "the second acquisition");
    assert_eq!(processed_data(&cp), b.token_for(6));
    // Released on shutdown: free by the server's clock.
    let lease = t
        .coll("_fw_locks")
        .find_one(doc! {"_id": "leader"})
        .await
        .expect("read")
        .expect("lease");
    assert_eq!(lease.get_str("owner"), Ok("b"));
    assert!(
        *lease.get_datetime("expiresAt").expect("date") <= bson::DateTime::now(),
        "{lease:?}"
    );
}

mod takeover {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn emulator() {
        let t = Target::emulator().await;
        takeover_after_a_crash_loses_nothing(&t).await;
        t.finish().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn live() {
        let Some(t) = Target::live("takeover").await else {
            return;
        };
        takeover_after_a_crash_loses_nothing(&t).await;
        t.finish().await;
    }
}

/// A's handler blocks on change 2 until the test opens `gate`, then returns `outcome`.
fn stalling_probe(gate: Arc<Notify>, fail: bool) -> Probe {
    Probe::new(move |ctx| {
        let g = gate.clone();
        async move {
            if ctx.document_key() == Some(&doc! {"_id": 2}) {
                g.notified().await;
                if fail {
                    return Err(HandlerError::msg("fails after the pause"));
                }
            }
            Ok(())
        }
        .boxed()
    })
}

/// A leads and stalls in change 2; the server's clock jumps past A's lease (A's own timers do
/// not move, as in a long pause); B takes over, handles 2 and 3 and checkpoints; then A wakes.
async fn zombie_wakes(t: &Target, name: &'static str, fail: bool) -> (Runtime, Runtime, Document) {
    let emu = t.emu();
    let d = def(name, |d| {
        d.deployment = Deployment::SingleLeader(LONG);
        d.retry.max_attempts = 1;
    });
    let gate = Arc::new(Notify::new());
    let a = stalling_probe(gate.clone(), fail);
    let b = Probe::default();
    let rt_a = start_instance(t.backend.clone(), &a, d, "a").await;
    wait_status(&rt_a, name, |s| s.state == StreamState::Running).await;
    let rt_b = start_instance(t.another_backend().await, &b, d, "b").await;
    wait_status(&rt_b, name, |s| s.state == StreamState::Standby).await;

    t.insert_ids([1, 2]).await;
    wait_until("A is stuck in change 2", || a.calls().len() == 2).await;
    for _ in 0..500 {
        if t.stored_tokens(name).await.1 == a.token_for(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        t.stored_tokens(name).await.1,
        a.token_for(1),
        "A checkpointed 1"
    );

    emu.advance_clock(Duration::from_secs(31));
    wait_until("B took over and handled 2", || {
        b.handled_keys().contains(&Bson::Int32(2))
    })
    .await;
    t.insert_ids([3]).await;
    wait_until("B handled 3", || b.handled_keys().contains(&Bson::Int32(3))).await;
    let mut by_b = checkpoint_doc(t, name).await;
    for _ in 0..200 {
        if processed_data(&by_b) == b.token_for(3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        by_b = checkpoint_doc(t, name).await;
    }
    assert_eq!(processed_data(&by_b), b.token_for(3));
    assert_eq!(by_b.get_i64("epoch"), Ok(2));
    assert_eq!(
        state(&rt_a, name),
        StreamState::Running,
        "A does not know yet"
    );

    gate.notify_one();
    let st = wait_status(&rt_a, name, |s| {
        s.state == StreamState::Standby && s.halt.is_some()
    })
    .await;
    assert_eq!(st.halt.map(|h| h.reason), Some(HaltReason::Fenced));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = checkpoint_doc(t, name).await;
    assert_eq!(
        processed_data(&after),
        processed_data(&by_b),
        "the stored checkpoint never moved backwards"
    );
    assert_eq!(after.get_i64("epoch"), Ok(2));
    assert_eq!(state(&rt_b, name), StreamState::Running);
    (rt_a, rt_b, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_move_the_checkpoint() {
    let t = Target::emulator().await;
    let (rt_a, rt_b, _) = zombie_wakes(&t, "zombie", false).await;
    rt_a.shutdown().await;
    rt_b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_write_a_dead_letter() {
    let t = Target::emulator().await;
    let (rt_a, rt_b, _) = zombie_wakes(&t, "zombie-dlq", true).await;
    let dead = t.coll("_fw_dlq").find_one(doc! {}).await.expect("read dlq");
    assert_eq!(dead, None, "no dead letter from a deposed leader");
    rt_a.shutdown().await;
    rt_b.shutdown().await;
}

/// A backend that keeps checkpoints and dead letters in MongoDB but leases elsewhere (here the
/// in-memory lease store, standing in for Redis): with `fenced_by`, the leader's fenced writes
/// are checked against the lease it really holds, so it checkpoints and dead-letters; without,
/// MongoDB finds no lease in `_fw_locks` and refuses them (the stream halts `Fenced`).
async fn mixed_backend(t: &Target, name: &'static str, fenced_by: bool) -> (Runtime, Probe) {
    let leases = flowwarden::MemoryBackend::new();
    let mongo = if fenced_by {
        t.backend.clone().fenced_by(Arc::new(leases.clone()))
    } else {
        t.backend.clone()
    };
    let backend = flowwarden::Backend {
        leases: Some(Arc::new(leases)),
        transactions: None,
        ..flowwarden::Backend::from(mongo)
    };
    let d = def(name, |d| {
        d.deployment = Deployment::SingleLeader(FAST);
        d.retry.max_attempts = 1;
        d.checkpoint.save_every_n = 1;
    });
    let probe = Probe::new(|ctx| {
        let fail = ctx.document_key().and_then(|k| k.get("_id")) == Some(&Bson::Int32(2));
        async move {
            if fail {
                Err(HandlerError::msg("key 2 always fails"))
            } else {
                Ok(())
            }
        }
        .boxed()
    });
    let rt = flowwarden::builder()
        .discover(false)
        .any_stream(flowwarden::AnyStream::with_definition(probe.clone(), d))
        .backend(backend)
        .instance_id("mixed-0")
        .max_await(Duration::from_millis(150))
        .start()
        .await
        .expect("runtime starts");
    wait_status(&rt, name, |s| s.state != StreamState::Starting).await;
    (rt, probe)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_stores_fenced_by_another_lease_store_checkpoint_and_dead_letter() {
    let t = Target::emulator().await;
    let (rt, probe) = mixed_backend(&t, "mixed", true).await;
    wait_status(&rt, "mixed", |s| s.state == StreamState::Running).await;
    t.insert_ids([1, 2, 3]).await;
    wait_until("1 and 3 handled", || probe.successes().len() == 2).await;
    wait_status(&rt, "mixed", |s| s.counters.dead_lettered == 1).await;
    let st = rt.handle().status("mixed").expect("stream");
    rt.shutdown().await;
    assert!(st.halt.is_none(), "{:?}", st.halt);
    let cp = checkpoint_doc(&t, "mixed").await;
    assert_eq!(
        cp.get_i64("epoch").ok(),
        Some(1),
        "fenced by the memory lease: {cp}"
    );
    let dead = t
        .coll("_fw_dlq")
        .count_documents(doc! {"stream": "mixed"})
        .await
        .expect("count");
    assert_eq!(dead, 1);

    // The same backend without `fenced_by`: MongoDB has no such lease, every fenced write is
    // refused, and the stream halts loudly instead of writing behind the leader's back.
    let (rt, _probe) = mixed_backend(&t, "unfenced", false).await;
    t.insert_ids([4]).await;
    let st = wait_status(&rt, "unfenced", |s| s.halt.is_some()).await;
    rt.shutdown().await;
    assert_eq!(st.halt.map(|h| h.reason), Some(HaltReason::Fenced));
    t.finish().await;
}
