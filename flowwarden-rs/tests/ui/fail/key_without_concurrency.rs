use flowwarden::{change_stream, ChangeContext};

pub struct Default1;

#[change_stream(collection = "orders")]
impl Default1 {
    #[key]
    fn customer(&self, _ctx: &ChangeContext<bson::Document>) -> String {
        String::new()
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

pub struct Explicit1;

#[change_stream(collection = "orders", concurrency = 1)]
impl Explicit1 {
    #[key]
    fn customer(&self, _ctx: &ChangeContext<bson::Document>) -> String {
        String::new()
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
