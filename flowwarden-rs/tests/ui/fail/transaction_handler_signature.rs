use flowwarden::{change_stream, ChangeContext, MemoryTransaction};

pub struct Blocking;

#[change_stream(collection = "orders", transactional = true)]
impl Blocking {
    #[on_insert]
    fn created(&self, _ctx: &ChangeContext<bson::Document>, _tx: &MemoryTransaction) {}
}

pub struct NotLast;

#[change_stream(collection = "orders", transactional = true)]
impl NotLast {
    #[on_insert]
    async fn created(&self, _tx: &MemoryTransaction, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
