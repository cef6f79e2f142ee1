use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[on_insert]
    async fn created(&self, doc: bson::Document, _ctx: &ChangeContext<bson::Document>) {
        let _ = doc;
    }
}

fn main() {}
