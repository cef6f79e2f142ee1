use flowwarden::{change_stream, ChangeContext, ErrorAction, HandlerError};

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}

    #[on_error]
    fn first(&self, _e: &HandlerError, _ctx: &ChangeContext<bson::Document>) -> ErrorAction {
        ErrorAction::Retry
    }

    #[on_error]
    fn second(&self, _e: &HandlerError, _ctx: &ChangeContext<bson::Document>) -> ErrorAction {
        ErrorAction::Skip
    }
}

fn main() {}
