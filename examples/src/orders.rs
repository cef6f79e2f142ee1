//! The orders example: a stream of paid orders, run twice to show that it resumes from its
//! checkpoint.
//!
//! Run 1 starts the stream, writes a few orders (one is undecodable and is dead-lettered),
//! and stops. While the stream is down, two more orders are paid. Run 2 starts the stream
//! again: it resumes from its checkpoint and handles exactly those two.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Document};
use flowwarden::{
    change_stream, checkpoint, retry, Backend, ChangeContext, HandlerError, MemoryBackend, Runtime,
    StreamStatus,
};
use flowwarden_rs_mongo::MongoBackend;
use serde::Deserialize;

/// An order as stored in the `orders` collection.
#[derive(Debug, Deserialize)]
pub struct Order {
    /// The order number.
    #[serde(rename = "_id")]
    pub id: i32,
    /// Who placed it.
    pub customer: String,
    /// Its total.
    pub total_cents: i64,
    /// `NEW`, `PAID`, `CANCELLED`...
    pub status: String,
}

/// The handlers of the `orders` stream. `revenue_cents` is shared with the caller.
#[derive(Default)]
pub struct OrderStream {
    revenue_cents: Arc<AtomicU64>,
}

#[change_stream(name = "orders", collection = "orders", document = Order, full_document = "updateLookup")]
#[checkpoint(save_every_n = 1, save_interval_secs = 1)]
#[retry(max_attempts = 3, initial_delay_ms = 50, jitter = false)]
impl OrderStream {
    /// Only paid or cancelled orders matter to this service; the rest is filtered on the
    /// server.
    #[pipeline]
    fn pipeline() -> Vec<Document> {
        vec![doc! { "$match": { "$or": [
            { "operationType": { "$in": ["delete", "drop", "rename", "invalidate"] } },
            { "fullDocument.status": { "$in": ["PAID", "CANCELLED"] } },
        ] } }]
    }

    #[on_insert]
    async fn created(&self, order: Order, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
        println!(
            "  [insert] order {} of {} ({}, {} cents) event {}",
            order.id,
            order.customer,
            order.status,
            order.total_cents,
            ctx.event_id()
        );
        self.book(&order);
        Ok(())
    }

    #[on_update]
    #[on_replace]
    async fn changed(&self, order: Order, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
        println!(
            "  [{}] order {} is now {}",
            ctx.operation_type(),
            order.id,
            order.status
        );
        self.book(&order);
        Ok(())
    }

    /// A plain `fn`: it runs on Tokio's blocking pool.
    #[on_delete]
    fn deleted(&self, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
        println!("  [delete] {:?}", ctx.document_key());
        Ok(())
    }
}

impl OrderStream {
    fn book(&self, order: &Order) {
        if order.status == "PAID" {
            let cents = u64::try_from(order.total_cents).unwrap_or(0);
            self.revenue_cents.fetch_add(cents, Ordering::Relaxed);
        }
    }
}

/// Where the example runs.
#[derive(Clone)]
pub enum Target {
    /// The embedded in-memory backend.
    Memory(MemoryBackend),
    /// A MongoDB replica set, through the official driver.
    Mongo(MongoBackend),
}

impl Target {
    /// MongoDB when `FLOWWARDEN_MONGODB_URI` is set (database `FLOWWARDEN_DATABASE`, default
    /// `flowwarden_example`), else a new in-memory backend; says which on stdout. The problems
    /// found when MongoDB cannot be used.
    pub async fn from_env() -> Result<Target, Vec<String>> {
        let Ok(uri) = std::env::var(flowwarden_rs_mongo::ENV_URI) else {
            println!(
                "backend: the embedded in-memory backend (set FLOWWARDEN_MONGODB_URI for MongoDB)"
            );
            return Ok(Target::Memory(MemoryBackend::new()));
        };
        let db =
            std::env::var("FLOWWARDEN_DATABASE").unwrap_or_else(|_| "flowwarden_example".into());
        println!(
            "backend: MongoDB ({}), database {db}",
            flowwarden_rs_mongo::redact_uri(&uri)
        );
        MongoBackend::connect(&uri, &db).await.map(Target::Mongo)
    }
}

/// Why the example failed.
#[derive(Debug, thiserror::Error)]
pub enum ExampleError {
    /// The runtime refused to start.
    #[error(transparent)]
    Startup(#[from] flowwarden::StartupError),
    /// A write to the orders collection failed.
    #[error("write failed: {0}")]
    Write(String),
    /// Something expected did not happen in time.
    #[error("timed out waiting for: {0}")]
    Timeout(&'static str),
    /// Run 2 did not resume where run 1 stopped.
    #[error("run 2 received {0} events; expected only the 2 written while the stream was down")]
    DidNotResume(u64),
}

/// What the two runs did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Events handled in run 1.
    pub run1_handled: u64,
    /// Events dead-lettered in run 1.
    pub run1_dead_lettered: u64,
    /// Events received in run 2 (only the new ones).
    pub run2_received: u64,
    /// Revenue booked over both runs.
    pub revenue_cents: u64,
}

impl Target {
    fn backend(&self) -> Backend {
        match self {
            Target::Memory(m) => m.clone().into(),
            Target::Mongo(m) => m.clone().into(),
        }
    }

