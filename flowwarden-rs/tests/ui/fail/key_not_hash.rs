use flowwarden::{change_stream, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders", concurrency = 4)]
impl Orders {
    #[key]
    fn amount(&self, ctx: &ChangeContext<bson::Document>) -> f64 {
        ctx.document().and_then(|d| d.get_f64("amount").ok()).unwrap_or(0.0)
    }

    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
