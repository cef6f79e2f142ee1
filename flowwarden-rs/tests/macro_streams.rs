//! Streams declared with the macros, run end to end on the in-memory backend.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Document};
use flowwarden::{change_stream, ChangeContext, HandlerError, MemoryBackend, Runtime, StreamState};
use serde::Deserialize;

#[derive(Debug, Deserialize, PartialEq)]
struct Item {
    #[serde(rename = "_id")]
    id: i32,
    qty: i64,
}

#[derive(Default, Clone)]
struct Inventory {
    log: Arc<Mutex<Vec<String>>>,
}

#[change_stream(name = "inventory", collection = "items", document = Item, full_document = "whenAvailable", full_document_before_change = "whenAvailable")]
impl Inventory {
    #[on_insert]
    async fn added(&self, item: Item) -> Result<(), HandlerError> {
        self.push(format!("insert {} {}", item.id, item.qty));
        Ok(())
    }

    #[on_update]
    async fn changed(
        &self,
        item: Option<Item>,
        ctx: &ChangeContext<Item>,
    ) -> Result<(), HandlerError> {
        let before = ctx.document_before_change().map(|b| b.qty);
        self.push(format!(
            "update {:?} from {:?}",
            item.map(|i| i.qty),
            before
        ));
        Ok(())
    }

    /// Blocking: runs on the blocking pool.
    #[on_delete]
    fn removed(&self, ctx: &ChangeContext<Item>) {
        std::thread::sleep(Duration::from_millis(5));
        self.push(format!("delete {:?}", ctx.document_key()));
    }

    #[on_change]
    fn other(&self, ctx: &ChangeContext<Item>) {
        self.push(format!("other {}", ctx.operation_type()));
    }
}

impl Inventory {
    fn push(&self, s: String) {
        self.log.lock().unwrap().push(s);
    }
}

async fn start(backend: &MemoryBackend, stream: Inventory) -> Runtime {
    let rt = flowwarden::builder()
        .discover(false)
        .stream(stream)
        .backend(backend.clone())
        .max_await(Duration::from_millis(50))
        .start()
        .await
        .expect("starts");
    tokio::time::timeout(
        Duration::from_secs(10),
        rt.handle()
            .wait_for("inventory", |s| s.state == StreamState::Running),
    )
    .await
    .unwrap()
    .unwrap();
    rt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_handlers_route_decode_and_see_images() {
    let backend = MemoryBackend::new();
    let stream = Inventory::default();
    let rt = start(&backend, stream.clone()).await;
    let items = backend.collection("items");
    items.insert_one(doc! {"_id": 1, "qty": 5}).unwrap();
    items
        .update_one(doc! {"_id": 1}, doc! {"$inc": {"qty": 2}})
        .unwrap();
    items.delete_one(doc! {"_id": 1}).unwrap();
    items.drop_collection();
    let st = tokio::time::timeout(
        Duration::from_secs(10),
        rt.handle().wait_for("inventory", |s| s.halt.is_some()),
    )
    .await
    .unwrap()
    .unwrap();
    rt.shutdown().await;
    assert_eq!(
        *stream.log.lock().unwrap(),
        [
            "insert 1 5",
            "update Some(7) from Some(5)",
            "delete Some(Document({\"_id\": Int32(1)}))",
            "other drop",
            "other invalidate",
        ]
    );
    assert_eq!(st.halt.unwrap().runbook, "docs/runbooks/invalidate.md");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_document_is_dead_lettered_and_the_stream_goes_on() {
    let backend = MemoryBackend::new();
    let stream = Inventory::default();
    let rt = start(&backend, stream.clone()).await;
    let items = backend.collection("items");
    items.insert_one(doc! {"_id": 1, "qty": "many"}).unwrap();
    items.insert_one(doc! {"_id": 2, "qty": 3}).unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        rt.handle().wait_for("inventory", |s| {
            s.counters.handled == 1 && s.counters.dead_lettered == 1
        }),
    )
    .await
    .unwrap()
    .unwrap();
    let dead = rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap();
    rt.shutdown().await;
    assert_eq!(*stream.log.lock().unwrap(), ["insert 2 3"]);
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error_kind, "Decode");
    assert_eq!(dead[0].attempts, 1, "a decode failure is not retried");
    assert!(
        dead[0].error_chain.join(": ").contains("many"),
        "{:?}",
        dead[0].error_chain
    );
    assert_eq!(
        dead[0].event.get_document("fullDocument").unwrap(),
        &doc! {"_id": 1, "qty": "many"}
    );
}

#[derive(Default)]
struct Unfiltered;

#[change_stream(collection = "raw")]
impl Unfiltered {
    #[pipeline]
    fn pipeline() -> Vec<Document> {
        vec![doc! {"$match": {"fullDocument.keep": true}}]
    }

    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<Document>) -> Result<(), HandlerError> {
        Err(HandlerError::msg(
            "should not be called for filtered events",
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_side_pipeline_filters_before_the_handler() {
    let backend = MemoryBackend::new();
    let rt = flowwarden::builder()
        .discover(false)
        .stream(Unfiltered)
        .backend(backend.clone())
        .max_await(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        rt.handle()
            .wait_for("unfiltered", |s| s.state == StreamState::Running),
    )
    .await
    .unwrap()
    .unwrap();
    backend
        .collection("raw")
        .insert_one(doc! {"_id": 1, "keep": false})
        .unwrap();
    backend
        .collection("raw")
        .insert_one(doc! {"_id": 2, "keep": true})
        .unwrap();
    let st = tokio::time::timeout(
        Duration::from_secs(10),
        rt.handle()
            .wait_for("unfiltered", |s| s.counters.dead_lettered == 1),
    )
    .await
    .unwrap()
    .unwrap();
    rt.shutdown().await;
    assert_eq!(
        st.counters.received, 1,
        "only the matching insert reached the runtime"
    );
}
