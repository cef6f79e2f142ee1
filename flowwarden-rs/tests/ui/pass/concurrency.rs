use flowwarden::{change_stream, ChangeContext, ConcurrencyConfig, StreamHandler};

#[derive(Default)]
struct Serial;

#[change_stream(collection = "orders")]
impl Serial {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

#[derive(Default)]
struct Keyed;

#[change_stream(collection = "orders", concurrency = 8)]
impl Keyed {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

#[derive(Default)]
struct Bounded;

#[change_stream(collection = "orders", concurrency = 4, max_in_flight = 100)]
impl Bounded {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {
    let serial = <Serial as StreamHandler>::definition().concurrency;
    assert_eq!(serial, ConcurrencyConfig::DEFAULT);
    assert_eq!((serial.concurrency(), serial.max_in_flight()), (1, 4));
    let keyed = <Keyed as StreamHandler>::definition().concurrency;
    assert_eq!((keyed.concurrency(), keyed.max_in_flight()), (8, 32));
    let bounded = <Bounded as StreamHandler>::definition().concurrency;
    assert_eq!((bounded.concurrency(), bounded.max_in_flight()), (4, 100));
}
