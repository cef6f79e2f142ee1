//! The NATS JetStream bridge against a real `nats-server` with JetStream: each test starts its
//! own server on a free port with its own store directory (never the machine's shared server),
//! and kills it when it ends. The in-memory backend is the change source.
#![cfg(feature = "nats")]

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use flowwarden::nats::async_nats;
use flowwarden::nats::async_nats::header::NATS_MESSAGE_ID;
use flowwarden::nats::async_nats::jetstream::{self, consumer::pull, stream};
use flowwarden::nats::{Envelope, NatsBridge, NatsBridgeError, Published};
use flowwarden::port::DeadLetterQuery;
use flowwarden::{ChangeContext, HaltReason, MemoryBackend, StreamState};
use futures::{FutureExt, StreamExt};
use support::*;

const JS_STREAM: &str = "FLOWWARDEN";

// ---------------------------------------------------------------------------------------------
// The test's own nats-server
// ---------------------------------------------------------------------------------------------

/// One `nats-server -js` process owned by one test; killed (and its store removed) on drop.
struct NatsServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

fn nats_server_binary() -> PathBuf {
    let fixed = Path::new("/usr/sbin/nats-server");
    if fixed.exists() {
        return fixed.to_owned();
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("nats-server"))
            .find(|p| p.exists())
    });
    on_path.unwrap_or_else(|| {
        panic!(
            "nats-server is not installed (neither /usr/sbin/nats-server nor on PATH): \
             these tests need a real NATS server with JetStream; run `apt-get install nats-server`"
        )
    })
}

