use flowwarden::{
    change_stream, checkpoint, ChangeContext, HandlerError, StartPosition, StreamHandler,
};

pub struct Projection;

#[change_stream(collection = "orders")]
#[checkpoint(start_position = Snapshot, save_every_n = 50)]
impl Projection {
    #[on_insert]
    async fn created(&self, ctx: &ChangeContext<bson::Document>) -> Result<(), HandlerError> {
        let _ = ctx.is_snapshot();
        Ok(())
    }
}

pub struct CatchAll;

#[change_stream(collection = "orders", name = "catch-all")]
#[checkpoint(start_position = "SNAPSHOT")]
impl CatchAll {
    #[on_change]
    async fn any(&self, _ctx: &ChangeContext<bson::Document>) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {
    assert_eq!(
        Projection::definition().checkpoint.start_position,
        StartPosition::Snapshot
    );
    assert_eq!(
        CatchAll::definition().checkpoint.start_position,
        StartPosition::Snapshot
    );
}
