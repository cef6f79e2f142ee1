use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[filter]
    fn paid(&self, _ctx: &ChangeContext<bson::Document>) -> bool {
        true
    }

    #[filter]
    fn recent(&self, _ctx: &ChangeContext<bson::Document>) -> bool {
        true
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
