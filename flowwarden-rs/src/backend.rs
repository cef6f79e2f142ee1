//! A backend: the change source and the stores one runtime uses.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::checkpoint::CheckpointStore;
use crate::dead_letter::DeadLetterStore;
use crate::lease::LeaseStore;
use crate::source::ChangeSource;

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
    /// The database used when a stream names none.
    pub default_database: String,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("source", &self.source.describe())
            .field("dead_letters", &self.dead_letters.is_some())
            .field("default_database", &self.default_database)
            .finish()
    }
}

/// What a [`BackendProvider`] returns: `None` when the environment does not ask for it,
/// else the backend or every problem found while connecting and validating.
pub type ProvidedBackend = BoxFuture<'static, Option<Result<Backend, Vec<String>>>>;

/// A backend that configures itself from the environment (the MongoDB crate registers one),
/// so `flowwarden::run()` can pick it without the runtime depending on it.
#[doc(hidden)]
pub struct BackendProvider {
    /// `None` when the environment does not ask for this backend; otherwise the backend or
    /// every problem found while connecting and validating.
    pub from_env: fn() -> ProvidedBackend,
}

inventory::collect!(BackendProvider);
