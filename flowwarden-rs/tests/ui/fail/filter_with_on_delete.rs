use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[filter]
    fn relevant(&self, ctx: &ChangeContext<bson::Document>) -> bool {
        ctx.document().is_some()
    }

    #[on_delete]
    fn deleted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
