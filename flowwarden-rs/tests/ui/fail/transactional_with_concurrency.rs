use flowwarden::{change_stream, ChangeContext};

pub struct Concurrent;

#[change_stream(collection = "orders", transactional = true, concurrency = 8)]
impl Concurrent {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
