//! The error every store (checkpoints, dead letters) returns.

/// How the engine must treat a store error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The store could not be reached or timed out: try again later.
    Unavailable,
    /// A stored document does not parse: never reset silently; halt the stream.
    Corrupt,
    /// A conditional write was rejected because another owner holds a newer epoch.
    Fenced,
    /// The record is larger than the store accepts.
    TooLarge,
    /// Anything else.
    Other,
}

/// An error from a checkpoint or dead-letter store.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("{kind:?} store error: {message}")]
pub struct StoreError {
    /// Classification.
    pub kind: StoreErrorKind,
    /// What happened, naming the stream and the field where it applies.
    pub message: String,
}

impl StoreError {
    /// A new error.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}
