use flowwarden::{change_stream, ChangeContext};

pub struct Orders<T>(T);

#[change_stream(collection = "orders")]
impl<T: Send + Sync + 'static> Orders<T> {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
