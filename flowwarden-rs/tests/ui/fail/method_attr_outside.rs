use flowwarden::{on_insert, ChangeContext};

pub struct Orders;

impl Orders {
    #[on_insert]
    pub async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
