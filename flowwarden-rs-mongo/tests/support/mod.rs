//! Support of the end-to-end engine scenarios through the real driver: a target (the emulator,
//! or a live replica set named by `FLOWWARDEN_TEST_MONGODB_URI`), a configurable handler
//! written without the macros, and helpers to run it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, Document};
use flowwarden::{
    AnyStream, ChangeContext, HandlerFuture, Runtime, StreamDefinition, StreamHandler, StreamStatus,
};
use flowwarden_rs_mongo::MongoBackend;
use mongo_emulator::Emulator;
use mongodb::Collection;

/// Declares a scenario `$name(&Target)`: an emulator test, and a live test (or, for scenarios
/// that need the emulator's fault injection, a live test that says why it does not run).
#[macro_export]
macro_rules! scenario {
    ($name:ident) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn emulator() {
                let t = Target::emulator().await;
                super::$name(&t).await;
                t.finish().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn live() {
                let Some(t) = Target::live(stringify!($name)).await else {
                    return;
                };
                super::$name(&t).await;
                t.finish().await;
            }
        }
    };
    ($name:ident, emulator_only: $why:literal) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn emulator() {
                let t = Target::emulator().await;
                super::$name(&t).await;
                t.finish().await;
            }
            #[tokio::test]
            async fn live() {
                Target::skip_live(stringify!($name), $why);
            }
        }
    };
}

/// The variable naming a live replica set for the live variants.
pub const LIVE_ENV: &str = "FLOWWARDEN_TEST_MONGODB_URI";

pub use flowwarden_testkit::init_logs;

/// Where a scenario runs.
pub struct Target {
    /// The emulator, when the scenario runs on it.
    pub emu: Option<Emulator>,
    /// The backend under test.
    pub backend: MongoBackend,
    /// The database (unique per run on a live server).
    pub db: String,
    /// The connection string the backend was made from.
    pub uri: String,
}

static RUN: AtomicU64 = AtomicU64::new(0);

impl Target {
    /// A fresh emulator.
    pub async fn emulator() -> Target {
        init_logs();
        let emu = Emulator::start().await.expect("emulator starts");
        let db = "fwe2e".to_owned();
        let uri = emu.uri();
        let backend = MongoBackend::connect(&uri, &db).await.expect("connects");
        Target {
            emu: Some(emu),
            backend,
            db,
            uri,
        }
    }

    /// The emulator behind a direct connection without retries, where a step-down shows as
    /// 10107 replies instead of a server-selection timeout.
    pub async fn emulator_direct() -> Target {
        init_logs();
        let emu = Emulator::start().await.expect("emulator starts");
        let db = "fwe2e".to_owned();
        let uri = format!("{}&retryWrites=false&retryReads=false", emu.uri_direct());
        let backend = MongoBackend::connect(&uri, &db).await.expect("connects");
        Target {
            emu: Some(emu),
            backend,
            db,
            uri,
        }
    }

    /// The live replica set, on a database unique to this run; `None` (with a clear message)
    /// when `FLOWWARDEN_TEST_MONGODB_URI` is not set.
    pub async fn live(scenario: &str) -> Option<Target> {
        init_logs();
        let Some(uri) = std::env::var(LIVE_ENV)
            .ok()
            .filter(|u| !u.trim().is_empty())
        else {
            println!("SKIPPED: {LIVE_ENV} is not set (live variant of '{scenario}')");
            return None;
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let db = format!(
            "fw_live_{}_{}_{}",
            std::process::id(),
            nanos,
            RUN.fetch_add(1, Ordering::SeqCst)
        );
        let backend = MongoBackend::connect(uri.trim(), &db)
            .await
            .unwrap_or_else(|p| panic!("live server refused: {p:?}"));
        Some(Target {
            emu: None,
            backend,
            db,
            uri: uri.trim().to_owned(),
        })
    }

    /// Another backend on the same server and database, with its own client (connection pool
    /// and monitoring), as a second instance of a service has.
    pub async fn another_backend(&self) -> MongoBackend {
        MongoBackend::connect(&self.uri, &self.db)
            .await
            .expect("second client connects")
    }

    /// Prints why a scenario does not run on a live server.
    pub fn skip_live(scenario: &str, why: &str) {
        match std::env::var(LIVE_ENV) {
            Ok(u) if !u.trim().is_empty() => {
                println!("SKIPPED on the live server: '{scenario}' {why}")
            }
            _ => println!("SKIPPED: {LIVE_ENV} is not set (live variant of '{scenario}')"),
        }
    }

    /// The emulator (scenarios that inject faults run only on it).
    pub fn emu(&self) -> &Emulator {
        self.emu.as_ref().expect("this scenario needs the emulator")
    }

    /// A collection of the test database.
    pub fn coll(&self, name: &str) -> Collection<Document> {
        self.backend.client().database(&self.db).collection(name)
    }

    /// Inserts `{_id: i, n: i}` into `orders` for each i.
    pub async fn insert_ids(&self, ids: impl IntoIterator<Item = i32>) {
        let c = self.coll("orders");
        for i in ids {
            c.insert_one(doc! {"_id": i, "n": i}).await.expect("insert");
        }
    }

    /// The `_data` of the stored lastSeen / lastProcessed tokens of a stream.
    pub async fn stored_tokens(&self, stream: &str) -> (Option<String>, Option<String>) {
        let Some(d) = self
            .coll("_fw_checkpoints")
            .find_one(doc! {"_id": stream})
            .await
            .expect("read checkpoint")
        else {
            return (None, None);
        };
        let get = |f: &str| {
            d.get_document(f)
                .ok()
                .and_then(|t| t.get_str("_data").ok())
                .map(str::to_owned)
        };
        (get("lastSeenToken"), get("lastProcessedToken"))
    }

    /// Drops the live database (nothing to do on the emulator).
    pub async fn finish(self) {
        if self.emu.is_none() {
            if let Err(e) = self.backend.client().database(&self.db).drop().await {
                println!("could not drop the live test database {}: {e}", self.db);
            }
        }
    }
}

pub use flowwarden_testkit::{Probe, PROBE_DEF as DEFAULT_DEF};

/// A typed document, for decode failures.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Order {
    pub n: i32,
}

