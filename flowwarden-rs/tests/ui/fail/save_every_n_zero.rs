use flowwarden::{change_stream, checkpoint, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
#[checkpoint(save_every_n = 0)]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
