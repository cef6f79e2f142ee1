//! Test support shared by the runtime's tests (in-memory backend) and the MongoDB backend's
//! end-to-end tests: [`Probe`], a handler written without the macros whose behaviour each test
//! sets and which records every invocation, and [`probe_def`], a definition with test-friendly
//! settings. Each test crate adds what is particular to its backend around these.

pub mod conformance;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bson::{Bson, Document};
use flowwarden::SourceLocation;
use flowwarden::{
    ChangeContext, CheckpointConfig, ErrorAction, HandlerError, HandlerFuture, LagStatus,
    RestartConfig, RetryConfig, Runtime, StreamDefinition, StreamHandler, StreamStatus,
};
use futures::future::BoxFuture;
use futures::FutureExt;

/// One handler invocation, as the probe saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The operation type (`insert`, `update`, ...).
    pub op: String,
    /// The `_id` of the document key, when there is one.
    pub key: Option<Bson>,
    /// The resume token: its `_data`, or the whole token when it has none.
    pub token: String,
    /// The attempt number (1 for the first try).
    pub attempt: u32,
}

impl Call {
    /// What `ctx` shows of the invocation.
    pub fn of<T>(ctx: &ChangeContext<T>) -> Call {
        Call {
            op: ctx.operation_type().to_string(),
            key: ctx.document_key().and_then(|k| k.get("_id").cloned()),
            token: ctx.resume_token().to_string(),
            attempt: ctx.attempt(),
        }
    }
}

type Behaviour = Arc<
    dyn Fn(Arc<ChangeContext<Document>>) -> BoxFuture<'static, Result<(), HandlerError>>
        + Send
        + Sync,
>;
type FilterFn = Arc<dyn Fn(&ChangeContext<Document>) -> bool + Send + Sync>;
type OnErrorFn = Arc<dyn Fn(&HandlerError) -> ErrorAction + Send + Sync>;

/// A handler (like `#[on_change]`: it takes every operation) whose behaviour each test sets;
/// it records every invocation (successful or not) and every success.
#[derive(Clone)]
pub struct Probe {
    /// Every invocation, in order.
    pub calls: Arc<Mutex<Vec<Call>>>,
    /// Every successful invocation, in order.
    pub successes: Arc<Mutex<Vec<Call>>>,
    behaviour: Behaviour,
    filter: Option<FilterFn>,
    on_error: Option<OnErrorFn>,
    /// When set, only these operation types are routed to the handler (like a stream with
    /// `#[on_insert]` and no `#[on_change]`); the others are unrouted.
    routes: Option<Arc<[&'static str]>>,
}

impl Default for Probe {
    fn default() -> Self {
        Self::new(|_| async { Ok(()) }.boxed())
    }
}

fn read(list: &Mutex<Vec<Call>>) -> Vec<Call> {
    list.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

impl Probe {
    /// A probe whose handler runs `f`.
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
            routes: None,
        }
    }

