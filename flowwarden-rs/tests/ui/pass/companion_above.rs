//! Companions written above `#[change_stream]` (expanded first) still configure the stream,
//! in any order and by full path.
use flowwarden::{change_stream, checkpoint, ChangeContext};

pub struct Above;

#[checkpoint(save_every_n = 7)]
#[flowwarden::retry(max_attempts = 9)]
#[change_stream(collection = "above")]
#[flowwarden::restart(max_attempts = 4)]
impl Above {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {
    let def = <Above as flowwarden::StreamHandler>::definition();
    assert_eq!(def.checkpoint.save_every_n, 7);
    assert_eq!(def.retry.max_attempts, 9);
    assert_eq!(def.restart.max_attempts, 4);
}
