use flowwarden::{change_stream, ChangeContext, HandlerError};

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[filter]
    async fn slow(&self, _ctx: &ChangeContext<bson::Document>) -> bool {
        true
    }

    #[on_error]
    fn decide(&self, _e: &HandlerError) {}

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
