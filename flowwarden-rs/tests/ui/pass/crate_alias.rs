//! The runtime under another name: `crate = "fw"`.
extern crate flowwarden as fw;

use fw::{change_stream, checkpoint, ChangeContext};

pub struct Renamed;

#[change_stream(crate = "fw", collection = "renamed")]
#[checkpoint(save_every_n = 2)]
impl Renamed {
    #[on_insert]
    async fn created(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {
    let def = <Renamed as fw::StreamHandler>::definition();
    assert_eq!(def.checkpoint.save_every_n, 2);
}
