//! The Redis checkpoint and lease stores against a real Redis server (127.0.0.1:6379, or
//! `FLOWWARDEN_REDIS_URL`); never a mock. A test that cannot reach Redis fails and says how to
//! start it: it never skips. Every test uses its own random key prefix and removes its keys.
//! The tests take one lock, so they run one at a time: the dropped-connection test pauses the
//! server's writes for a moment, which must not disturb the short lease TTLs of the others.
#![cfg(feature = "redis")]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, Bson, DateTime, Document};
use flowwarden::port::{
    Checkpoint, CheckpointStore, Fence, LeaseStore, StoreErrorKind, StoredPosition,
};
use flowwarden::redis::{RedisCheckpointStore, RedisConfig, RedisConnection, RedisLeaseStore};
use flowwarden::{Backend, Deployment, LeaseConfig, MemoryBackend, ResumeToken, StreamState};
use flowwarden_testkit::conformance::{self, ConformanceTarget, Fresh};
use redis::aio::MultiplexedConnection;
use support::*;

static SERIAL: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(|| tokio::sync::Mutex::new(()));

fn url() -> String {
    std::env::var(RedisConfig::URL_VAR).unwrap_or_else(|_| RedisConfig::DEFAULT_URL.to_owned())
}

fn how_to_start(url: &str, e: &dyn std::fmt::Display) -> String {
    format!(
        "cannot reach Redis at {url}: {e}\n\
         These tests need a real Redis server. Start one with\n  \
         redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no\n\
         (install it with `apt-get install redis-server`), or point {} at one.",
        RedisConfig::URL_VAR
    )
}

/// A raw connection of the test itself (planting, inspecting, killing).
async fn admin() -> MultiplexedConnection {
    let url = url();
    let client =
        redis::Client::open(url.as_str()).unwrap_or_else(|e| panic!("{}", how_to_start(&url, &e)));
    match tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => panic!("{}", how_to_start(&url, &e)),
        Err(_) => panic!("{}", how_to_start(&url, &"no answer within 5 s")),
    }
}

/// A prefix no other test or run uses.
fn unique_prefix(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "fw-test:{tag}:{}-{nanos}-{}:",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn connect(prefix: &str) -> RedisConnection {
    let config = RedisConfig::new(url())
        .prefix(prefix)
        .operation_timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(2));
    RedisConnection::connect(&config)
        .await
        .unwrap_or_else(|e| panic!("{}", how_to_start(&url(), &e)))
}

