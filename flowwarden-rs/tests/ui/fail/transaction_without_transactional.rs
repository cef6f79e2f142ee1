use flowwarden::{change_stream, ChangeContext, MemoryTransaction};

pub struct NotTransactional;

#[change_stream(collection = "orders")]
impl NotTransactional {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>, _tx: &MemoryTransaction) {}
}

fn main() {}