/// A handler whose document type is [`Order`].
#[derive(Clone, Default)]
pub struct TypedProbe {
    pub handled: Arc<Mutex<Vec<i32>>>,
}

impl StreamHandler for TypedProbe {
    type Document = Order;

    fn definition() -> &'static StreamDefinition {
        &DEFAULT_DEF
    }

    fn handle(self: Arc<Self>, ctx: Arc<ChangeContext<Order>>) -> Option<HandlerFuture> {
        let n = ctx.document().map(|o| o.n);
        let handled = self.handled.clone();
        Some(Box::pin(async move {
            if let Some(n) = n {
                handled.lock().expect("lock").push(n);
            }
            Ok(())
        }))
    }
}

/// A definition with test-friendly settings (short delays from 10 ms, no jitter, heartbeat
/// every second), adjusted by `f`.
pub fn def(name: &'static str, f: impl FnOnce(&mut StreamDefinition)) -> &'static StreamDefinition {
    flowwarden_testkit::probe_def(name, 10, f)
}

/// The checkpoint guard of these tests: a restart after `crash` (a new generated identity)
/// waits for the crashed runtime's guard to expire, at most lease + poll = 4 s.
pub const SHORT_GUARD: flowwarden::LeaseConfig = flowwarden::LeaseConfig {
    lease_secs: 3,
    renew_secs: 1,
    standby_poll_secs: 1,
};

/// Starts a runtime running only `stream` on the target's backend.
pub async fn start_any(t: &Target, stream: AnyStream) -> Runtime {
    start_any_with(t, stream, |b| b).await
}

/// Starts a runtime running only `stream` on the target's backend, its builder adjusted by
/// `configure`.
pub async fn start_any_with(
    t: &Target,
    stream: AnyStream,
    configure: impl FnOnce(flowwarden::Builder) -> flowwarden::Builder,
) -> Runtime {
    let name = stream.definition().name;
    let b = flowwarden::builder()
        .discover(false)
        .any_stream(stream)
        .backend(t.backend.clone())
        .seed(7)
        .max_await(Duration::from_millis(150))
        .shutdown_timeout(Duration::from_secs(5))
        .checkpoint_guard(SHORT_GUARD);
    let rt = configure(b).start().await.expect("runtime starts");
    // A stream without a checkpoint starts at "now": wait until its cursor is open (or it
    // halted) before the test writes anything.
    wait_status(&rt, name, |s| s.state != flowwarden::StreamState::Starting).await;
    rt
}

/// Starts a runtime running only `probe` as `def`.
pub async fn start(t: &Target, probe: &Probe, def: &'static StreamDefinition) -> Runtime {
    start_any(t, AnyStream::with_definition(probe.clone(), def)).await
}

/// Waits (bounded) until the stream's status satisfies `pred`.
pub async fn wait_status(
    rt: &Runtime,
    name: &str,
    pred: impl Fn(&StreamStatus) -> bool,
) -> StreamStatus {
    flowwarden_testkit::wait_status_within(rt, name, Duration::from_secs(20), pred).await
}

/// Waits until `cond` holds, polling (bounded).
pub async fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    flowwarden_testkit::wait_until_within(what, Duration::from_secs(20), cond).await
}

/// `Bson::Int32` keys.
pub fn ids(v: &[i32]) -> Vec<Bson> {
    v.iter().map(|i| Bson::Int32(*i)).collect()
}

/// The probe with a pipeline ending in `$changeStreamSplitLargeEvent`.
#[derive(Clone, Default)]
pub struct SplitProbe(pub Probe);

impl StreamHandler for SplitProbe {
    type Document = Document;

    fn definition() -> &'static StreamDefinition {
        &DEFAULT_DEF
    }

    fn pipeline() -> Vec<Document> {
        vec![doc! { flowwarden_rs_mongo::SPLIT_STAGE: {} }]
    }

    fn handle(self: Arc<Self>, ctx: Arc<ChangeContext<Document>>) -> Option<HandlerFuture> {
        Arc::new(self.0.clone()).handle(ctx)
    }
}
