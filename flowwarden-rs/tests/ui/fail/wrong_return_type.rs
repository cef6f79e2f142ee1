use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) -> Result<(), String> {
        Ok(())
    }

    #[on_delete]
    fn deleted(&self, _ctx: &ChangeContext<bson::Document>) -> bool {
        true
    }
}

fn main() {}
