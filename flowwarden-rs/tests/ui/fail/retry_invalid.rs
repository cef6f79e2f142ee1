use flowwarden::{change_stream, retry, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
#[retry(max_attempts = 0, multiplier = 0.5, initial_delay_ms = 5000, max_delay_ms = 1000)]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
