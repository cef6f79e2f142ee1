//! The orders example: one command, no setup.
//!
//! It runs an `orders` stream on the embedded in-memory backend, writes a few documents, shows
//! the handlers firing (one order is undecodable and goes to the dead-letter queue), stops,
//! writes more while the stream is down, starts again and shows that it resumed from its
//! checkpoint: only the changes made while it was down are handled. Then it exits 0.
//!
//! ```text
//! cargo run -p flowwarden-examples --bin orders
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Document};
use flowwarden::{
    change_stream, checkpoint, retry, ChangeContext, HandlerError, MemoryBackend, Runtime,
    StreamStatus,
};
use serde::Deserialize;

/// An order as stored in the `orders` collection.
#[derive(Debug, Deserialize)]
struct Order {
    #[serde(rename = "_id")]
    id: i32,
    customer: String,
    total_cents: i64,
    status: String,
}

/// The handlers of the `orders` stream. State is shared with `main` to print a summary.
#[derive(Default)]
struct OrderStream {
    revenue_cents: Arc<AtomicU64>,
}

#[change_stream(name = "orders", collection = "orders", document = Order, full_document = "updateLookup")]
#[checkpoint(save_every_n = 1, save_interval_secs = 1)]
#[retry(max_attempts = 3, initial_delay_ms = 50, jitter = false)]
impl OrderStream {
    /// Only paid or cancelled orders matter to this service; everything else is filtered on
    /// the server.
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

async fn start(backend: &MemoryBackend, revenue: &Arc<AtomicU64>) -> Runtime {
    flowwarden::builder()
        .stream(OrderStream {
            revenue_cents: revenue.clone(),
        })
        .backend(backend.clone())
        .shutdown_timeout(Duration::from_secs(5))
        .max_await(Duration::from_millis(100))
        .start()
        .await
        .unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        })
}

async fn wait(rt: &Runtime, what: &str, pred: impl Fn(&StreamStatus) -> bool) -> StreamStatus {
    match tokio::time::timeout(
        Duration::from_secs(10),
        rt.handle().wait_for("orders", pred),
    )
    .await
    {
        Ok(Ok(status)) => status,
        _ => {
            eprintln!("timed out waiting for: {what}");
            std::process::exit(1)
        }
    }
}

fn order(id: i32, customer: &str, total_cents: i64, status: &str) -> Document {
    doc! { "_id": id, "customer": customer, "total_cents": total_cents, "status": status }
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,flowwarden=info".into()),
        )
        .with_target(false)
        .init();

    let backend = MemoryBackend::new();
    let orders = backend.collection("orders");
    let revenue = Arc::new(AtomicU64::new(0));

    println!("== run 1: the stream starts with no checkpoint (at the current head)");
    let rt = start(&backend, &revenue).await;
    wait(&rt, "the stream to run", |s| {
        s.state == flowwarden::StreamState::Running
    })
    .await;
    let write = |r: Result<_, flowwarden::memory::MemoryError>| {
        r.unwrap_or_else(|e| {
            eprintln!("write failed: {e}");
            std::process::exit(1)
        })
    };
    write(orders.insert_one(order(1, "ada", 4_200, "PAID")).map(drop));
    write(orders.insert_one(order(2, "grace", 1_000, "NEW")).map(drop)); // filtered on the server
    write(
        orders
            .update_one(doc! {"_id": 2}, doc! {"$set": {"status": "PAID"}})
            .map(drop),
    );
    // total_cents is not a number: the document cannot be decoded into `Order`.
    write(
        orders
            .insert_one(doc! {"_id": 3, "customer": "bob", "total_cents": "lots", "status": "PAID"})
            .map(drop),
    );
    write(orders.delete_one(doc! {"_id": 1}).map(drop));
    let st = wait(&rt, "4 events settled", |s| {
        s.counters.handled + s.counters.dead_lettered >= 4
    })
    .await;
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
    let stored = backend.checkpoint_document("orders").unwrap_or_default();
    println!(
        "== stopped; checkpoint: lastProcessedToken = {}",
        stored
            .get("lastProcessedToken")
            .map(|t| t.to_string())
            .unwrap_or_default()
    );

    println!("== while the stream is down, two more orders are paid");
    write(orders.insert_one(order(4, "linus", 700, "PAID")).map(drop));
    write(
        orders
            .insert_one(order(5, "barbara", 300, "PAID"))
            .map(drop),
    );

    println!("== run 2: the stream resumes from its checkpoint");
    let rt = start(&backend, &revenue).await;
    let st = wait(&rt, "the 2 new orders", |s| s.counters.handled >= 2).await;
    rt.shutdown().await;
    println!(
        "== done: run 2 received {} events (only the new ones), handled {}; revenue {} cents",
        st.counters.received,
        st.counters.handled,
        revenue.load(Ordering::Relaxed)
    );
    if st.counters.received != 2 {
        eprintln!("expected run 2 to resume after the checkpoint");
        std::process::exit(1);
    }
}
