//! `SingleLeader` streams across several runtimes sharing one in-memory backend: one leader,
//! takeover after a crash, and fencing of a deposed ("zombie") leader.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson};
use flowwarden::{Deployment, HaltReason, LeaseConfig, MemoryBackend, Runtime, StreamState};
use futures::FutureExt;
use support::*;
use tokio::sync::Notify;

fn leader_def(name: &'static str) -> &'static flowwarden::StreamDefinition {
    def(name, |d| {
        d.deployment = Deployment::SingleLeader(LeaseConfig {
            lease_secs: 30,
            renew_secs: 10,
            standby_poll_secs: 5,
        })
    })
}

async fn start_as(
    backend: &MemoryBackend,
    probe: &Probe,
    d: &'static flowwarden::StreamDefinition,
    id: &str,
) -> Runtime {
    let id = id.to_owned();
    start_with(backend, probe, d, move |b| {
        b.instance_id(id).shutdown_timeout(Duration::from_secs(600))
    })
    .await
}

fn state(rt: &Runtime, name: &str) -> StreamState {
    rt.handle().status(name).unwrap().state
}

#[tokio::test(start_paused = true)]
async fn one_leader_per_stream_and_a_standby_takes_over_after_a_crash() {
    let backend = MemoryBackend::new();
    let d = leader_def("leader");
    let probes: Vec<Probe> = (0..3).map(|_| Probe::default()).collect();
    let mut rts = Vec::new();
    for (i, p) in probes.iter().enumerate() {
        rts.push(start_as(&backend, p, d, &format!("instance-{i}")).await);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let running: Vec<usize> = (0..3)
        .filter(|i| state(&rts[*i], "leader") == StreamState::Running)
        .collect();
    let standby = (0..3)
        .filter(|i| state(&rts[*i], "leader") == StreamState::Standby)
        .count();
    assert_eq!(running.len(), 1, "exactly one leader");
    assert_eq!(standby, 2, "the others are healthy standbys");
    let leader = running[0];

    let c = backend.collection("orders");
    c.insert_one(doc! {"_id": 1, "n": 0}).unwrap();
    for n in 1..=3 {
        c.update_one(doc! {"_id": 1}, doc! {"$set": {"n": n}})
            .unwrap();
    }
    wait_until("leader handled 4", || probes[leader].successes().len() == 4).await;
    assert!(
        probes
            .iter()
            .enumerate()
            .all(|(i, p)| i == leader || p.calls().is_empty()),
        "standbys consume nothing"
    );

    let crashed_at = tokio::time::Instant::now();
    rts[leader].handle().crash().await;
    for n in 4..=6 {
        c.update_one(doc! {"_id": 1}, doc! {"$set": {"n": n}})
            .unwrap();
    }
    let last = token_of(backend.oplog_head());
    wait_until("a standby handled the rest", || {
        probes
            .iter()
            .any(|p| p.successes().iter().any(|s| s.token == last))
    })
    .await;
    let took = crashed_at.elapsed();
    assert!(
        took <= Duration::from_secs(30 + 5 + 1),
        "takeover within lease + poll, took {took:?}"
    );
    let new_leader = (0..3)
        .find(|i| *i != leader && !probes[*i].successes().is_empty())
        .unwrap();
    // Nothing committed is lost across the takeover, and per-key order holds.
    let mut tokens: Vec<String> = probes[leader]
        .successes()
        .into_iter()
        .map(|s| s.token)
        .collect();
    let after: Vec<String> = probes[new_leader]
        .successes()
        .into_iter()
        .map(|s| s.token)
        .collect();
    assert!(
        after.windows(2).all(|w| w[0] < w[1]),
        "in source order: {after:?}"
    );
    tokens.extend(after);
    for seq in 1..=backend.oplog_head() {
        assert!(
            tokens.contains(&token_of(seq)),
            "change {seq} handled at least once"
        );
    }
    for (i, rt) in rts.into_iter().enumerate() {
        if i != leader {
            rt.shutdown().await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leader_cannot_move_the_checkpoint() {
    let backend = MemoryBackend::new();
    let d = leader_def("zombie");
    let gate = Arc::new(Notify::new());
    // A's handler blocks on change 2 (a long pause), then succeeds when woken.
    let a = stalling_on(2, gate.clone());
    let rt_a = start_as(&backend, &a, d, "a").await;
    let b = Probe::default();
    let rt_b = start_as(&backend, &b, d, "b").await;
    assert_eq!(state(&rt_a, "zombie"), StreamState::Running);
    assert_eq!(state(&rt_b, "zombie"), StreamState::Standby);

    insert_ids(&backend, [1, 2]);
    wait_until("A is stuck in change 2", || a.calls().len() == 2).await;
    assert_eq!(
        stored_tokens(&backend, "zombie").1.as_deref(),
        Some(token_of(1).as_str())
    );

    // A is cut off from the lease store: it cannot renew; the lease expires; B takes over
    // through the normal resume cascade and moves on.
    backend.faults().freeze_lease_renewals("a");
    wait_until("B took over and handled 2", || {
        b.handled_keys().contains(&Bson::Int32(2))
    })
    .await;
    insert_ids(&backend, [3]);
    wait_until("B handled 3", || b.handled_keys().contains(&Bson::Int32(3))).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let by_b = backend.checkpoint_document("zombie").unwrap();
    assert_eq!(
        by_b.get_document("lastProcessedToken")
            .unwrap()
            .get_str("_data")
            .unwrap(),
        token_of(3)
    );
    assert_eq!(by_b.get_i64("epoch").unwrap(), 2);

    // A wakes up mid-handler and tries to checkpoint change 2: rejected; A stands by.
    gate.notify_one();
    let st = wait_status(&rt_a, "zombie", |s| {
        s.state == StreamState::Standby && s.counters.handled >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = backend.checkpoint_document("zombie").unwrap();
    assert_eq!(after, by_b, "the stored checkpoint never moved backwards");
    assert!(st.halt.is_none() || st.halt.as_ref().unwrap().reason == HaltReason::Fenced);
    assert_eq!(state(&rt_b, "zombie"), StreamState::Running);
    rt_a.shutdown().await;
    rt_b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leader_cannot_write_a_dead_letter() {
    let backend = MemoryBackend::new();
    let d = leader_def("zombie-dlq");
    let gate = Arc::new(Notify::new());
    let g = gate.clone();
    let a = Probe::new(move |_| {
        let g = g.clone();
        async move {
            g.notified().await;
            Err(flowwarden::HandlerError::msg("fails after the pause"))
        }
        .boxed()
    });
    let rt_a = start_as(&backend, &a, d, "a").await;
    let b = Probe::default();
    let rt_b = start_as(&backend, &b, d, "b").await;
    insert_ids(&backend, [1]);
    wait_until("A is stuck", || a.calls().len() == 1).await;
    backend.faults().freeze_lease_renewals("a");
    wait_until("B handled 1", || b.successes().len() == 1).await;
    // A wakes, fails for good on every attempt, and tries to dead-letter: rejected.
    for _ in 0..3 {
        gate.notify_one();
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    wait_status(&rt_a, "zombie-dlq", |s| {
        s.state == StreamState::Standby && s.halt.is_some()
    })
    .await;
    let st = rt_a.handle().status("zombie-dlq").unwrap();
    assert_eq!(st.halt.map(|h| h.reason), Some(HaltReason::Fenced));
    assert_eq!(a.calls().len(), 3, "all attempts ran");
    let dead = rt_a
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        dead.is_empty(),
        "no dead letter from a deposed leader: {dead:?}"
    );
    rt_a.shutdown().await;
    rt_b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_the_lease_only_after_flushing() {
    let backend = MemoryBackend::new();
    let d = leader_def("handover");
    let a = Probe::default();
    let rt_a = start_as(&backend, &a, d, "a").await;
    let b = Probe::default();
    let rt_b = start_as(&backend, &b, d, "b").await;
    insert_ids(&backend, [1, 2]);
    wait_until("A handled 2", || a.successes().len() == 2).await;
    rt_a.shutdown().await;
    // Released: B takes over at its next poll, from A's flushed checkpoint.
    insert_ids(&backend, [3]);
    wait_until("B handled 3", || b.successes().len() == 1).await;
    assert_eq!(
        b.handled_keys(),
        [Bson::Int32(3)],
        "nothing replayed, nothing skipped"
    );
    rt_b.shutdown().await;
}

/// A handler that blocks its thread for longer than the lease starves that runtime, renewal
/// included. The lease expires, a standby (another runtime, another thread) takes over, and
/// when the stale leader wakes its checkpoint write is rejected: it does not keep leading.
/// Real time, two current-thread runtimes on two threads; about 6 s.
#[test]
fn renewal_starvation_does_not_keep_a_stale_leader_running() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    let backend = MemoryBackend::new();
    let d = def("starved", |d| {
        d.deployment = Deployment::SingleLeader(LeaseConfig {
            lease_secs: 2,
            renew_secs: 1,
            standby_poll_secs: 1,
        });
    });
    let woke_at: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let a_ready = Arc::new(AtomicBool::new(false));
    let w = woke_at.clone();
    let a = Probe::new(move |ctx| {
        let w = w.clone();
        async move {
            if ctx.document_key() == Some(&doc! {"_id": 1}) {
                std::thread::sleep(Duration::from_secs(5)); // blocks the whole runtime
                *w.lock().unwrap() = Some(Instant::now());
            }
            Ok(())
        }
        .boxed()
    });
    let b = Probe::default();
    let b_handled_at: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    std::thread::scope(|scope| {
        let rt = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let (backend_a, a2, done_a, ready) =
            (backend.clone(), a.clone(), done.clone(), a_ready.clone());
        let thread_a = scope.spawn(move || {
            rt().block_on(async move {
                let rt_a = start_as(&backend_a, &a2, d, "a").await;
                assert_eq!(state(&rt_a, "starved"), StreamState::Running);
                ready.store(true, Ordering::SeqCst);
                while !done_a.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let st = rt_a.handle().status("starved").unwrap();
                rt_a.shutdown().await;
                st
            })
        });
        while !a_ready.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let (backend_b, b2, done_b, at, a3) = (
            backend.clone(),
            b.clone(),
            done.clone(),
            b_handled_at.clone(),
            a.clone(),
        );
        let thread_b = scope.spawn(move || {
            rt().block_on(async move {
                let rt_b = start_as(&backend_b, &b2, d, "b").await;
                assert_eq!(state(&rt_b, "starved"), StreamState::Standby);
                insert_ids(&backend_b, [1]);
                wait_until("B took over and handled 1", || b2.successes().len() == 1).await;
                *at.lock().unwrap() = Some(Instant::now());
                // Wait for A to wake and be rejected.
                wait_until("A woke", || a3.successes().len() == 1).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                done_b.store(true, Ordering::SeqCst);
                let st = rt_b.handle().status("starved").unwrap();
                rt_b.shutdown().await;
                st
            })
        });
        let st_b = thread_b.join().unwrap();
        let st_a = thread_a.join().unwrap();
        assert_eq!(st_b.state, StreamState::Running, "B leads");
        assert_eq!(
            st_a.state,
            StreamState::Standby,
            "the stale leader stood down: {st_a:?}"
        );
        assert_eq!(st_a.halt.map(|h| h.reason), Some(HaltReason::Fenced));
    });
    let b_at = b_handled_at.lock().unwrap().unwrap();
    let a_at = woke_at.lock().unwrap().unwrap();
    assert!(b_at < a_at, "B took over while A was still blocked");
    let cp = backend.checkpoint_document("starved").unwrap();
    assert_eq!(
        cp.get_i64("epoch").unwrap(),
        2,
        "written by the new leader only"
    );
}

/// The lease store as one runtime reaches it: its calls can hang and then fail (a partition
/// while the driver waits for its timeout, or a saturated connection pool), or a grant can be
/// answered late (the store granted at once; the answer is slow). The other runtimes use the
/// store directly.
#[derive(Clone)]
struct ReachedLeases {
    inner: MemoryBackend,
    /// Every call hangs this long, then fails without reaching the store (0: off).
    hang_ms: Arc<std::sync::atomic::AtomicU64>,
    /// The first acquisition is granted at once and answered this late.
    late_first_grant_ms: u64,
    granted: Arc<std::sync::atomic::AtomicBool>,
}

impl ReachedLeases {
    fn new(inner: &MemoryBackend, late_first_grant_ms: u64) -> Self {
        Self {
            inner: inner.clone(),
            hang_ms: Arc::default(),
            late_first_grant_ms,
            granted: Arc::default(),
        }
    }

    async fn hang(&self) -> Result<(), flowwarden::port::StoreError> {
        let ms = self.hang_ms.load(std::sync::atomic::Ordering::SeqCst);
        if ms == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Err(flowwarden::port::StoreError::new(
            flowwarden::port::StoreErrorKind::Unavailable,
            "server selection timed out",
        ))
    }

    fn backend(&self) -> flowwarden::Backend {
        let mut b: flowwarden::Backend = self.inner.clone().into();
        b.leases = Some(Arc::new(self.clone()));
        b
    }
}

#[async_trait::async_trait]
impl flowwarden::port::LeaseStore for ReachedLeases {
    async fn try_acquire(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<flowwarden::port::Lease>, flowwarden::port::StoreError> {
        self.hang().await?;
        if self.granted.load(std::sync::atomic::Ordering::SeqCst) && self.late_first_grant_ms > 0 {
            // After its late grant, this runtime cannot reach the store any more.
            return Err(flowwarden::port::StoreError::new(
                flowwarden::port::StoreErrorKind::Unavailable,
                "server selection timed out",
            ));
        }
        let r = self.inner.try_acquire(stream, owner, ttl).await;
        if matches!(r, Ok(Some(_))) && self.late_first_grant_ms > 0 {
            self.granted
                .store(true, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(self.late_first_grant_ms)).await;
        }
        r
    }

    async fn renew(
        &self,
        lease: &flowwarden::port::Lease,
        ttl: Duration,
    ) -> Result<Option<flowwarden::port::Lease>, flowwarden::port::StoreError> {
        self.hang().await?;
        self.inner.renew(lease, ttl).await
    }

    async fn release(
        &self,
        lease: &flowwarden::port::Lease,
    ) -> Result<(), flowwarden::port::StoreError> {
        self.hang().await?;
        self.inner.release(lease).await
    }

    async fn current(
        &self,
        stream: &str,
    ) -> Result<Option<flowwarden::port::Lease>, flowwarden::port::StoreError> {
        self.inner.current(stream).await
    }
}

fn short_lease_def(name: &'static str) -> &'static flowwarden::StreamDefinition {
    def(name, |d| {
        d.deployment = Deployment::SingleLeader(LeaseConfig {
            lease_secs: 6,
            renew_secs: 2,
            standby_poll_secs: 1,
        })
    })
}

/// Found by the fault simulation (invariant 9, "one consumer at a time"; seed 142 of the
/// multi-instance schedules with hanging lease calls). A leader whose renewal call hangs
/// (partitioned from the lease store while the driver waits for its timeout) must still stop
/// before its lease expires: it used to wait for the call, keep reading, and handle new events
/// side by side with the standby that took over (only fencing kept the stores safe).
#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewal_hangs_stops_before_its_lease_expires() {
    use flowwarden::port::LeaseStore;
    let backend = MemoryBackend::new();
    let d = short_lease_def("hanging-renewal");
    let reached = ReachedLeases::new(&backend, 0);
    let a = Probe::default();
    let via = reached.backend();
    let rt_a = start_with(&backend, &a, d, move |b| b.backend(via).instance_id("a")).await;
    let b = Probe::default();
    let rt_b = start_as(&backend, &b, d, "b").await;
    assert_eq!(state(&rt_a, "hanging-renewal"), StreamState::Running);

    // From now on every lease call of A hangs for 30 s, then fails.
    reached
        .hang_ms
        .store(30_000, std::sync::atomic::Ordering::SeqCst);
    let expires_at = tokio::time::Instant::now() + Duration::from_secs(6);
    tokio::time::sleep_until(expires_at + Duration::from_secs(2)).await;
    let lease = backend.current("hanging-renewal").await.unwrap().unwrap();
    assert_eq!(lease.owner, "b", "B took over after A's lease expired");

    insert_ids(&backend, [1]);
    wait_until("B handled 1", || b.successes().len() == 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        a.calls().is_empty(),
        "A handled an event committed after it lost its lease: {:?}",
        a.calls()
    );
    assert_eq!(
        state(&rt_a, "hanging-renewal"),
        StreamState::Standby,
        "A stopped (its renewal never answered) and stands by"
    );
    rt_b.shutdown().await;
    rt_a.handle().crash().await;
}

/// The lease's validity counts from the request, not from a late answer: a grant answered 3 s
/// late (of a 6 s lease) leaves the leader 3 s, and with renewals failing it must stop before
/// the store lets a standby take over.
#[tokio::test(start_paused = true)]
async fn a_late_grant_counts_from_the_request() {
    use flowwarden::port::LeaseStore;
    let backend = MemoryBackend::new();
    let d = short_lease_def("late-grant");
    backend.faults().freeze_lease_renewals("a");
    let reached = ReachedLeases::new(&backend, 3_000);
    let a = Probe::default();
    let via = reached.backend();
    let rt_a = start_with(&backend, &a, d, move |b| b.backend(via).instance_id("a")).await;
    let granted_at = tokio::time::Instant::now();
    let b = Probe::default();
    let rt_b = start_as(&backend, &b, d, "b").await;
    assert_eq!(state(&rt_b, "late-grant"), StreamState::Standby);
    wait_status(&rt_a, "late-grant", |s| s.state == StreamState::Running).await;

    // A's lease (granted at 0, 6 s) expires at 6 s; B takes it then. An event at 6.5 s is B's.
    tokio::time::sleep_until(granted_at + Duration::from_millis(6_500)).await;
    let lease = backend.current("late-grant").await.unwrap().unwrap();
    assert_eq!(lease.owner, "b");
    insert_ids(&backend, [1]);
    wait_until("B handled 1", || b.successes().len() == 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        a.calls().is_empty(),
        "A handled an event committed after its lease expired: {:?}",
        a.calls()
    );
    rt_b.shutdown().await;
    rt_a.handle().crash().await;
}
