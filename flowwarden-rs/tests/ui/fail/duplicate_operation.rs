use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[on_insert]
    #[on_update]
    async fn changed(&self, _ctx: &ChangeContext<bson::Document>) {}

    #[on_update]
    async fn updated(&self, _ctx: &ChangeContext<bson::Document>) {}

    #[on_change]
    fn rest(&self, _ctx: &ChangeContext<bson::Document>) {}

    #[on_change]
    fn rest_again(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