impl NatsServer {
    fn start() -> Self {
        let binary = nats_server_binary();
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("fw-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("store directory");
        let log = std::fs::File::create(dir.join("server.log")).expect("log file");
        let child = Command::new(&binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut server = Self {
            child: Some(child),
            port,
            dir,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("nats-server exited at start ({status}): {}", self.log());
                }
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server not listening: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server now (SIGKILL: nothing is flushed, like a crash or a lost host).
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Connects to `server` and creates the JetStream stream that takes `flowwarden.>` (and
/// `shop.>`), with a two-minute duplicate window.
async fn jetstream_on(server: &NatsServer) -> jetstream::Context {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(server.url())
        .await
        .expect("connects to the test's nats-server");
    let js = jetstream::new(client);
    let config = stream::Config {
        name: JS_STREAM.to_owned(),
        subjects: vec!["flowwarden.>".to_owned(), "shop.>".to_owned()],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    };
    let mut last = None;
    for _ in 0..50 {
        match js.create_stream(config.clone()).await {
            Ok(_) => return js,
            // JetStream may still be starting up.
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot create the JetStream stream: {last:?}")
}

async fn stored_messages(js: &jetstream::Context) -> u64 {
    let mut s = js.get_stream(JS_STREAM).await.expect("the stream exists");
    s.info().await.expect("stream info").state.messages
}

// ---------------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------------

#[derive(serde::Serialize)]
struct Changed {
    n: Option<i32>,
}

fn bridge(js: &jetstream::Context) -> NatsBridge<Document> {
    NatsBridge::new(js.clone(), |ctx: &ChangeContext<Document>| Changed {
        n: ctx.document().and_then(|d| d.get_i32("n").ok()),
    })
}

type Acks = Arc<Mutex<Vec<Published>>>;

/// A hand-written handler (the shared probe) whose every invocation publishes through the
/// bridge, returns its result to the engine, and records what JetStream acknowledged.
fn publishing_probe(bridge: NatsBridge<Document>, acks: Acks) -> Probe {
    let bridge = Arc::new(bridge);
    Probe::new(move |ctx| {
        let (bridge, acks) = (bridge.clone(), acks.clone());
        async move {
            let published = bridge.publish_acked(&ctx).await?;
            acks.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(published);
            Ok(())
        }
        .boxed()
    })
}

fn read(acks: &Acks) -> Vec<Published> {
    acks.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

// ---------------------------------------------------------------------------------------------
// 1. A crash between publish and checkpoint produces no duplicate
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_publish_and_checkpoint_publishes_no_duplicate() {
    const N: i32 = 20;
    let server = NatsServer::start();
    let js = jetstream_on(&server).await;
    // No checkpoint after the events (save_every_n far away, no heartbeat): everything
    // published is redelivered after the crash.
    let d = def("nats-crash", |d| {
        d.checkpoint.save_every_n = 10_000;
        d.checkpoint.save_interval_secs = 0;
    });
    let backend = MemoryBackend::new();
    let acks: Acks = Arc::default();
    let probe = publishing_probe(bridge(&js), acks.clone());
    // One configured instance identity for both runs: the restart is the same instance, so it
    // does not wait for the crashed run's checkpoint guard to expire.
    // Its checkpoint is then `<stream>@<instance>`.
    let same_instance = |b: flowwarden::Builder| b.instance_id("nats-test");
    const CHECKPOINT: &str = "nats-crash@nats-test";
    let rt = start_with(&backend, &probe, d, same_instance).await;
    let began = Instant::now();
    insert_ids(&backend, 1..=N);
    wait_until("every event published", || {
        probe.successes().len() == N as usize
    })
    .await;
    let elapsed = began.elapsed();
    println!(
        "{N} events published and acknowledged one at a time in {elapsed:?} ({:?} per event)",
        elapsed / N as u32
    );
    assert!(read(&acks).iter().all(|a| !a.duplicate));
    assert_eq!(stored_messages(&js).await, N as u64);

    rt.handle().crash().await;
    let (seen, processed) = stored_tokens(&backend, CHECKPOINT);
    assert!(
        backend.checkpoint_document(CHECKPOINT).is_some(),
        "the opening position was checkpointed before any event"
    );
    assert_eq!(processed, None, "nothing was checkpointed after the events");
    assert!(
        (1..=N as u64).all(|i| seen.as_deref() != Some(token_of(i).as_str())),
        "the stored position is before every published event: {seen:?}"
    );

    // Restart on the same backend: every event comes again and is published again.
    let again: Acks = Arc::default();
    let probe = publishing_probe(bridge(&js), again.clone());
    let rt = start_with(&backend, &probe, d, same_instance).await;
    wait_until("every event redelivered", || {
        probe.successes().len() == N as usize
    })
    .await;
    rt.shutdown().await;
    let again = read(&again);
    assert_eq!(
        again.len(),
        N as usize,
        "the restarted handler published again"
    );
    assert!(
        again.iter().all(|a| a.duplicate),
        "JetStream dropped every redelivered copy by its Nats-Msg-Id: {again:?}"
    );
    let first: Vec<u64> = read(&acks).iter().map(|a| a.sequence).collect();
    let second: Vec<u64> = again.iter().map(|a| a.sequence).collect();
    assert_eq!(first, second, "each duplicate points at the first copy");
    assert_eq!(
        stored_messages(&js).await,
        N as u64,
        "exactly one message per event"
    );
    assert_eq!(
        stored_tokens(&backend, CHECKPOINT).1.as_deref(),
        Some(token_of(N as u64).as_str()),
        "the graceful shutdown checkpointed after the last acknowledged event"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. A stopped server: retries, then a dead letter; never a checkpoint past the event
// ---------------------------------------------------------------------------------------------

/// Polls the stored checkpoint until `done`, failing if it ever names a position at or after
/// `unacked` (the event JetStream never acknowledged) while `done` does not hold yet. The
/// checkpoint is read first: a checkpoint past the event seen before `done` holds is a
/// checkpoint written before the event was settled by `done` (a dead letter, a halt).
async fn checkpoint_stays_before(
    backend: &MemoryBackend,
    stream: &str,
    unacked: u64,
    mut done: impl AsyncFnMut() -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (seen, processed) = stored_tokens(backend, stream);
        let finished = done().await;
        for token in [seen, processed].into_iter().flatten() {
            assert!(
                finished || token < token_of(unacked),
                "the checkpoint {token} passed the unacknowledged event {}",
                token_of(unacked)
            );
        }
        if finished {
            return;
        }
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_leads_to_retries_then_a_dead_letter() {
    let mut server = NatsServer::start();
    let js = jetstream_on(&server).await;
    let backend = MemoryBackend::new();
    let acks: Acks = Arc::default();
    let bridge = bridge(&js).ack_timeout(Duration::from_millis(300));
    let probe = publishing_probe(bridge, acks.clone());
    let d = def("nats-down", |d| d.checkpoint.save_every_n = 1);
    let rt = start(&backend, &probe, d).await;

    insert_ids(&backend, [1]);
    wait_until("event 1 acknowledged and checkpointed", || {
        stored_tokens(&backend, "nats-down").1.as_deref() == Some(token_of(1).as_str())
    })
    .await;

    server.kill();
    insert_ids(&backend, [2]);
    let dead_letters = rt.handle().dead_letters();
    checkpoint_stays_before(&backend, "nats-down", 2, async || {
        !dead_letters
            .list(&DeadLetterQuery::default())
            .await
            .expect("list")
            .is_empty()
    })
    .await;

    let records = dead_letters
        .list(&DeadLetterQuery::default())
        .await
        .expect("list");
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.document_key, Some(doc! {"_id": 2}));
    assert_eq!(record.attempts, 3, "every attempt of #[retry] was made");
    let chain = record.error_chain.join(": ");
    assert!(chain.contains("JetStream"), "the record says why: {chain}");
    let attempts: Vec<u32> = probe
        .calls()
        .into_iter()
        .filter(|c| c.key == Some(Bson::Int32(2)))
        .map(|c| c.attempt)
        .collect();
    assert_eq!(attempts, [1, 2, 3], "retried before it was dead-lettered");
    assert_eq!(read(&acks).len(), 1, "only event 1 was acknowledged");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_without_a_dead_letter_store_halts_before_the_event() {
    let mut server = NatsServer::start();
    let js = jetstream_on(&server).await;
    let backend = MemoryBackend::new();
    let bridge = bridge(&js).ack_timeout(Duration::from_millis(300));
    let probe = publishing_probe(bridge, Arc::default());
    let d = def("nats-halt", |d| d.checkpoint.save_every_n = 1);
    let rt = start_with(&backend, &probe, d, |b| b.without_dead_letters()).await;

    insert_ids(&backend, [1]);
    wait_until("event 1 acknowledged and checkpointed", || {
        stored_tokens(&backend, "nats-halt").1.as_deref() == Some(token_of(1).as_str())
    })
    .await;

    server.kill();
    insert_ids(&backend, [2]);
    let handle = rt.handle();
    checkpoint_stays_before(&backend, "nats-halt", 2, async || {
        handle.status("nats-halt").is_some_and(|s| s.halt.is_some())
    })
    .await;
    let st = handle.status("nats-halt").expect("the stream exists");
    let halt = st.halt.expect("halted");
    assert_eq!(halt.reason, HaltReason::NoDeadLetterStore);
    assert_ne!(st.state, StreamState::Running);
    rt.shutdown().await;
    assert_eq!(
        stored_tokens(&backend, "nats-halt").1.as_deref(),
        Some(token_of(1).as_str()),
        "the checkpoint stays before the unacknowledged event, even after shutdown"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. The envelope and the subject, read back from a JetStream consumer
// ---------------------------------------------------------------------------------------------

async fn consume(js: &jetstream::Context, count: usize) -> Vec<jetstream::Message> {
    let s = js.get_stream(JS_STREAM).await.expect("the stream exists");
    let consumer = s
        .create_consumer(pull::Config::default())
        .await
        .expect("an ephemeral pull consumer");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < count && Instant::now() < deadline {
        let mut batch = consumer
            .fetch()
            .max_messages(count - out.len())
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .expect("fetch");
        while let Some(m) = batch.next().await {
            let m = m.expect("a message");
            m.ack().await.expect("ack");
            out.push(m);
        }
    }
    assert_eq!(out.len(), count, "every published message was read back");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envelope_and_the_subject_are_as_documented() {
    let server = NatsServer::start();
    let js = jetstream_on(&server).await;
    let backend = MemoryBackend::new();
    let d = def("envelope", |_| {});
    // The ready-made stream: every operation published, data = the mapping of the context.
    let stream = bridge(&js).into_stream(d);
    let rt = flowwarden::builder()
        .discover(false)
        .any_stream(stream)
        .backend(backend.clone())
        .max_await(Duration::from_millis(200))
        .start()
        .await
        .expect("runtime starts");
    wait_status(&rt, "envelope", |s| s.state != StreamState::Starting).await;

    let orders = backend.collection("orders");
    orders.insert_one(doc! {"_id": 7, "n": 1}).expect("insert");
    orders
        .update_one(doc! {"_id": 7}, doc! {"$set": {"n": 2}})
        .expect("update");
    orders.delete_one(doc! {"_id": 7}).expect("delete");
    wait_status(&rt, "envelope", |s| s.counters.handled == 3).await;
    rt.shutdown().await;

    let messages = consume(&js, 3).await;
    let subjects: Vec<&str> = messages.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(
        subjects,
        [
            "flowwarden.envelope.insert",
            "flowwarden.envelope.update",
            "flowwarden.envelope.delete"
        ]
    );
    for (i, (m, op)) in messages
        .iter()
        .zip(["insert", "update", "delete"])
        .enumerate()
    {
        let json: serde_json::Value = serde_json::from_slice(&m.payload).expect("JSON payload");
        let keys: Vec<&str> = json
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            [
                "clusterTime",
                "data",
                "id",
                "key",
                "operation",
                "specversion",
                "stream",
                "wallTime"
            ],
            "exactly the documented fields, never the raw event"
        );
        let token = token_of(i as u64 + 1);
        let id = format!("envelope:{token}");
        assert_eq!(json["specversion"], 1);
        assert_eq!(json["id"], id.as_str());
        assert_eq!(json["stream"], "envelope");
        assert_eq!(json["operation"], op);
        assert_eq!(json["key"], serde_json::json!({"_id": 7}));
        assert_eq!(json["clusterTime"]["i"], i as u64 + 1);
        assert!(json["clusterTime"]["t"].as_u64().is_some_and(|t| t > 0));
        assert!(json["wallTime"].as_str().is_some_and(|w| w.ends_with('Z')));
        let headers = m.headers.as_ref().expect("headers");
        assert_eq!(
            headers.get(NATS_MESSAGE_ID).map(|v| v.as_str()),
            Some(id.as_str()),
            "Nats-Msg-Id is the event id"
        );
        assert_eq!(
            headers.get("Content-Type").map(|v| v.as_str()),
            Some("application/json")
        );
        let typed: Envelope<serde_json::Value> =
            serde_json::from_slice(&m.payload).expect("an Envelope");
        assert_eq!(typed.id, id);
    }
    let data: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| {
            serde_json::from_slice::<serde_json::Value>(&m.payload).expect("JSON")["data"].clone()
        })
        .collect();
    // Inserts carry the document; this stream has no updateLookup, so updates and deletes
    // do not: the mapping sees exactly what the context holds.
    assert_eq!(
        data,
        [
            serde_json::json!({"n": 1}),
            serde_json::json!({"n": null}),
            serde_json::json!({"n": null})
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_prefix_and_a_missing_stream() {
    let server = NatsServer::start();
    let js = jetstream_on(&server).await;
    let backend = MemoryBackend::new();
    let acks: Acks = Arc::default();
    let prefixed = bridge(&js)
        .subject_prefix("shop.events")
        .expect("a valid prefix");
    let probe = publishing_probe(prefixed, acks.clone());
    let rt = start(&backend, &probe, def("orders.v2", |_| {})).await;
    insert_ids(&backend, [1]);
    wait_until("published", || read(&acks).len() == 1).await;
    rt.shutdown().await;
    assert_eq!(read(&acks)[0].subject, "shop.events.orders_v2.insert");
    assert_eq!(read(&acks)[0].stream, JS_STREAM);
    assert!(bridge(&js).subject_prefix("a..b").is_err());

    // A subject no JetStream stream takes is refused at once ("no responders"), not timed out.
    let nowhere = bridge(&js)
        .subject_prefix("nowhere")
        .expect("a valid prefix");
    let failed: Arc<Mutex<Option<String>>> = Arc::default();
    let f = failed.clone();
    let nowhere = Arc::new(nowhere);
    let probe = Probe::new(move |ctx| {
        let (nowhere, f) = (nowhere.clone(), f.clone());
        async move {
            match nowhere.publish_acked(&ctx).await {
                Err(e @ NatsBridgeError::Refused { .. }) => {
                    *f.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
                    Err(e.into())
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        .boxed()
    });
    let d = def("nowhere", |d| d.retry.max_attempts = 1);
    let rt = start(&backend, &probe, d).await;
    insert_ids(&backend, [3]);
    wait_until("refused", || {
        failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    })
    .await;
    rt.shutdown().await;
}
