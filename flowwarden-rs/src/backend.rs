//! A backend: the change source and the stores one runtime uses.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::checkpoint::CheckpointStore;
use crate::dead_letter::DeadLetterStore;
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

/// What a [`BackendProvider`] yields: `None`, the backend, or every problem found.
#[doc(hidden)]
pub type FromEnv = BoxFuture<'static, Option<Result<Backend, Vec<String>>>>;

/// A backend that configures itself from the environment (the MongoDB crate registers one),
/// so `flowwarden::run()` can pick it without the runtime depending on it.
#[doc(hidden)]
pub struct BackendProvider {
    /// `None` when the environment does not ask for this backend; otherwise the backend or
    /// every problem found while connecting and validating.
    pub from_env: fn() -> FromEnv,
}

inventory::collect!(BackendProvider);
