use flowwarden::{change_stream, ChangeContext};

#[derive(Default)]
struct Zero;

#[change_stream(collection = "orders", concurrency = 0)]
impl Zero {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

#[derive(Default)]
struct BoundBelowConcurrency;

#[change_stream(collection = "orders", concurrency = 8, max_in_flight = 4)]
impl BoundBelowConcurrency {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

#[derive(Default)]
struct ZeroBound;

#[change_stream(collection = "orders", concurrency = 2, max_in_flight = 0)]
impl ZeroBound {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

#[derive(Default)]
struct NotANumber;

#[change_stream(collection = "orders", concurrency = "eight")]
impl NotANumber {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
