//! A filter, a catch-all, an optional document, `full_document` and every companion.
use flowwarden::{change_stream, checkpoint, restart, retry, ChangeContext, CollectionName, HandlerError};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Order {
    pub status: String,
}

impl CollectionName for Order {
    const COLLECTION: &'static str = "orders";
}

pub struct Audit {
    pub prefix: String,
}

#[derive(Debug)]
pub struct AuditError;

impl std::fmt::Display for AuditError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("audit failed")
    }
}

impl std::error::Error for AuditError {}

#[change_stream(document = Order, database = "shop", full_document = "whenAvailable",
    full_document_before_change = "required", enabled = true, auto_start = false)]
#[checkpoint(start_position = Latest, on_history_lost = "RESUME_FROM_NOW", resume_strategy = SeenFirst)]
#[retry(max_attempts = 5, multiplier = 1.5, max_delay_ms = 1000, jitter = false)]
#[restart(initial_delay_ms = 10)]
impl Audit {
    #[filter]
    fn paid_only(&self, ctx: &ChangeContext<Order>) -> bool {
        ctx.document().is_some_and(|o| o.status == "PAID")
    }

    #[on_update]
    async fn updated(&self, order: Option<Order>) -> Result<(), AuditError> {
        if order.is_none() {
            return Err(AuditError);
        }
        Ok(())
    }

    #[on_change]
    fn anything_else(&self, order: Option<Order>, ctx: &ChangeContext<Order>) {
        println!("{}{} {:?}", self.prefix, ctx.operation_type(), order);
    }
}

fn main() {
    let def = <Audit as flowwarden::StreamHandler>::definition();
    assert_eq!(def.name, "audit");
    assert_eq!(def.collection, "orders");
    let _ = HandlerError::msg("unused");
}
