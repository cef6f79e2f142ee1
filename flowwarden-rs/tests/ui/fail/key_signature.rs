use flowwarden::{change_stream, ChangeContext};

pub struct AsyncKey;

#[change_stream(collection = "orders", concurrency = 4)]
impl AsyncKey {
    #[key]
    async fn customer(&self, _ctx: &ChangeContext<bson::Document>) -> String {
        String::new()
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

pub struct MutSelf;

#[change_stream(collection = "orders", concurrency = 4)]
impl MutSelf {
    #[key]
    fn customer(&mut self, _ctx: &ChangeContext<bson::Document>) -> String {
        String::new()
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

pub struct NoReturn;

#[change_stream(collection = "orders", concurrency = 4)]
impl NoReturn {
    #[key]
    fn customer(&self, _ctx: &ChangeContext<bson::Document>) {}

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

pub struct NoContext;

#[change_stream(collection = "orders", concurrency = 4)]
impl NoContext {
    #[key]
    fn customer(&self) -> u64 {
        0
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

pub struct DocumentInsteadOfContext;

#[change_stream(collection = "orders", concurrency = 4)]
impl DocumentInsteadOfContext {
    #[key]
    fn customer(&self, doc: bson::Document) -> String {
        doc.get_str("customer").unwrap_or_default().to_owned()
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

pub struct NoSelf;

#[change_stream(collection = "orders", concurrency = 4)]
impl NoSelf {
    #[key]
    fn customer(_ctx: &ChangeContext<bson::Document>) -> String {
        String::new()
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
