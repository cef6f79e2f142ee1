//! Support of the end-to-end engine scenarios through the real driver: a target (the emulator,
//! or a live replica set named by `FLOWWARDEN_TEST_MONGODB_URI`), a configurable handler
//! written without the macros, and helpers to run it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, Document};
use flowwarden::definition::SourceLocation;
use flowwarden::{
    AnyStream, ChangeContext, CheckpointConfig, ErrorAction, HandlerError, HandlerFuture,
    RestartConfig, RetryConfig, Runtime, StreamDefinition, StreamHandler, StreamStatus,
};
use flowwarden_rs_mongo::MongoBackend;
use futures::future::BoxFuture;
use futures::FutureExt;
use mongo_emulator::Emulator;
use mongodb::Collection;

/// The variable naming a live replica set for the live variants.
pub const LIVE_ENV: &str = "FLOWWARDEN_TEST_MONGODB_URI";

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

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

/// One handler invocation, as the probe saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub op: String,
    pub key: Option<Bson>,
    /// The token's `_data`.
    pub token: String,
    pub attempt: u32,
}

type Behaviour = Arc<
    dyn Fn(Arc<ChangeContext<Document>>) -> BoxFuture<'static, Result<(), HandlerError>>
        + Send
        + Sync,
>;
type FilterFn = Arc<dyn Fn(&ChangeContext<Document>) -> bool + Send + Sync>;

/// A handler (like `#[on_change]`: it takes every operation) whose behaviour each test sets;
/// it records every invocation and every success.
#[derive(Clone)]
pub struct Probe {
    pub calls: Arc<Mutex<Vec<Call>>>,
    pub successes: Arc<Mutex<Vec<Call>>>,
    behaviour: Behaviour,
    filter: Option<FilterFn>,
}

impl Default for Probe {
    fn default() -> Self {
        Self::new(|_| async { Ok(()) }.boxed())
    }
}

impl Probe {
    pub fn new(
        f: impl Fn(Arc<ChangeContext<Document>>) -> BoxFuture<'static, Result<(), HandlerError>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self {
            calls: Arc::default(),
            successes: Arc::default(),
            behaviour: Arc::new(f),
            filter: None,
        }
    }

    pub fn with_filter(
        mut self,
        f: impl Fn(&ChangeContext<Document>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.filter = Some(Arc::new(f));
        self
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("lock").clone()
    }

    pub fn successes(&self) -> Vec<Call> {
        self.successes.lock().expect("lock").clone()
    }

    /// Keys of successful invocations, in order.
    pub fn handled_keys(&self) -> Vec<Bson> {
        self.successes().into_iter().filter_map(|c| c.key).collect()
    }

    /// The token of the (first) successful invocation for `key`.
    pub fn token_for(&self, key: i32) -> Option<String> {
        self.successes()
            .into_iter()
            .find(|c| c.key == Some(Bson::Int32(key)))
            .map(|c| c.token)
    }
}

fn call_of<T>(ctx: &ChangeContext<T>) -> Call {
    Call {
        op: ctx.operation_type().to_string(),
        key: ctx.document_key().and_then(|k| k.get("_id").cloned()),
        token: ctx.resume_token().data().unwrap_or_default().to_owned(),
        attempt: ctx.attempt(),
    }
}

static DEFAULT_DEF: StreamDefinition = StreamDefinition {
    name: "probe",
    type_name: "Probe",
    database: None,
    collection: "orders",
    full_document: flowwarden::FullDocument::Default,
    full_document_before_change: flowwarden::FullDocumentBeforeChange::Off,
    enabled: true,
    auto_start: true,
    checkpoint: CheckpointConfig::DEFAULT,
    retry: RetryConfig::DEFAULT,
    restart: RestartConfig::DEFAULT,
    deployment: flowwarden::Deployment::AllInstances,
    source: SourceLocation {
        file: file!(),
        line: line!(),
    },
};

impl StreamHandler for Probe {
    type Document = Document;

    fn definition() -> &'static StreamDefinition {
        &DEFAULT_DEF
    }

    fn filter(&self, ctx: &ChangeContext<Document>) -> bool {
        self.filter.as_ref().is_none_or(|f| f(ctx))
    }

    fn handle(self: Arc<Self>, ctx: Arc<ChangeContext<Document>>) -> Option<HandlerFuture> {
        let call = call_of(&ctx);
        self.calls.lock().expect("lock").push(call.clone());
        let fut = (self.behaviour)(ctx);
        let successes = self.successes.clone();
        Some(Box::pin(async move {
            let r = fut.await;
            if r.is_ok() {
                successes.lock().expect("lock").push(call);
            }
            r
        }))
    }

    fn on_error(
        &self,
        _error: &HandlerError,
        _ctx: &ChangeContext<Document>,
    ) -> Option<ErrorAction> {
        None
    }
}

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

/// A definition with test-friendly settings (short delays, no jitter, heartbeat every
/// second), adjusted by `f`. Leaked: tests are short-lived.
pub fn def(name: &'static str, f: impl FnOnce(&mut StreamDefinition)) -> &'static StreamDefinition {
    let mut d = DEFAULT_DEF.clone();
    d.name = name;
    d.retry = RetryConfig {
        max_attempts: 3,
        initial_delay_ms: 10,
        multiplier: 2.0,
        max_delay_ms: 50,
        jitter: false,
    };
    d.restart = RestartConfig {
        max_attempts: 0,
        initial_delay_ms: 10,
        max_delay_ms: 100,
    };
    d.checkpoint.save_interval_secs = 1;
    f(&mut d);
    Box::leak(Box::new(d))
}

/// Starts a runtime running only `stream` on the target's backend.
pub async fn start_any(t: &Target, stream: AnyStream) -> Runtime {
    let name = stream.definition().name;
    let rt = flowwarden::builder()
        .discover(false)
        .any_stream(stream)
        .backend(t.backend.clone())
        .seed(7)
        .max_await(Duration::from_millis(150))
        .shutdown_timeout(Duration::from_secs(5))
        .start()
        .await
        .expect("runtime starts");
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
    tokio::time::timeout(Duration::from_secs(20), rt.handle().wait_for(name, pred))
        .await
        .expect("status reached within 20 s")
        .expect("stream exists")
}

/// Waits until `cond` holds, polling (bounded).
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
