use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[on_insert]
    async fn by_value(self, _ctx: &ChangeContext<bson::Document>) {}

    #[on_update]
    async fn mutable(&mut self, _ctx: &ChangeContext<bson::Document>) {}

    #[on_replace]
    async fn no_self(_ctx: &ChangeContext<bson::Document>) {}

    #[on_delete]
    async fn generic<T>(&self, _ctx: &ChangeContext<bson::Document>) {}

    #[on_change]
    async fn reversed(&self, _ctx: &ChangeContext<bson::Document>, _doc: Option<bson::Document>) {}
}

fn main() {}
