use flowwarden::{change_stream, ChangeContext};

#[derive(Clone)]
pub struct MyTransaction;

pub struct WrongHandle;

#[change_stream(collection = "orders", transactional = true)]
impl WrongHandle {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>, _tx: &MyTransaction) {}
}

fn main() {}
