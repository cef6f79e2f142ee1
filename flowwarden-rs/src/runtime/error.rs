//! What starting, running and controlling a runtime can fail with.

use crate::handler_error::HandlerError;
use crate::port::StoreError;
use crate::status::Halt;

/// Startup validation failed: every problem found, not just the first.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("flowwarden cannot start: {} problem(s):\n{}", problems.len(), problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
pub struct StartupError {
    /// Each problem, with the stream and what to do.
    pub problems: Vec<String>,
}

/// Why [`crate::Runtime::wait`] (or [`crate::run()`]) returned an error.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum RunError {
    /// Validation failed before anything started.
    #[error(transparent)]
    Startup(#[from] StartupError),
    /// Every started stream halted; each halt names its runbook.
    #[error("every stream halted:\n{}", .0.iter().map(|h| format!("  - {h}")).collect::<Vec<_>>().join("\n"))]
    AllHalted(Vec<Halt>),
}

/// A runtime control request that could not be honoured.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ControlError {
    /// No stream has this name.
    #[error("no stream named '{0}'")]
    UnknownStream(String),
    /// The stream is disabled (`enabled = false`).
    #[error("stream '{0}' is disabled (enabled = false)")]
    Disabled(String),
    /// The runtime is shutting down.
    #[error("the runtime is shutting down")]
    ShuttingDown,
}

/// A dead-letter operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// No dead-letter store is configured.
    #[error("no dead-letter store is configured")]
    NoStore,
    /// No record has this id.
    #[error("no dead-letter record '{0}'")]
    NotFound(String),
    /// The record's stream is not part of this runtime.
    #[error(
        "dead-letter record '{id}' belongs to stream '{stream}', which this runtime does not run"
    )]
    UnknownStream {
        /// The record.
        id: String,
        /// Its stream.
        stream: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The handler failed again; the record stays pending.
    #[error("replay of '{id}' failed: {error:#}")]
    ReplayFailed {
        /// The record.
        id: String,
        /// The handler's error.
        error: HandlerError,
    },
}
