//! Test support: a configurable handler written without the macros, and helpers to run it on
//! the in-memory backend.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Document};
use flowwarden::definition::SourceLocation;
use flowwarden::{
    AnyStream, ChangeContext, CheckpointConfig, ErrorAction, HandlerError, HandlerFuture,
    MemoryBackend, RestartConfig, RetryConfig, Runtime, StreamDefinition, StreamHandler,
    StreamStatus,
};
use futures::future::BoxFuture;
use futures::FutureExt;

/// One handler invocation, as the probe saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub op: String,
    pub key: Option<bson::Bson>,
    pub token: String,
    pub attempt: u32,
}

type Behaviour = Arc<
    dyn Fn(Arc<ChangeContext<Document>>) -> BoxFuture<'static, Result<(), HandlerError>>
        + Send
        + Sync,
>;
type FilterFn = Arc<dyn Fn(&ChangeContext<Document>) -> bool + Send + Sync>;
type OnErrorFn = Arc<dyn Fn(&HandlerError) -> ErrorAction + Send + Sync>;

/// A handler whose behaviour each test sets; it records every invocation (successful or not)
/// and every success.
#[derive(Clone)]
pub struct Probe {
    pub calls: Arc<Mutex<Vec<Call>>>,
    pub successes: Arc<Mutex<Vec<Call>>>,
    behaviour: Behaviour,
    filter: Option<FilterFn>,
    on_error: Option<OnErrorFn>,
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
            on_error: None,
        }
    }

    pub fn with_filter(
        mut self,
        f: impl Fn(&ChangeContext<Document>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.filter = Some(Arc::new(f));
        self
    }

    pub fn with_on_error(
        mut self,
        f: impl Fn(&HandlerError) -> ErrorAction + Send + Sync + 'static,
    ) -> Self {
        self.on_error = Some(Arc::new(f));
        self
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn successes(&self) -> Vec<Call> {
        self.successes.lock().unwrap().clone()
    }

    /// Keys of successful invocations, in order.
    pub fn handled_keys(&self) -> Vec<bson::Bson> {
        self.successes().into_iter().filter_map(|c| c.key).collect()
    }
}

fn call_of(ctx: &ChangeContext<Document>) -> Call {
    Call {
        op: ctx.operation_type().to_string(),
        key: ctx.document_key().and_then(|k| k.get("_id").cloned()),
        token: ctx.resume_token().to_string(),
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
        self.calls.lock().unwrap().push(call.clone());
        let fut = (self.behaviour)(ctx);
        let successes = self.successes.clone();
        Some(Box::pin(async move {
            let r = fut.await;
            if r.is_ok() {
                successes.lock().unwrap().push(call);
            }
            r
        }))
    }

    fn on_error(
        &self,
        error: &HandlerError,
        _ctx: &ChangeContext<Document>,
    ) -> Option<ErrorAction> {
        self.on_error.as_ref().map(|f| f(error))
    }
}

/// A definition for the probe with test-friendly defaults (no jitter, short delays), adjusted
/// by `f`. Leaked: tests are short-lived.
pub fn def(name: &'static str, f: impl FnOnce(&mut StreamDefinition)) -> &'static StreamDefinition {
    let mut d = DEFAULT_DEF.clone();
    d.name = name;
    d.retry = RetryConfig {
        max_attempts: 3,
        initial_delay_ms: 100,
        multiplier: 2.0,
        max_delay_ms: 1_000,
        jitter: false,
    };
    d.restart = RestartConfig {
        max_attempts: 0,
        initial_delay_ms: 100,
        max_delay_ms: 1_000,
    };
    d.checkpoint.save_interval_secs = 1;
    f(&mut d);
    Box::leak(Box::new(d))
}

/// Starts a runtime running only `probe` as `def`, on `backend`.
pub async fn start(
    backend: &MemoryBackend,
    probe: &Probe,
    def: &'static StreamDefinition,
) -> Runtime {
    start_with(backend, probe, def, |b| b).await
}

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

pub async fn start_with(
    backend: &MemoryBackend,
    probe: &Probe,
    def: &'static StreamDefinition,
    configure: impl FnOnce(flowwarden::Builder) -> flowwarden::Builder,
) -> Runtime {
    init_logs();
    let b = flowwarden::builder()
        .discover(false)
        .any_stream(AnyStream::with_definition(probe.clone(), def))
        .backend(backend.clone())
        .seed(7)
        .max_await(Duration::from_millis(200))
        .shutdown_timeout(Duration::from_secs(5));
    let rt = configure(b).start().await.expect("runtime starts");
    // A stream without a checkpoint starts at "now": wait until its cursor is open (or it
    // halted) before the test writes anything.
    wait_status(&rt, def.name, |s| {
        s.state != flowwarden::StreamState::Starting
    })
    .await;
    rt
}

/// Waits (in virtual or real time, bounded) until the stream's status satisfies `pred`.
pub async fn wait_status(
    rt: &Runtime,
    name: &str,
    pred: impl Fn(&StreamStatus) -> bool,
) -> StreamStatus {
    tokio::time::timeout(Duration::from_secs(60), rt.handle().wait_for(name, pred))
        .await
        .expect("status reached within 60 s")
        .expect("stream exists")
}

/// Waits until `cond` holds, polling (bounded).
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `_data` of the stored lastSeen / lastProcessed tokens of a stream.
pub fn stored_tokens(backend: &MemoryBackend, stream: &str) -> (Option<String>, Option<String>) {
    let Some(d) = backend.checkpoint_document(stream) else {
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

/// Inserts `{_id: i, n: i}` for each i.
pub fn insert_ids(backend: &MemoryBackend, ids: impl IntoIterator<Item = i32>) {
    let c = backend.collection("orders");
    for i in ids {
        c.insert_one(doc! {"_id": i, "n": i}).unwrap();
    }
}

/// The token `_data` of oplog entry `seq` on the in-memory backend.
pub fn token_of(seq: u64) -> String {
    format!("{seq:016X}")
}
