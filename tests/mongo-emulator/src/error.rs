//! Errors: the typed start-up/API error of the handle, and the command error sent on the wire.

use bson::{doc, Bson, Document};

/// The label of errors after which the whole transaction may be retried.
pub(crate) const TRANSIENT_TRANSACTION_ERROR: &str = "TransientTransactionError";

/// Errors of the emulator's Rust API (not of the commands it answers).
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    /// Binding or reading the listening socket failed.
    #[error("could not listen on 127.0.0.1:{port}: {source}")]
    Bind {
        /// The port asked for (0 means any free port).
        port: u16,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A resume token given to a test helper was not one this emulator issued.
    #[error("not a resume token issued by this emulator: {0}")]
    BadToken(String),
    /// A test helper was asked about a collection that does not exist.
    #[error("collection {0} does not exist")]
    NoSuchCollection(String),
    /// A document handed to a test helper was refused (for example a duplicate `_id`).
    #[error("write refused: {0}")]
    WriteRefused(String),
}

/// A server error reply: `{ok: 0, errmsg, code, codeName, errorLabels}`.
///
/// Used for errors the emulator produces by itself and for errors a test injects
/// (see [`crate::Emulator::fail_command`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CommandError {
    /// The numeric server error code (for example 286).
    pub code: i32,
    /// The server's name for the code (for example `ChangeStreamHistoryLost`).
    pub code_name: String,
    /// The human-readable message.
    pub errmsg: String,
    /// Error labels (for example `ResumableChangeStreamError`).
    pub labels: Vec<String>,
}

impl CommandError {
    /// An error with the given code, name and message and no labels.
    pub fn new(code: i32, code_name: &str, errmsg: impl Into<String>) -> CommandError {
        CommandError {
            code,
            code_name: code_name.to_string(),
            errmsg: errmsg.into(),
            labels: Vec::new(),
        }
    }

    /// Adds an error label.
    #[must_use]
    pub fn with_label(mut self, label: &str) -> CommandError {
        self.labels.push(label.to_string());
        self
    }

    /// 91 ShutdownInProgress, labelled `ResumableChangeStreamError` (as a current server labels
    /// it on a change stream `getMore`).
    pub fn shutdown_in_progress() -> CommandError {
        CommandError::new(
            91,
            "ShutdownInProgress",
            "The server is in quiesce mode and will shut down",
        )
        .with_label("ResumableChangeStreamError")
    }

    /// 10107 NotWritablePrimary (no label).
    pub fn not_writable_primary() -> CommandError {
        CommandError::new(10107, "NotWritablePrimary", "not primary")
    }

    /// 189 PrimarySteppedDown, labelled `ResumableChangeStreamError`.
    pub fn primary_stepped_down() -> CommandError {
        CommandError::new(
            189,
            "PrimarySteppedDown",
            "Primary stepped down while waiting for replication",
        )
        .with_label("ResumableChangeStreamError")
    }

    /// 43 CursorNotFound (resumable for change streams by its code).
    pub fn cursor_not_found(id: i64) -> CommandError {
        CommandError::new(43, "CursorNotFound", format!("cursor id {id} not found"))
    }

    /// 286 ChangeStreamHistoryLost with the `NonResumableChangeStreamError` label, worded as the
    /// server words it.
    pub fn history_lost() -> CommandError {
        CommandError::new(
            286,
            "ChangeStreamHistoryLost",
            "Resume of change stream was not possible, as the resume point may no longer be in the oplog.",
        )
        .with_label("NonResumableChangeStreamError")
    }

    /// 260 InvalidResumeToken.
    pub fn invalid_resume_token(msg: impl Into<String>) -> CommandError {
        CommandError::new(260, "InvalidResumeToken", msg)
    }

    /// 9 FailedToParse.
    pub fn failed_to_parse(msg: impl Into<String>) -> CommandError {
        CommandError::new(9, "FailedToParse", msg)
    }

    /// 2 BadValue.
    pub fn bad_value(msg: impl Into<String>) -> CommandError {
        CommandError::new(2, "BadValue", msg)
    }

    /// 14 TypeMismatch.
    pub fn type_mismatch(msg: impl Into<String>) -> CommandError {
        CommandError::new(14, "TypeMismatch", msg)
    }

    /// 26 NamespaceNotFound.
    pub fn namespace_not_found(msg: impl Into<String>) -> CommandError {
        CommandError::new(26, "NamespaceNotFound", msg)
    }

    /// 112 WriteConflict labelled `TransientTransactionError`, worded as the server words it: what
    /// a transaction gets when a document it writes was changed by another committed write.
    pub fn write_conflict() -> CommandError {
        CommandError::new(
            112,
            "WriteConflict",
            "Write conflict during plan execution and yielding is disabled. :: Please retry your operation or multi-document transaction.",
        )
        .with_label(TRANSIENT_TRANSACTION_ERROR)
    }

    /// 251 NoSuchTransaction labelled `TransientTransactionError` (the transaction is not open:
    /// never started, aborted or expired).
    pub fn no_such_transaction(msg: impl Into<String>) -> CommandError {
        CommandError::new(251, "NoSuchTransaction", msg).with_label(TRANSIENT_TRANSACTION_ERROR)
    }

    /// 225 TransactionTooOld (a newer `txnNumber` was already used on the session).
    pub fn transaction_too_old(msg: impl Into<String>) -> CommandError {
        CommandError::new(225, "TransactionTooOld", msg)
    }

    /// 256 TransactionCommitted (for example `abortTransaction` after the commit).
    pub fn transaction_committed(msg: impl Into<String>) -> CommandError {
        CommandError::new(256, "TransactionCommitted", msg)
    }

    /// 263 OperationNotSupportedInTransaction.
    pub fn not_supported_in_transaction(msg: impl Into<String>) -> CommandError {
        CommandError::new(263, "OperationNotSupportedInTransaction", msg)
    }

    /// 11602 InterruptedDueToReplStateChange labelled `RetryableWriteError`: what a primary that
    /// steps down answers a `commitTransaction` with. The driver retries such a commit once
    /// by itself (see [`crate::Emulator::fail_commit_after_applying`]).
    pub fn interrupted_due_to_repl_state_change() -> CommandError {
        CommandError::new(
            11602,
            "InterruptedDueToReplStateChange",
            "operation was interrupted because of a replica set state change",
        )
        .with_label("RetryableWriteError")
    }

    /// 50 MaxTimeMSExpired (no label). On a `commitTransaction` the driver labels it
    /// `UnknownTransactionCommitResult` but does not retry it.
    pub fn max_time_ms_expired() -> CommandError {
        CommandError::new(50, "MaxTimeMSExpired", "operation exceeded time limit")
    }

    /// Whether the error carries `label`.
    pub fn has_label(&self, label: &str) -> bool {
        self.labels.iter().any(|l| l == label)
    }

    /// The reply document for this error.
    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "ok": 0.0,
            "errmsg": self.errmsg.clone(),
            "code": self.code,
            "codeName": self.code_name.clone(),
        };
        if !self.labels.is_empty() {
            d.insert(
                "errorLabels",
                self.labels
                    .iter()
                    .cloned()
                    .map(Bson::String)
                    .collect::<Vec<_>>(),
            );
        }
        d
    }
}

impl From<flowwarden::matcher::MatchError> for CommandError {
    fn from(e: flowwarden::matcher::MatchError) -> Self {
        CommandError::new(e.code(), e.code_name(), e.to_string())
    }
}
