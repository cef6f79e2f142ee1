//! The example of the issue. It drops `#[filter]`: a filter next to `#[on_delete]` is a
//! compile error (see `fail/filter_with_on_delete.rs`); `filter_and_catch_all.rs` has one.
use bson::{doc, Document};
use flowwarden::{change_stream, checkpoint, retry, ChangeContext, ErrorAction, HandlerError};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Order {
    pub status: String,
}

#[derive(Default)]
pub struct OrderStream;

#[change_stream(name = "order-stream", collection = "orders", document = Order)]
#[checkpoint(save_every_n = 5, save_interval_secs = 10)]
#[retry(max_attempts = 3, initial_delay_ms = 200)]
impl OrderStream {
    #[pipeline]
    fn pipeline() -> Vec<Document> {
        vec![doc! { "$match": { "fullDocument.status": "PAID" } }]
    }

    #[on_insert]
    async fn created(&self, order: Order, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
        println!("{} created: {}", ctx.event_id(), order.status);
        Ok(())
    }

    #[on_update]
    #[on_replace]
    async fn changed(&self, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
        let _ = ctx.update_description();
        Ok(())
    }

    // A plain fn: runs on the blocking pool.
    #[on_delete]
    fn deleted(&self, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
        println!("deleted {:?}", ctx.document_key());
        Ok(())
    }

    #[on_error]
    fn on_error(&self, err: &HandlerError, _ctx: &ChangeContext<Order>) -> ErrorAction {
        if err.kind().is_retryable() {
            ErrorAction::Retry
        } else {
            ErrorAction::DeadLetter
        }
    }
}

fn main() {
    let def = <OrderStream as flowwarden::StreamHandler>::definition();
    assert_eq!(def.name, "order-stream");
    assert_eq!(def.checkpoint.save_every_n, 5);
}