/// Removes every key under `prefix`.
async fn drop_prefix(admin: &mut MultiplexedConnection, prefix: &str) {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(admin)
            .await
            .expect("SCAN");
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(admin)
                .await
                .expect("DEL");
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

/// The server's clock, in milliseconds since the epoch.
async fn server_ms(admin: &mut MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(admin).await.expect("TIME");
    s * 1000 + us / 1000
}

fn position(n: u32) -> StoredPosition {
    StoredPosition {
        token: ResumeToken::from_document(doc! { "_data": format!("{n:016X}") }),
        cluster_time: None,
        wall_time: Some(DateTime::from_millis(1_700_000_000_000 + i64::from(n))),
        start_after: false,
    }
}

fn checkpoint(stream: &str, n: u32, owner: &str, epoch: i64) -> Checkpoint {
    Checkpoint {
        stream: stream.to_owned(),
        last_processed: Some(position(n)),
        last_seen: Some(position(n)),
        owner: Some(owner.to_owned()),
        epoch: Some(epoch),
        updated_at: DateTime::from_millis(1_700_000_000_000),
        snapshot: None,
    }
}

// ---------------------------------------------------------------------------------------------
// 1. The conformance suite on { in-memory source, Redis checkpoints, in-memory dead letters,
//    Redis leases }.

struct RedisTarget {
    prefix: String,
    cases: AtomicU64,
}

struct Env {
    memory: MemoryBackend,
    checkpoints: RedisCheckpointStore,
    admin: MultiplexedConnection,
}

#[async_trait]
impl ConformanceTarget for RedisTarget {
    type Env = Env;

    async fn fresh(&self) -> Result<Fresh<Env>, String> {
        let n = self.cases.fetch_add(1, Ordering::Relaxed);
        let redis = connect(&format!("{}{n}:", self.prefix)).await;
        let memory = MemoryBackend::new();
        let checkpoints = RedisCheckpointStore::new(&redis);
        let leases = Arc::new(RedisLeaseStore::new(&redis));
        // Dead letters in memory, fenced by the leases in Redis.
        memory.fence_dead_letters_by(leases.clone());
        let backend = Backend {
            checkpoints: Arc::new(checkpoints.clone()),
            leases: Some(leases),
            transactions: None,
            // The source and the dead letters stay in memory.
            ..Backend::from(memory.clone())
        };
        Ok(Fresh {
            backend,
            env: Env {
                memory,
                checkpoints,
                admin: admin().await,
            },
        })
    }

    async fn insert(&self, env: &Env, db: &str, coll: &str, doc: Document) -> Result<(), String> {
        env.memory
            .collection_in(db, coll)
            .insert_one(doc)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn update(
        &self,
        env: &Env,
        db: &str,
        coll: &str,
        filter: Document,
        update: Document,
    ) -> Result<(), String> {
        match env
            .memory
            .collection_in(db, coll)
            .update_one(filter, update)
        {
            Ok(o) if o.modified == 1 => Ok(()),
            Ok(o) => Err(format!("update changed {} document(s)", o.modified)),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn delete(
        &self,
        env: &Env,
        db: &str,
        coll: &str,
        filter: Document,
    ) -> Result<(), String> {
        match env.memory.collection_in(db, coll).delete_one(filter) {
            Ok(1) => Ok(()),
            Ok(n) => Err(format!("delete removed {n} document(s)")),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn lose_history(&self, env: &Env, through: &ResumeToken) -> Result<bool, String> {
        let seq = through
            .data()
            .and_then(|d| u64::from_str_radix(d, 16).ok())
            .ok_or_else(|| format!("not an in-memory event token: {through}"))?;
        let keep = env.memory.oplog_head().saturating_sub(seq);
        env.memory
            .faults()
            .truncate_history(usize::try_from(keep).map_err(|e| e.to_string())?);
        Ok(true)
    }

    /// Writes `doc` as the BSON `doc` field of the checkpoint hash, as the store would.
    async fn plant_checkpoint(&self, env: &Env, key: &str, doc: Document) -> Result<bool, String> {
        let mut bytes = Vec::new();
        doc.to_writer(&mut bytes).map_err(|e| e.to_string())?;
        let redis_key = env.checkpoints.key(key);
        let mut admin = env.admin.clone();
        let _: () = redis::pipe()
            .atomic()
            .cmd("DEL")
            .arg(&redis_key)
            .ignore()
            .cmd("HSET")
            .arg(&redis_key)
            .arg("doc")
            .arg(bytes)
            .ignore()
            .query_async(&mut admin)
            .await
            .map_err(|e| e.to_string())?;
        Ok(true)
    }
}

#[tokio::test]
async fn redis_stores_pass_the_conformance_suite() {
    let _serial = SERIAL.lock().await;
    init_logs();
    let mut admin = admin().await;
    let target = RedisTarget {
        prefix: unique_prefix("conformance"),
        cases: AtomicU64::new(0),
    };
    let report = conformance::run_report(&target).await;
    drop_prefix(&mut admin, &target.prefix).await;
    println!("{report}");
    assert_eq!(report.passed(), conformance::CASES.to_vec(), "{report}");
    assert!(report.not_applicable().is_empty(), "{report}");
}

// ---------------------------------------------------------------------------------------------
// 2. A zombie leader's checkpoint write is rejected.

#[tokio::test]
async fn a_zombie_leaders_checkpoint_write_is_rejected() {
    let _serial = SERIAL.lock().await;
    let mut admin = admin().await;
    let prefix = unique_prefix("zombie");
    let redis = connect(&prefix).await;
    let (checkpoints, leases) = (
        RedisCheckpointStore::new(&redis),
        RedisLeaseStore::new(&redis),
    );

    // A leads: lease, claim, a checkpoint at 1.
    let a = leases
        .try_acquire("orders", "a", Duration::from_millis(300))
        .await
        .unwrap()
        .expect("a free lease");
    assert_eq!(a.epoch, 1);
    checkpoints
        .claim(
            "orders",
            &Fence {
                owner: "a".into(),
                epoch: 1,
            },
        )
        .await
        .unwrap();
    checkpoints
        .save(&checkpoint("orders", 1, "a", 1))
        .await
        .unwrap();

    // A stalls (a long GC pause, a partition) past its lease by the server's clock; B takes over.
    while server_ms(&mut admin).await <= a.expires_at.timestamp_millis() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = leases
        .try_acquire("orders", "b", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the expired lease goes to b");
    assert_eq!(b.epoch, 2);

    // B has not claimed yet: A's write is refused by the lease alone.
    let e = checkpoints
        .save(&checkpoint("orders", 2, "a", 1))
        .await
        .unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Fenced, "{e}");
    assert!(
        e.message.contains("'b'") && e.message.contains("epoch 2"),
        "{e}"
    );

    // B claims and writes; A wakes up again and writes, with its own epoch or lying about
    // B's epoch under its own name: refused, and B's checkpoint stays.
    checkpoints
        .claim(
            "orders",
            &Fence {
                owner: "b".into(),
                epoch: 2,
            },
        )
        .await
        .unwrap();
    checkpoints
        .save(&checkpoint("orders", 3, "b", 2))
        .await
        .unwrap();
    for zombie in [
        checkpoint("orders", 4, "a", 1),
        checkpoint("orders", 5, "a", 2),
    ] {
        let e = checkpoints.save(&zombie).await.unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Fenced, "{e}");
    }
    let e = checkpoints
        .claim(
            "orders",
            &Fence {
                owner: "a".into(),
                epoch: 1,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Fenced, "{e}");
    assert_eq!(
        leases.renew(&a, Duration::from_secs(30)).await.unwrap(),
        None
    );
    let stored = checkpoints
        .load("orders")
        .await
        .unwrap()
        .expect("a checkpoint");
    assert_eq!(stored, checkpoint("orders", 3, "b", 2));
    drop_prefix(&mut admin, &prefix).await;
}

// ---------------------------------------------------------------------------------------------
// 3. Expiry by the server's clock.

#[tokio::test]
async fn leases_expire_by_the_servers_clock() {
    let _serial = SERIAL.lock().await;
    let mut admin = admin().await;
    let prefix = unique_prefix("expiry");
    let redis = connect(&prefix).await;
    let leases = RedisLeaseStore::new(&redis);
    let ttl = 800_i64;

    // The expiry is the server's TIME at the acquisition plus the TTL.
    let before = server_ms(&mut admin).await;
    let a = leases
        .try_acquire("s", "a", Duration::from_millis(ttl as u64))
        .await
        .unwrap()
        .expect("a free lease");
    let after = server_ms(&mut admin).await;
    let exp = a.expires_at.timestamp_millis();
    assert!(
        (before + ttl..=after + ttl).contains(&exp),
        "{before} + {ttl} <= {exp} <= {after} + {ttl}"
    );

    // The lease hash carries that figure, and has no TTL of its own: it outlives the lease so
    // the epoch never restarts.
    let key = leases.key("s");
    let stored: i64 = redis::cmd("HGET")
        .arg(&key)
        .arg("expiresAt")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(stored, exp);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(pttl, -1, "the lease hash must never expire");

    // Another owner is refused exactly while the server's clock is before the expiry.
    let mut refused = 0;
    let b = loop {
        let before = server_ms(&mut admin).await;
        let got = leases
            .try_acquire("s", "b", Duration::from_secs(30))
            .await
            .unwrap();
        let after = server_ms(&mut admin).await;
        match got {
            None => {
                assert!(
                    before < exp,
                    "refused at server time {before} >= expiry {exp}"
                );
                refused += 1;
            }
            Some(b) => {
                assert!(after >= exp, "taken at server time {after} < expiry {exp}");
                break b;
            }
        }
        assert!(after < exp + 5_000, "the lease did not expire");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(refused > 0, "the lease was never seen held");
    assert_eq!((b.owner.as_str(), b.epoch), ("b", 2));

    // Renewal moves the expiry by the server's clock too.
    let before = server_ms(&mut admin).await;
    let renewed = leases
        .renew(&b, Duration::from_millis(ttl as u64))
        .await
        .unwrap()
        .expect("held");
    let after = server_ms(&mut admin).await;
    let exp = renewed.expires_at.timestamp_millis();
    assert!((before + ttl..=after + ttl).contains(&exp));

    // Released: free at once, epoch kept.
    leases.release(&renewed).await.unwrap();
    let c = leases
        .try_acquire("s", "c", Duration::from_secs(1))
        .await
        .unwrap()
        .expect("free");
    assert_eq!(c.epoch, 3);
    drop_prefix(&mut admin, &prefix).await;
}

// ---------------------------------------------------------------------------------------------
// 4. A dropped connection mid-write.

/// The client ids on the server, and the id of the one blocked in `cmd` (if any).
async fn clients(admin: &mut MultiplexedConnection) -> Vec<(i64, String)> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(admin)
        .await
        .unwrap();
    list.lines()
        .filter_map(|l| {
            let id = l
                .split(' ')
                .find_map(|f| f.strip_prefix("id="))?
                .parse()
                .ok()?;
            Some((id, l.to_owned()))
        })
        .collect()
}

#[tokio::test]
async fn a_connection_dropped_mid_write_is_unavailable_and_moves_nothing() {
    let _serial = SERIAL.lock().await;
    let mut admin = admin().await;
    let prefix = unique_prefix("dropped");
    let existing: Vec<i64> = clients(&mut admin).await.into_iter().map(|c| c.0).collect();
    let redis = connect(&prefix).await;
    let (checkpoints, leases) = (
        RedisCheckpointStore::new(&redis),
        RedisLeaseStore::new(&redis),
    );
    let lease = leases
        .try_acquire("orders", "a", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    checkpoints
        .claim(
            "orders",
            &Fence {
                owner: "a".into(),
                epoch: lease.epoch,
            },
        )
        .await
        .unwrap();
    let kept = checkpoint("orders", 1, "a", lease.epoch);
    checkpoints.save(&kept).await.unwrap();

    // The next write reaches the server and waits there (writes paused); its connection is then
    // killed before it runs.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(10_000)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .unwrap();
    let writer = {
        let checkpoints = checkpoints.clone();
        let next = checkpoint("orders", 2, "a", lease.epoch);
        tokio::spawn(async move { checkpoints.save(&next).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let victim = loop {
        let found = clients(&mut admin).await.into_iter().find(|(id, line)| {
            !existing.contains(id) && line.contains(" flags=b ") && line.contains(" cmd=evalsha ")
        });
        if let Some((id, _)) = found {
            break id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the write never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(victim)
        .query_async(&mut admin)
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    let e = writer
        .await
        .unwrap()
        .expect_err("the write's connection was killed");
    assert_eq!(e.kind, StoreErrorKind::Unavailable, "{e}");

    // The store reconnects by itself; the checkpoint is what it was, and the retried write lands.
    let mut loaded = None;
    for _ in 0..50 {
        match checkpoints.load("orders").await {
            Ok(cp) => {
                loaded = cp;
                break;
            }
            Err(e) => {
                assert_eq!(e.kind, StoreErrorKind::Unavailable, "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(loaded, Some(kept), "the checkpoint neither lost nor moved");
    checkpoints
        .save(&checkpoint("orders", 2, "a", lease.epoch))
        .await
        .unwrap();
    assert_eq!(
        checkpoints.load("orders").await.unwrap(),
        Some(checkpoint("orders", 2, "a", lease.epoch))
    );

    // A server that accepts and closes at once: Unavailable too (here at connection time).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let closer = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            drop(socket);
        }
    });
    let config = RedisConfig::new(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_millis(300))
        .operation_timeout(Duration::from_millis(300));
    let e = RedisConnection::connect(&config)
        .await
        .expect_err("nothing answers");
    assert!(
        matches!(e, flowwarden::redis::RedisConnectError::Unreachable { .. }),
        "{e}"
    );
    closer.abort();
    drop_prefix(&mut admin, &prefix).await;
}

// ---------------------------------------------------------------------------------------------
// The runtime on { in-memory source, Redis checkpoints and leases }: a SingleLeader stream
// checkpoints into Redis, and keeps going when its Redis connection is killed (the engine
// retries the Unavailable errors).

#[tokio::test]
async fn a_single_leader_stream_checkpoints_into_redis_across_a_killed_connection() {
    let _serial = SERIAL.lock().await;
    let mut admin = admin().await;
    let prefix = unique_prefix("runtime");
    let existing: Vec<i64> = clients(&mut admin).await.into_iter().map(|c| c.0).collect();
    let redis = connect(&prefix).await;
    let checkpoints = RedisCheckpointStore::new(&redis);
    let memory = MemoryBackend::new();
    let leases = Arc::new(RedisLeaseStore::new(&redis));
    memory.fence_dead_letters_by(leases.clone());
    let backend = Backend {
        checkpoints: Arc::new(checkpoints.clone()),
        leases: Some(leases),
        transactions: None,
        ..Backend::from(memory.clone())
    };
    let d = def("redis-leader", |d| {
        d.checkpoint.save_every_n = 1;
        d.deployment = Deployment::SingleLeader(LeaseConfig {
            lease_secs: 3,
            renew_secs: 1,
            standby_poll_secs: 1,
        });
    });
    let probe = Probe::default();
    let rt = start_with(&memory, &probe, d, |b| {
        b.backend(backend).instance_id("node-1")
    })
    .await;
    wait_status(&rt, "redis-leader", |s| s.state == StreamState::Running).await;
    insert_ids(&memory, 1..=3);
    wait_until("1..3 handled", || probe.handled_keys().len() >= 3).await;

    let ours: Vec<i64> = clients(&mut admin)
        .await
        .into_iter()
        .map(|c| c.0)
        .filter(|id| !existing.contains(id))
        .collect();
    assert!(!ours.is_empty(), "the runtime's Redis connection is listed");
    for id in ours {
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    insert_ids(&memory, 4..=6);
    wait_until("1..6 handled", || {
        let keys = probe.handled_keys();
        (1..=6).all(|i| keys.contains(&Bson::Int32(i)))
    })
    .await;
    let last = token_of(memory.oplog_head());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let cp = checkpoints.load("redis-leader").await;
        if let Ok(Some(cp)) = &cp {
            let at = cp
                .last_processed
                .as_ref()
                .and_then(|p| p.token.data().map(str::to_owned));
            if at.as_deref() == Some(last.as_str()) {
                assert_eq!(cp.owner.as_deref(), Some("node-1"));
                assert!(
                    cp.epoch.is_some(),
                    "a leader's checkpoint carries its epoch"
                );
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the checkpoint never reached {last}: {cp:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        rt.handle().status("redis-leader").unwrap().state,
        StreamState::Running
    );
    rt.shutdown().await;
    drop_prefix(&mut admin, &prefix).await;
}

// ---------------------------------------------------------------------------------------------
// The Redis store of the idempotency helper (features `redis` and `dedup`).

#[tokio::test]
async fn applied_events_are_recorded_once_and_expire_by_the_servers_clock() {
    use flowwarden::dedup::AppliedStore;
    let _serial = SERIAL.lock().await;
    let mut admin = admin().await;
    let prefix = unique_prefix("applied");
    let redis = connect(&prefix).await;
    let store = flowwarden::redis::RedisApplied::new(&redis);
    assert!(!store.contains("orders:AA").await.expect("reads"));
    store
        .record("orders:AA", Duration::from_millis(300))
        .await
        .expect("writes");
    // Recording again is no error and does not extend the record.
    store
        .record("orders:AA", Duration::from_secs(3_600))
        .await
        .expect("writes again");
    assert!(store.contains("orders:AA").await.expect("reads"));
    let pttl: i64 = redis::cmd("PTTL")
        .arg(store.redis_key("orders:AA"))
        .query_async(&mut admin)
        .await
        .expect("PTTL");
    assert!(
        (1..=300).contains(&pttl),
        "Redis expires the record by its own clock within the first TTL: PTTL {pttl}"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !store.contains("orders:AA").await.expect("reads"),
        "expired"
    );
    drop_prefix(&mut admin, &prefix).await;
}
