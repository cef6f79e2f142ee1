use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders", concurrency = 4)]
impl Orders {
    #[key]
    fn customer(&self, _ctx: &ChangeContext<bson::Document>) -> String {
        String::new()
    }

    #[key]
    fn region(&self, _ctx: &ChangeContext<bson::Document>) -> String {
        String::new()
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
