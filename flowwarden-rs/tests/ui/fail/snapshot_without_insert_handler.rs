use flowwarden::{change_stream, checkpoint, ChangeContext, HandlerError};

pub struct Orders;

#[change_stream(collection = "orders")]
#[checkpoint(start_position = Snapshot)]
impl Orders {
    #[on_update]
    async fn changed(&self, _ctx: &ChangeContext<bson::Document>) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