    async fn write(&self, op: Write) -> Result<(), ExampleError> {
        let err = |e: &dyn std::fmt::Display| ExampleError::Write(e.to_string());
        match self {
            Target::Memory(m) => {
                let c = m.collection("orders");
                match op {
                    Write::Insert(d) => c.insert_one(d).map(drop),
                    Write::Update(f, u) => c.update_one(f, u).map(drop),
                    Write::Delete(f) => c.delete_one(f).map(drop),
                }
                .map_err(|e| err(&e))
            }
            Target::Mongo(m) => {
                let c = m
                    .client()
                    .database(m.database())
                    .collection::<Document>("orders");
                match op {
                    Write::Insert(d) => c.insert_one(d).await.map(drop),
                    Write::Update(f, u) => c.update_one(f, u).await.map(drop),
                    Write::Delete(f) => c.delete_one(f).await.map(drop),
                }
                .map_err(|e| err(&e))
            }
        }
    }
}

impl Target {
    /// Starts from a clean slate on MongoDB (the example's own collection, checkpoint and dead
    /// letters), so the example can run again on the same database.
    async fn reset(&self) -> Result<(), ExampleError> {
        let Target::Mongo(m) = self else {
            return Ok(());
        };
        let db = m.client().database(m.database());
        let err = |e: mongodb::error::Error| ExampleError::Write(e.to_string());
        db.collection::<Document>("orders")
            .drop()
            .await
            .map_err(err)?;
        db.collection::<Document>("_fw_checkpoints")
            .delete_many(doc! {"_id": "orders"})
            .await
            .map_err(err)?;
        db.collection::<Document>("_fw_dlq")
            .delete_many(doc! {"stream": "orders"})
            .await
            .map_err(err)?;
        Ok(())
    }
}

enum Write {
    Insert(Document),
    Update(Document, Document),
    Delete(Document),
}

async fn start(target: &Target, revenue: &Arc<AtomicU64>) -> Result<Runtime, ExampleError> {
    Ok(flowwarden::builder()
        .discover(false)
        .stream(OrderStream {
            revenue_cents: revenue.clone(),
        })
        .backend(target.backend())
        .shutdown_timeout(Duration::from_secs(5))
        .max_await(Duration::from_millis(100))
        .start()
        .await?)
}

async fn wait(
    rt: &Runtime,
    what: &'static str,
    pred: impl Fn(&StreamStatus) -> bool,
) -> Result<StreamStatus, ExampleError> {
    match tokio::time::timeout(
        Duration::from_secs(20),
        rt.handle().wait_for("orders", pred),
    )
    .await
    {
        Ok(Ok(status)) => Ok(status),
        _ => Err(ExampleError::Timeout(what)),
    }
}

fn order(id: i32, customer: &str, total_cents: i64, status: &str) -> Document {
    doc! { "_id": id, "customer": customer, "total_cents": total_cents, "status": status }
}

/// Runs the example on `target`.
pub async fn run(target: Target) -> Result<Summary, ExampleError> {
    let revenue = Arc::new(AtomicU64::new(0));
    target.reset().await?;

    println!("== run 1: the stream starts with no checkpoint (at the current head)");
    let rt = start(&target, &revenue).await?;
    wait(&rt, "the stream to run", |s| {
        s.state == flowwarden::StreamState::Running
    })
    .await?;
    target
        .write(Write::Insert(order(1, "ada", 4_200, "PAID")))
        .await?;
    target
        .write(Write::Insert(order(2, "grace", 1_000, "NEW")))
        .await?; // filtered on the server
    target
        .write(Write::Update(
            doc! {"_id": 2},
            doc! {"$set": {"status": "PAID"}},
        ))
        .await?;
    // `total_cents` is not a number: the document cannot be decoded into `Order`.
    target
        .write(Write::Insert(
            doc! {"_id": 3, "customer": "bob", "total_cents": "lots", "status": "PAID"},
        ))
        .await?;
    target.write(Write::Delete(doc! {"_id": 1})).await?;
    let st = wait(&rt, "4 events settled", |s| {
        s.counters.handled + s.counters.dead_lettered >= 4
    })
    .await?;
    println!(
        "   handled {}, dead-lettered {}, revenue {} cents",
        st.counters.handled,
        st.counters.dead_lettered,
        revenue.load(Ordering::Relaxed)
    );
    for r in rt
        .handle()
        .dead_letters()
        .list(&Default::default())
        .await
        .unwrap_or_default()
    {
        println!("   dead letter {}: {}", r.id, r.error_chain.join(": "));
    }
    rt.shutdown().await;
    println!("== stopped; its checkpoint is stored");

    println!("== while the stream is down, two more orders are paid");
    target
        .write(Write::Insert(order(4, "linus", 700, "PAID")))
        .await?;
    target
        .write(Write::Insert(order(5, "barbara", 300, "PAID")))
        .await?;

    println!("== run 2: the stream resumes from its checkpoint");
    let rt = start(&target, &revenue).await?;
    let st2 = wait(&rt, "the 2 new orders", |s| s.counters.handled >= 2).await?;
    // Give a wrongly replayed event the chance to show up before judging.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st2 = rt.handle().status("orders").unwrap_or(st2);
    rt.shutdown().await;
    let summary = Summary {
        run1_handled: st.counters.handled,
        run1_dead_lettered: st.counters.dead_lettered,
        run2_received: st2.counters.received,
        revenue_cents: revenue.load(Ordering::Relaxed),
    };
    println!(
        "== done: run 2 received {} events (only the new ones); revenue {} cents",
        summary.run2_received, summary.revenue_cents
    );
    if summary.run2_received != 2 {
        return Err(ExampleError::DidNotResume(summary.run2_received));
    }
    Ok(summary)
}
