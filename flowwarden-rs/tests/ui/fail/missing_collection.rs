use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(name = "orders")]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
