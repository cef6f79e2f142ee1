use flowwarden::{change_stream, checkpoint, retry, ChangeContext};

pub struct Orders;

#[change_stream(collection = orders, enabled = "yes")]
#[checkpoint(save_every_n = "5", start_position = Earliest)]
#[retry(jitter = 1, multiplier = "fast")]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
