//! `#[key]` methods returning every kind of `Hash` value; equal keys hash equally.
use std::hash::Hash;

use bson::doc;
use flowwarden::{change_stream, ChangeContext, ChangeEvent, StreamHandler};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Order {
    pub customer: String,
    pub shop: i32,
}

#[derive(Default)]
pub struct ByCustomer;

#[change_stream(collection = "orders", document = Order, concurrency = 8)]
impl ByCustomer {
    #[key]
    fn customer(&self, ctx: &ChangeContext<Order>) -> String {
        ctx.document().map(|o| o.customer.clone()).unwrap_or_default()
    }

    #[on_insert]
    async fn created(&self, _order: Order) {}
}

#[derive(Default)]
pub struct ByShop;

#[change_stream(collection = "orders", document = Order, concurrency = 2, max_in_flight = 4)]
impl ByShop {
    // Written by its path: #[change_stream] reads it all the same.
    #[flowwarden::key]
    fn shop(&self, ctx: &ChangeContext<Order>) -> u64 {
        ctx.document().map_or(0, |o| o.shop as u64)
    }

    #[on_insert]
    async fn created(&self, _order: Order) {}
}

#[derive(Default)]
pub struct ByPair;

#[change_stream(collection = "orders", document = Order, concurrency = 4)]
impl ByPair {
    #[key]
    fn pair(&self, ctx: &ChangeContext<Order>) -> (String, i32) {
        ctx.document()
            .map(|o| (o.customer.clone(), o.shop))
            .unwrap_or_default()
    }

    #[on_insert]
    async fn created(&self, _order: Order) {}
}

#[derive(Default)]
pub struct ByOptional;

#[change_stream(collection = "orders", document = Order, concurrency = 4)]
impl ByOptional {
    #[key]
    fn maybe(&self, ctx: &ChangeContext<Order>) -> Option<String> {
        ctx.document().map(|o| o.customer.clone())
    }

    #[on_insert]
    async fn created(&self, _order: Order) {}
}

#[derive(Default)]
pub struct Opaque;

#[change_stream(collection = "orders", concurrency = 4)]
impl Opaque {
    #[key]
    fn opaque(&self, ctx: &ChangeContext<bson::Document>) -> impl Hash {
        ctx.document()
            .and_then(|d| d.get_str("customer").ok())
            .map(str::to_owned)
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn ctx<T: serde::de::DeserializeOwned + 'static>(id: i32, customer: &str) -> ChangeContext<T> {
    let raw = doc! {
        "_id": { "_data": format!("{id:016X}") },
        "operationType": "insert",
        "ns": { "db": "shop", "coll": "orders" },
        "documentKey": { "_id": id },
        "fullDocument": { "_id": id, "customer": customer, "shop": 1 },
    };
    let event = ChangeEvent::from_raw(raw).expect("a valid event");
    ChangeContext::decode("test", event).expect("decodes")
}

fn main() {
    let s = ByCustomer;
    let a1 = s.key(&ctx(1, "ada"));
    let a2 = s.key(&ctx(2, "ada"));
    let b = s.key(&ctx(3, "bob"));
    assert!(a1.is_some());
    assert_eq!(a1, a2, "two documents of one customer share a key");
    assert_ne!(a1, b);
    assert!(ByShop.key(&ctx(1, "ada")).is_some());
    assert!(ByPair.key(&ctx(1, "ada")).is_some());
    assert!(ByOptional.key(&ctx(1, "ada")).is_some());
    assert_eq!(Opaque.key(&ctx(1, "ada")), Opaque.key(&ctx(9, "ada")));
}
