use flowwarden::change_stream;
use serde::Deserialize;

#[derive(Deserialize)]
pub struct Order {
    pub status: String,
}

pub struct Orders;

#[change_stream(collection = "orders", document = Order)]
impl Orders {
    #[on_delete]
    fn deleted(&self, order: Option<Order>) {
        let _ = order;
    }

    #[on_change]
    fn rest(&self, order: Order) {
        let _ = order;
    }
}

fn main() {}
