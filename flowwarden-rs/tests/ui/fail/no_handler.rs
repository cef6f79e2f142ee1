use flowwarden::change_stream;

pub struct Orders;

#[change_stream(collection = "orders")]
impl Orders {
    #[pipeline]
    fn pipeline() -> Vec<bson::Document> {
        Vec::new()
    }
}

fn main() {}
