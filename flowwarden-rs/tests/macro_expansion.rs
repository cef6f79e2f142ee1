//! Runtime-free tests of the code `#[change_stream]` generates: the static definition, the
//! routing of `StreamHandler::handle`, the filter, the error hook, the pipeline and the
//! registration. Handlers are called directly, with contexts decoded from raw events.

use std::any::TypeId;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use bson::{doc, Document};
use flowwarden::__private::{inventory, Registration};
use flowwarden::{
    change_stream, checkpoint, restart, retry, ChangeContext, ChangeEvent, CheckpointConfig,
    CollectionName, ErrorAction, FullDocument, FullDocumentBeforeChange, HandlerError,
    HandlerErrorKind, OnHistoryLost, RestartConfig, ResumeStrategy, RetryConfig, StartPosition,
    StreamHandler,
};
use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct Order {
    status: String,
}

impl CollectionName for Order {
    const COLLECTION: &'static str = "orders-from-type";
}

/// Every default; no `Default` impl, so the runtime cannot build it by itself.
struct PlainDefaults {
    _not_default: u8,
}

#[change_stream(collection = "plain")]
impl PlainDefaults {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<Document>) {}
}

/// Every key overridden; records which method ran.
#[derive(Default)]
struct Router {
    calls: Mutex<Vec<String>>,
    blocking_thread: Mutex<Option<ThreadId>>,
}

impl Router {
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

#[change_stream(
    name = "router",
    collection = "orders",
    database = "shop",
    document = Order,
    full_document = "updateLookup",
    full_document_before_change = "whenAvailable",
    enabled = false,
    auto_start = false
)]
#[checkpoint(save_every_n = 10, start_position = Latest, on_history_lost = ResumeFromOplogStart)]
#[retry(max_attempts = 7, multiplier = 1.5, jitter = false)]
#[restart(max_delay_ms = 5000)]
impl Router {
    #[on_insert]
    async fn inserted(&self, order: Order, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
        self.record(format!("insert:{}:{}", order.status, ctx.stream_name()));
        Ok(())
    }

    #[on_update]
    #[on_replace]
    async fn changed(&self, order: Option<Order>, ctx: &ChangeContext<Order>) {
        let status = order.map_or_else(|| "none".to_owned(), |o| o.status);
        self.record(format!("changed:{}:{status}", ctx.operation_type()));
    }

    #[on_delete]
    fn deleted(&self, ctx: &ChangeContext<Order>) -> Result<(), std::io::Error> {
        *self.blocking_thread.lock().unwrap() = Some(std::thread::current().id());
        let key = ctx.document_key().and_then(|k| k.get_i32("_id").ok());
        self.record(format!("delete:{key:?}"));
        if key == Some(13) {
            return Err(std::io::Error::other("unlucky"));
        }
        Ok(())
    }

    #[on_change]
    fn other(&self, ctx: &ChangeContext<Order>) {
        self.record(format!("change:{}", ctx.operation_type()));
    }
}

/// A filter, an error hook and a pipeline; no catch-all.
#[derive(Default)]
struct Filtered;

#[change_stream(collection = "filtered")]
impl Filtered {
    #[pipeline]
    fn stages() -> Vec<Document> {
        vec![doc! { "$match": { "operationType": "insert" } }]
    }

    #[filter]
    fn only_paid(&self, ctx: &ChangeContext<Document>) -> bool {
        ctx.document().and_then(|d| d.get_str("status").ok()) == Some("PAID")
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<Document>) -> Result<(), HandlerError> {
        Err(HandlerError::msg("boom"))
    }

    #[on_error]
    fn decide(&self, error: &HandlerError, ctx: &ChangeContext<Document>) -> ErrorAction {
        if error.to_string() == "boom" && ctx.attempt() == 1 {
            ErrorAction::Skip
        } else {
            ErrorAction::Halt
        }
    }
}

/// The collection comes from the document type.
#[derive(Default)]
struct FromDocumentType;

#[change_stream(document = Order)]
impl FromDocumentType {
    #[on_replace]
    async fn replaced(&self, _order: Order) {}
}

fn context<T: serde::de::DeserializeOwned + 'static>(
    stream: &'static str,
    raw: Document,
) -> ChangeContext<T> {
    let event = ChangeEvent::from_raw(raw).expect("valid raw event");
    ChangeContext::decode(stream, event).expect("decodable event")
}

fn event(op: &str) -> Document {
    doc! { "_id": { "_data": format!("{op}-token") }, "operationType": op, "ns": { "db": "shop", "coll": "orders" } }
}

fn with_document(op: &str, status: &str) -> Document {
    let mut raw = event(op);
    raw.insert("fullDocument", doc! { "_id": 1, "status": status });
    raw
}

