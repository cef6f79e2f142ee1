use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders", colour = "blue")]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
