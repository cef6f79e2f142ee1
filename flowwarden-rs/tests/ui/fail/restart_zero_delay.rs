use flowwarden::{change_stream, restart, ChangeContext};

pub struct Orders;

#[change_stream(collection = "orders")]
#[restart(initial_delay_ms = 0)]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
