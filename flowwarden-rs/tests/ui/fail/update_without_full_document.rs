use flowwarden::{change_stream, ChangeContext};
use serde::Deserialize;

#[derive(Deserialize)]
pub struct Order {
    pub status: String,
}

pub struct Orders;

#[change_stream(collection = "orders", document = Order)]
impl Orders {
    #[on_insert]
    #[on_update]
    async fn changed(&self, order: Order, _ctx: &ChangeContext<Order>) {
        let _ = order.status;
    }
}

fn main() {}
