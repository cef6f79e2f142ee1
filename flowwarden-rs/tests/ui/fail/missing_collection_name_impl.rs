use flowwarden::{change_stream, ChangeContext};
use serde::Deserialize;

#[derive(Deserialize)]
pub struct Order {
    pub status: String,
}

pub struct Orders;

#[change_stream(document = Order)]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<Order>) {}
}

fn main() {}
