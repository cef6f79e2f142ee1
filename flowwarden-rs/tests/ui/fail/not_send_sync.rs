use std::rc::Rc;

use flowwarden::{change_stream, ChangeContext};

pub struct Orders {
    pub counter: Rc<u32>,
}

#[change_stream(collection = "orders")]
impl Orders {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {}
