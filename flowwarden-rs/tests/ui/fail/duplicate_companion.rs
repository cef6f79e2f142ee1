use flowwarden::{change_stream, checkpoint, ChangeContext};

pub struct Orders;

#[checkpoint(save_every_n = 5)]
#[change_stream(collection = "orders")]
#[checkpoint(save_interval_secs = 10)]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