async fn run<H: StreamHandler>(
    handler: &Arc<H>,
    raw: Document,
) -> Option<Result<(), HandlerError>> {
    let ctx: ChangeContext<H::Document> = context(H::definition().name, raw);
    let fut = Arc::clone(handler).handle(Arc::new(ctx))?;
    Some(fut.await)
}

#[test]
fn defaults_fill_every_unwritten_key() {
    let def = PlainDefaults::definition();
    assert_eq!(def.name, "plain-defaults", "kebab-case default name");
    assert_eq!(def.type_name, "PlainDefaults");
    assert_eq!(def.collection, "plain");
    assert_eq!(def.database, None);
    assert_eq!(def.full_document, FullDocument::Default);
    assert_eq!(
        def.full_document_before_change,
        FullDocumentBeforeChange::Off
    );
    assert!(def.enabled);
    assert!(def.auto_start);
    assert_eq!(def.checkpoint, CheckpointConfig::DEFAULT);
    assert_eq!(def.retry, RetryConfig::DEFAULT);
    assert_eq!(def.restart, RestartConfig::DEFAULT);
    assert!(
        def.source.file.ends_with("macro_expansion.rs"),
        "{}",
        def.source
    );
    assert!(def.source.line > 0);
    assert!(<PlainDefaults as StreamHandler>::pipeline().is_empty());
    let _ = PlainDefaults { _not_default: 0 };
}

#[test]
fn written_keys_override_defaults() {
    let def = Router::definition();
    assert_eq!(def.name, "router");
    assert_eq!(def.collection, "orders");
    assert_eq!(def.database, Some("shop"));
    assert_eq!(def.full_document, FullDocument::UpdateLookup);
    assert_eq!(
        def.full_document_before_change,
        FullDocumentBeforeChange::WhenAvailable
    );
    assert!(!def.enabled);
    assert!(!def.auto_start);
    assert_eq!(
        def.checkpoint,
        CheckpointConfig {
            save_every_n: 10,
            start_position: StartPosition::Latest,
            on_history_lost: OnHistoryLost::ResumeFromOplogStart,
            ..CheckpointConfig::DEFAULT
        }
    );
    assert_eq!(
        def.checkpoint.resume_strategy,
        ResumeStrategy::ProcessedFirst
    );
    assert_eq!(
        def.retry,
        RetryConfig {
            max_attempts: 7,
            multiplier: 1.5,
            jitter: false,
            ..RetryConfig::DEFAULT
        }
    );
    assert_eq!(
        def.restart,
        RestartConfig {
            max_delay_ms: 5000,
            ..RestartConfig::DEFAULT
        }
    );
}

#[test]
fn collection_defaults_to_the_document_types() {
    let def = FromDocumentType::definition();
    assert_eq!(def.collection, "orders-from-type");
    assert_eq!(def.name, "from-document-type");
}

#[tokio::test]
async fn insert_routes_to_on_insert_with_the_decoded_document() {
    let router = Arc::new(Router::default());
    let result = run(&router, with_document("insert", "PAID")).await;
    assert!(matches!(result, Some(Ok(()))), "{result:?}");
    assert_eq!(router.calls(), vec!["insert:PAID:router"]);
}

#[tokio::test]
async fn missing_document_for_a_t_parameter_fails_the_event() {
    let router = Arc::new(Router::default());
    let result = run(&router, event("insert")).await.expect("handled");
    assert_eq!(
        result.unwrap_err().kind(),
        HandlerErrorKind::MissingDocument
    );
    assert!(router.calls().is_empty(), "the handler must not run");
}

#[tokio::test]
async fn stacked_update_and_replace_reach_the_same_method() {
    let router = Arc::new(Router::default());
    run(&router, event("update"))
        .await
        .expect("handled")
        .unwrap();
    run(&router, with_document("replace", "NEW"))
        .await
        .expect("handled")
        .unwrap();
    assert_eq!(
        router.calls(),
        vec!["changed:update:none", "changed:replace:NEW"]
    );
}

#[tokio::test]
async fn unhandled_operations_go_to_the_catch_all() {
    let router = Arc::new(Router::default());
    for op in [
        "drop",
        "rename",
        "dropDatabase",
        "invalidate",
        "createIndexes",
    ] {
        run(&router, event(op)).await.expect("handled").unwrap();
    }
    assert_eq!(
        router.calls(),
        vec![
            "change:drop",
            "change:rename",
            "change:dropDatabase",
            "change:invalidate",
            "change:createIndexes"
        ]
    );
}

