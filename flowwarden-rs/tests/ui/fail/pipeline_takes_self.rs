use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[pipeline]
    fn pipeline(&self) -> Vec<bson::Document> {
        Vec::new()
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
