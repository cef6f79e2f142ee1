//! A transactional stream: handlers take the transaction last (with or without the document and
//! the context); a handler without it runs in a transaction too; a document type named
//! `Transaction` taken by value stays the document.
use flowwarden::{change_stream, ChangeContext, HandlerError, MemoryTransaction, StreamHandler};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Transaction {
    pub amount: i64,
}

#[derive(Default)]
pub struct Ledger;

#[change_stream(collection = "transactions", document = Transaction, transactional = true,
                full_document = "updateLookup")]
impl Ledger {
    #[on_insert]
    async fn booked(
        &self,
        t: Transaction,
        ctx: &ChangeContext<Transaction>,
        tx: &MemoryTransaction,
    ) -> Result<(), HandlerError> {
        tx.upsert_one(
            "balances",
            bson::doc! {"_id": ctx.event_id().as_str()},
            bson::doc! {"$inc": {"amount": t.amount}},
        )?;
        Ok(())
    }

    #[on_update]
    async fn changed(&self, _t: Transaction, _tx: &flowwarden::MemoryTransaction) {}

    #[on_replace]
    async fn replaced(&self, _tx: &MemoryTransaction) {}

    #[on_delete]
    fn deleted(&self, _ctx: &ChangeContext<Transaction>) {}
}

fn main() {
    let d = Ledger::definition();
    assert!(d.transactional);
    let types = Ledger::transaction_types();
    assert_eq!(types.len(), 3);
    assert!(types.iter().all(|t| *t == flowwarden::port::HandleType::of::<MemoryTransaction>()));
}
