//! A backend: the change source and the stores one runtime uses (their traits are in
//! [`crate::port`]).

use std::sync::Arc;

use crate::port::{ChangeSource, CheckpointStore, DeadLetterStore, LeaseStore, TransactionStore};

/// The source and stores of one runtime.
#[derive(Clone)]
pub struct Backend {
    /// Where events come from.
    pub source: Arc<dyn ChangeSource>,
    /// Where checkpoints live.
    pub checkpoints: Arc<dyn CheckpointStore>,
    /// Where dead letters live; `None` makes exhausted retries halt the stream.
    pub dead_letters: Option<Arc<dyn DeadLetterStore>>,
    /// Where leases of `SingleLeader` streams live; `None` makes such streams refuse to start.
    pub leases: Option<Arc<dyn LeaseStore>>,
    /// Transactions that commit a handler's writes with the checkpoint; `None` makes
    /// `transactional = true` streams refuse to start.
    pub transactions: Option<Arc<dyn TransactionStore>>,
    /// The database used when a stream names none.
    pub default_database: String,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("source", &self.source.describe())
            .field("dead_letters", &self.dead_letters.is_some())
            .field("leases", &self.leases.is_some())
            .field(
                "transactions",
                &self.transactions.as_ref().map(|t| t.describe()),
            )
            .field("default_database", &self.default_database)
            .finish()
    }
}
