use flowwarden::{checkpoint, retry};

#[checkpoint(save_every_n = 5)]
pub struct Orders;

#[retry(max_attempts = 2)]
impl Orders {}

fn main() {}