    /// Routes only the operation types in `ops` (for example `["insert"]`); every other event
    /// is unrouted, as in a stream without `#[on_change]`.
    pub fn routing_only(mut self, ops: &[&'static str]) -> Self {
        self.routes = Some(ops.into());
        self
    }

    /// Adds a client-side filter (`#[filter]`).
    pub fn with_filter(
        mut self,
        f: impl Fn(&ChangeContext<Document>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.filter = Some(Arc::new(f));
        self
    }

    /// Adds an error policy (`#[on_error]`).
    pub fn with_on_error(
        mut self,
        f: impl Fn(&HandlerError) -> ErrorAction + Send + Sync + 'static,
    ) -> Self {
        self.on_error = Some(Arc::new(f));
        self
    }

    /// Every invocation so far.
    pub fn calls(&self) -> Vec<Call> {
        read(&self.calls)
    }

    /// Every successful invocation so far.
    pub fn successes(&self) -> Vec<Call> {
        read(&self.successes)
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

/// The probe's own definition; tests use [`probe_def`] instead.
pub static PROBE_DEF: StreamDefinition = StreamDefinition {
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
    concurrency: flowwarden::ConcurrencyConfig::DEFAULT,
    transactional: false,
    source: SourceLocation {
        file: file!(),
        line: line!(),
    },
};

impl StreamHandler for Probe {
    type Document = Document;

    fn definition() -> &'static StreamDefinition {
        &PROBE_DEF
    }

    fn filter(&self, ctx: &ChangeContext<Document>) -> bool {
        self.filter.as_ref().is_none_or(|f| f(ctx))
    }

    fn handle(self: Arc<Self>, ctx: Arc<ChangeContext<Document>>) -> Option<HandlerFuture> {
        if let Some(routes) = &self.routes {
            if !routes.contains(&ctx.operation_type().as_str()) {
                return None;
            }
        }
        let call = Call::of(&ctx);
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(call.clone());
        let fut = (self.behaviour)(ctx);
        let successes = self.successes.clone();
        Some(Box::pin(async move {
            let r = fut.await;
            if r.is_ok() {
                successes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(call);
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

/// A definition named `name` with test-friendly settings: retries and restarts without jitter
/// starting at `delay_ms` (at most ten times that), a heartbeat every second, no automatic
/// restart; then adjusted by `f`. Leaked: tests are short-lived.
pub fn probe_def(
    name: &'static str,
    delay_ms: u64,
    f: impl FnOnce(&mut StreamDefinition),
) -> &'static StreamDefinition {
    let mut d = PROBE_DEF.clone();
    d.name = name;
    d.retry = RetryConfig {
        max_attempts: 3,
        initial_delay_ms: delay_ms,
        multiplier: 2.0,
        max_delay_ms: delay_ms * 10,
        jitter: false,
    };
    d.restart = RestartConfig {
        max_attempts: 0,
        initial_delay_ms: delay_ms,
        max_delay_ms: delay_ms * 10,
    };
    d.checkpoint.save_interval_secs = 1;
    f(&mut d);
    Box::leak(Box::new(d))
}

/// Waits until the status of stream `name` satisfies `pred`; panics after `bound` (virtual
/// time under `tokio::time::pause`, real time otherwise).
pub async fn wait_status_within(
    rt: &Runtime,
    name: &str,
    bound: Duration,
    pred: impl Fn(&StreamStatus) -> bool,
) -> StreamStatus {
    tokio::time::timeout(bound, rt.handle().wait_for(name, pred))
        .await
        .unwrap_or_else(|_| panic!("status of '{name}' reached within {bound:?}"))
        .expect("stream exists")
}

/// The first lag sample of stream `name` taken after now; panics after `bound`.
pub async fn next_lag_sample_within(rt: &Runtime, name: &str, bound: Duration) -> LagStatus {
    let after = rt
        .handle()
        .status(name)
        .and_then(|s| s.lag)
        .map(|l| l.sampled_at);
    let s = wait_status_within(rt, name, bound, |s| {
        s.lag.as_ref().is_some_and(|l| Some(l.sampled_at) != after)
    })
    .await;
    s.lag.expect("a sample")
}

/// Waits until `cond` holds, polling every 10 ms; panics naming `what` after `bound`.
pub async fn wait_until_within(what: &str, bound: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + bound;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Logs to the test's output when `RUST_LOG` is set (`RUST_LOG=flowwarden=debug cargo test ..`);
/// silent otherwise. Safe to call from every test.
pub fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// A probe whose effect appends the event's document `_id` to `effects`, applied through
/// `dedup.once` (so an event applied before is skipped, and one whose effect failed is not).
pub fn applying_once(
    dedup: &flowwarden::dedup::Idempotency,
    effects: &Arc<Mutex<Vec<Bson>>>,
) -> Probe {
    let (dedup, effects) = (dedup.clone(), effects.clone());
    Probe::new(move |ctx| {
        let (dedup, effects) = (dedup.clone(), effects.clone());
        async move {
            dedup
                .once(&ctx, || async {
                    let key = ctx.document_key().and_then(|k| k.get("_id")).cloned();
                    effects
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .extend(key);
                    Ok::<(), HandlerError>(())
                })
                .await
        }
        .boxed()
    })
}