#[tokio::test]
async fn plain_fn_handler_runs_on_the_blocking_pool() {
    let router = Arc::new(Router::default());
    let mut raw = event("delete");
    raw.insert("documentKey", doc! { "_id": 7 });
    run(&router, raw).await.expect("handled").unwrap();
    assert_eq!(router.calls(), vec!["delete:Some(7)"]);
    let ran_on = router
        .blocking_thread
        .lock()
        .unwrap()
        .expect("delete handler ran");
    assert_ne!(
        ran_on,
        std::thread::current().id(),
        "must not run on the async worker"
    );

    let mut raw = event("delete");
    raw.insert("documentKey", doc! { "_id": 13 });
    let err = run(&router, raw).await.expect("handled").unwrap_err();
    assert_eq!(
        err.chain(),
        vec!["unlucky".to_owned()],
        "the user's error converts"
    );
}

#[tokio::test]
async fn operations_without_handler_or_catch_all_are_not_taken() {
    let filtered = Arc::new(Filtered);
    assert!(run(&filtered, event("update")).await.is_none());
    assert!(run(&filtered, event("delete")).await.is_none());
    assert!(run(&filtered, event("drop")).await.is_none());
    let result = run(&filtered, with_document("insert", "PAID")).await;
    assert_eq!(
        result.expect("insert handled").unwrap_err().to_string(),
        "boom"
    );
}

#[test]
fn filter_pipeline_and_on_error_are_wired() {
    let filtered = Filtered;
    let paid: ChangeContext<Document> = context("filtered", with_document("insert", "PAID"));
    let open: ChangeContext<Document> = context("filtered", with_document("insert", "OPEN"));
    assert!(StreamHandler::filter(&filtered, &paid));
    assert!(!StreamHandler::filter(&filtered, &open));

    assert_eq!(
        <Filtered as StreamHandler>::pipeline(),
        vec![doc! { "$match": { "operationType": "insert" } }]
    );

    let boom = HandlerError::msg("boom");
    assert_eq!(
        StreamHandler::on_error(&filtered, &boom, &paid),
        Some(ErrorAction::Skip)
    );
    let other = HandlerError::msg("other");
    assert_eq!(
        StreamHandler::on_error(&filtered, &other, &paid),
        Some(ErrorAction::Halt)
    );
}

#[test]
fn without_hooks_the_trait_defaults_apply() {
    let router = Router::default();
    let ctx: ChangeContext<Order> = context("router", with_document("insert", "X"));
    assert!(
        StreamHandler::filter(&router, &ctx),
        "no #[filter]: every event passes"
    );
    assert_eq!(
        StreamHandler::on_error(&router, &HandlerError::msg("x"), &ctx),
        None
    );
    assert!(<Router as StreamHandler>::pipeline().is_empty());
    assert_eq!(
        StreamHandler::key(&router, &ctx),
        None,
        "no #[key]: ordered by documentKey"
    );
}

/// Keyed by the document's status.
#[derive(Default)]
struct ByStatus;

#[change_stream(collection = "orders", document = Order, concurrency = 4)]
impl ByStatus {
    #[key]
    fn status(&self, ctx: &ChangeContext<Order>) -> Option<String> {
        ctx.document().map(|o| o.status.clone())
    }

    #[on_insert]
    async fn created(&self, _order: Order) {}
}

#[test]
fn the_key_method_hashes_the_users_value() {
    let s = ByStatus;
    let key = |status: &str| {
        let ctx: ChangeContext<Order> = context("by-status", with_document("insert", status));
        StreamHandler::key(&s, &ctx)
    };
    let paid = key("PAID");
    assert!(paid.is_some());
    assert_eq!(paid, key("PAID"), "equal values, equal hashes");
    assert_ne!(paid, key("OPEN"));
    let none: ChangeContext<Order> = context("by-status", event("delete"));
    assert_eq!(
        StreamHandler::key(&s, &none),
        Some(flowwarden::__private::EventKeyHash::event_key_hash(
            &None::<String>
        )),
        "the method decides for events without a document too: here `None`, hashed"
    );
    assert_eq!(ByStatus::definition().concurrency.concurrency(), 4);
}

fn registration(name: &str) -> &'static Registration {
    let mut found = inventory::iter::<Registration>
        .into_iter()
        .filter(|r| (r.definition)().name == name);
    let first = found
        .next()
        .unwrap_or_else(|| panic!("`{name}` is not registered"));
    assert!(found.next().is_none(), "`{name}` is registered twice");
    first
}

#[test]
fn streams_are_registered_with_their_builders() {
    let plain = registration("plain-defaults");
    assert!(
        (plain.build_default)().is_none(),
        "no Default: the builder must supply it"
    );
    assert_eq!((plain.type_id)(), TypeId::of::<PlainDefaults>());

    let router = registration("router");
    let built = (router.build_default)().expect("Default: built by the runtime");
    assert_eq!(built.definition().name, "router");
    assert_eq!((router.type_id)(), TypeId::of::<Router>());

    for name in ["filtered", "from-document-type"] {
        let _ = registration(name);
    }
}
