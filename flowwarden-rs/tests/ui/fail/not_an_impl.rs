use flowwarden::change_stream;

#[change_stream(collection = "orders")]
pub struct Orders;

fn main() {}
