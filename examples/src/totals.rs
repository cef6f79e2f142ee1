//! The totals example: exactly-once effects with a transactional stream.
//!
//! A `transactional = true` stream projects paid orders into a `totals` collection (orders and
//! cents per customer). Each event's `$inc` and the checkpoint past the event commit in one
//! transaction, so the totals count every order exactly once, even across restarts. The run
//! starts the stream, pays six orders, stops; then starts it again, pays two more, and checks
//! that the totals match the orders exactly (no order counted twice, none missed).
//!
//! The handler's transaction handle is the backend's own type: `&flowwarden_rs_mongo::Transaction`
//! on MongoDB, `&flowwarden::MemoryTransaction` on the in-memory backend, so the example has one
//! stream for each (see `docs/exactly-once.md`).

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, Document};
use flowwarden::{
    change_stream, checkpoint, AnyStream, Backend, ChangeContext, HandlerError, MemoryTransaction,
    Runtime,
};
use flowwarden_rs_mongo::Transaction;
use futures::TryStreamExt;
use serde::Deserialize;

use crate::orders::{ExampleError, Target};

/// A paid order.
#[derive(Debug, Deserialize)]
pub struct PaidOrder {
    /// Who placed it.
    pub customer: String,
    /// Its total.
    pub total_cents: i64,
}

/// The update one order makes to its customer's totals.
fn increment(order: &PaidOrder) -> (Document, Document) {
    (
        doc! {"_id": &order.customer},
        doc! {"$inc": {"orders": 1, "cents": order.total_cents}},
    )
}

/// The totals stream on MongoDB: the `$inc` goes through the transaction's session.
#[derive(Default)]
pub struct TotalsOnMongo;

#[change_stream(name = "order-totals", collection = "orders", document = PaidOrder,
                transactional = true)]
#[checkpoint(save_interval_secs = 1)]
impl TotalsOnMongo {
    #[on_insert]
    async fn paid(&self, order: PaidOrder, tx: &Transaction) -> Result<(), HandlerError> {
        let (filter, update) = increment(&order);
        tx.collection::<Document>("totals")
            .update_one(filter, update)
            .upsert(true)
            .session(&mut *tx.session().await)
            .await?;
        Ok(())
    }
}

/// The same stream on the in-memory backend.
#[derive(Default)]
pub struct TotalsInMemory;

#[change_stream(name = "order-totals-in-memory", collection = "orders", document = PaidOrder,
                transactional = true)]
#[checkpoint(save_interval_secs = 1)]
impl TotalsInMemory {
    #[on_insert]
    async fn paid(
        &self,
        order: PaidOrder,
        ctx: &ChangeContext<PaidOrder>,
        tx: &MemoryTransaction,
    ) -> Result<(), HandlerError> {
        let (filter, update) = increment(&order);
        tx.upsert_one("totals", filter, update)?;
        println!(
            "  [paid] {} cents by {} ({})",
            order.total_cents,
            order.customer,
            ctx.event_id()
        );
        Ok(())
    }
}

/// Orders and cents per customer, as the `totals` collection holds them.
pub type Totals = BTreeMap<String, (i32, i64)>;

const ORDERS: [(&str, i64); 8] = [
    ("ada", 1_200),
    ("bob", 700),
    ("ada", 300),
    ("cy", 5_000),
    ("bob", 1_100),
    ("ada", 250),
    ("cy", 40),
    ("bob", 10),
];

/// What the orders add up to, computed directly.
pub fn expected() -> Totals {
    let mut t = Totals::new();
    for (customer, cents) in ORDERS {
        let e = t.entry(customer.to_owned()).or_default();
        e.0 += 1;
        e.1 += cents;
    }
    t
}

fn stream_for(target: &Target) -> (AnyStream, Backend) {
    match target {
        Target::Memory(m) => (AnyStream::new(TotalsInMemory), m.clone().into()),
        Target::Mongo(m) => (AnyStream::new(TotalsOnMongo), m.clone().into()),
    }
}

async fn start(target: &Target) -> Result<(Runtime, &'static str), ExampleError> {
    let (stream, backend) = stream_for(target);
    let name = stream.definition().name;
    let rt = flowwarden::builder()
        .discover(false)
        .any_stream(stream)
        .backend(backend)
        .max_await(Duration::from_millis(200))
        .start()
        .await?;
    wait(&rt, name, "the stream to start", |s| {
        s.state == flowwarden::StreamState::Running
    })
    .await?;
    Ok((rt, name))
}

async fn wait(
    rt: &Runtime,
    name: &str,
    what: &'static str,
    pred: impl Fn(&flowwarden::StreamStatus) -> bool,
) -> Result<(), ExampleError> {
    match tokio::time::timeout(Duration::from_secs(30), rt.handle().wait_for(name, pred)).await {
        Ok(Ok(_)) => Ok(()),
        _ => Err(ExampleError::Timeout(what)),
    }
}

async fn pay(target: &Target, orders: &[(&str, i64)]) -> Result<(), ExampleError> {
    for (customer, cents) in orders {
        let order = doc! {"customer": *customer, "total_cents": *cents};
        match target {
            Target::Memory(m) => m
                .collection("orders")
                .insert_one(order)
                .map(|_| ())
                .map_err(|e| ExampleError::Write(e.to_string()))?,
            Target::Mongo(m) => m
                .client()
                .database(m.database())
                .collection::<Document>("orders")
                .insert_one(order)
                .await
                .map(|_| ())
                .map_err(|e| ExampleError::Write(e.to_string()))?,
        }
    }
    Ok(())
}

async fn totals(target: &Target) -> Result<Totals, ExampleError> {
    let docs: Vec<Document> = match target {
        Target::Memory(m) => m
            .collection("totals")
            .find(doc! {})
            .map_err(|e| ExampleError::Write(e.to_string()))?,
        Target::Mongo(m) => m
            .client()
            .database(m.database())
            .collection::<Document>("totals")
            .find(doc! {})
            .await
            .map_err(|e| ExampleError::Write(e.to_string()))?
            .try_collect()
            .await
            .map_err(|e| ExampleError::Write(e.to_string()))?,
    };
    Ok(docs
        .into_iter()
        .filter_map(|d| {
            Some((
                d.get_str("_id").ok()?.to_owned(),
                (d.get_i32("orders").ok()?, d.get_i64("cents").ok()?),
            ))
        })
        .collect())
}

/// Runs the example: six orders, a restart, two more; returns the totals (which must equal
/// [`expected`]).
pub async fn run(target: Target) -> Result<Totals, ExampleError> {
    let (first, second) = ORDERS.split_at(6);
    println!("run 1: paying {} orders", first.len());
    let (rt, name) = start(&target).await?;
    pay(&target, first).await?;
    wait(&rt, name, "run 1's orders", |s| s.counters.handled == 6).await?;
    rt.shutdown().await;
    println!("run 2: the stream restarts from the checkpoint its last commit wrote");
    let (rt, name) = start(&target).await?;
    pay(&target, second).await?;
    wait(&rt, name, "run 2's orders", |s| s.counters.handled == 2).await?;
    rt.shutdown().await;
    let totals = totals(&target).await?;
    for (customer, (orders, cents)) in &totals {
        println!("  {customer}: {orders} orders, {cents} cents");
    }
    if totals != expected() {
        return Err(ExampleError::Write(format!(
            "the totals {totals:?} do not match the orders {:?}",
            expected()
        )));
    }
    println!("every order counted exactly once");
    Ok(totals)
}
