use flowwarden::{change_stream, checkpoint, retry, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders", fullDocument = "updateLookup")]
#[checkpoint(saveEveryN = 5)]
#[retry(backoff_ms = 200, save_interval_secs = 3)]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
