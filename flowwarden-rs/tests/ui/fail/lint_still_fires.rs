#![deny(unused_variables, unused_mut)]
use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[on_insert]
    async fn created(&self, ctx: &ChangeContext<bson::Document>) {
        let mut unused = 1;
    }
}

fn main() {}
