//! One mistake, one error: the impl is still emitted (so its methods exist) and a placeholder
//! `StreamHandler` impl stands in (so code using the type as a stream still type-checks).
use flowwarden::{change_stream, ChangeContext, StreamHandler};

#[derive(Default)]
pub struct Orders;

#[change_stream(collection = "orders", save_every_n = 5)]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}

    pub fn helper(&self) -> u32 {
        1
    }
}

fn main() {
    let _ = Orders.helper();
    let _ = <Orders as StreamHandler>::definition();
}
