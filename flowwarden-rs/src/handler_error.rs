//! The error a handler returns, and what to do about it.

use std::error::Error as StdError;
use std::fmt;

/// Why an event's handling failed. Built from any `std::error::Error` with `?`, or with
/// [`HandlerError::msg`]. It keeps the whole source chain for the dead-letter record.
///
/// It deliberately does not implement `std::error::Error` itself (like `anyhow::Error`), so
/// that `?` converts any error into it.
pub struct HandlerError {
    kind: HandlerErrorKind,
    inner: Box<dyn StdError + Send + Sync + 'static>,
}

/// The class of a [`HandlerError`]; the runtime treats some classes differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerErrorKind {
    /// The handler returned an error: retried per `#[retry]`, then dead-lettered.
    Failed,
    /// The handler (or the filter) panicked: treated like a failure.
    Panicked,
    /// The event's document could not be decoded into the stream's type: dead-lettered at once.
    Decode,
    /// The handler needs a document the event does not carry: dead-lettered at once.
    MissingDocument,
    /// The handler asked to dead-letter the event (`ChangeContext::dead_letter`).
    DeadLetterRequested,
    /// The handler's transaction (`transactional = true`) cannot commit as written (too large,
    /// for example): running it again would fail the same way, so it is dead-lettered at once.
    TransactionRejected,
}

impl HandlerErrorKind {
    /// Whether another attempt could succeed (decode and missing-document failures cannot).
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::Failed | Self::Panicked)
    }
}

#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Message {}

impl HandlerError {
    /// A failure described by a message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Self::with_kind(HandlerErrorKind::Failed, Message(message.to_string()))
    }

    /// A failure of a given kind caused by `err`.
    pub fn with_kind(kind: HandlerErrorKind, err: impl StdError + Send + Sync + 'static) -> Self {
        Self {
            kind,
            inner: Box::new(err),
        }
    }

    /// A failure of a given kind described by a message.
    pub fn kind_msg(kind: HandlerErrorKind, message: impl fmt::Display) -> Self {
        Self::with_kind(kind, Message(message.to_string()))
    }

    /// The failure a caught panic becomes (kind [`HandlerErrorKind::Panicked`]), with the
    /// panic's message when its payload is a string.
    pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Self {
        let message = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_owned()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "non-string panic payload".to_owned()
        };
        Self::kind_msg(
            HandlerErrorKind::Panicked,
            format!("handler panicked: {message}"),
        )
    }

    /// The class of this error.
    pub fn kind(&self) -> HandlerErrorKind {
        self.kind
    }

    /// Whether the handler panicked.
    pub fn is_panic(&self) -> bool {
        self.kind == HandlerErrorKind::Panicked
    }

    /// The messages of the error and of each source, outermost first.
    pub fn chain(&self) -> Vec<String> {
        let mut out = vec![self.inner.to_string()];
        let mut next = self.inner.source();
        while let Some(e) = next {
            out.push(e.to_string());
            next = e.source();
        }
        out
    }

    /// The underlying error.
    pub fn as_std_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.inner
    }
}

impl<E: StdError + Send + Sync + 'static> From<E> for HandlerError {
    fn from(err: E) -> Self {
        Self::with_kind(HandlerErrorKind::Failed, err)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            f.write_str(&self.chain().join(": "))
        } else {
            write!(f, "{}", self.inner)
        }
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("kind", &self.kind)
            .field("chain", &self.chain())
            .finish()
    }
}

/// What `#[on_error]` decides for a failed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorAction {
    /// Retry per `#[retry]` (dead-letter when attempts are exhausted). The default.
    Retry,
    /// Dead-letter now, without further attempts.
    DeadLetter,
    /// Settle the event without handling it. Counted (`flowwarden.events.skipped`) and logged
    /// at warn level with the event's identity: a deliberate, visible choice, never silent.
    Skip,
    /// Stop the stream now, leaving the event unsettled (it is delivered again on restart).
    Halt,
}

/// What a handler may return: `()` or `Result<(), E>` with `E: Into<HandlerError>`.
#[diagnostic::on_unimplemented(
    message = "a flowwarden handler must return `()` or `Result<(), E>` where `E: Into<HandlerError>`, not `{Self}`",
    label = "this return type is not accepted",
    note = "any `E: std::error::Error + Send + Sync + 'static` converts into `flowwarden::HandlerError`"
)]
pub trait IntoHandlerResult {
    /// Converts the handler's return value.
    fn into_handler_result(self) -> Result<(), HandlerError>;
}

impl IntoHandlerResult for () {
    fn into_handler_result(self) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl<E: Into<HandlerError>> IntoHandlerResult for Result<(), E> {
    fn into_handler_result(self) -> Result<(), HandlerError> {
        self.map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn chain_lists_sources() {
        let e: HandlerError = Outer(std::io::Error::other("disk full")).into();
        assert_eq!(
            e.chain(),
            vec!["outer".to_string(), "disk full".to_string()]
        );
        assert_eq!(format!("{e:#}"), "outer: disk full");
        assert_eq!(e.kind(), HandlerErrorKind::Failed);
    }

    #[test]
    fn results_convert() {
        assert!(().into_handler_result().is_ok());
        let r: Result<(), std::io::Error> = Err(std::io::Error::other("x"));
        assert_eq!(r.into_handler_result().unwrap_err().chain(), vec!["x"]);
        let r: Result<(), HandlerError> = Err(HandlerError::msg("y"));
        assert_eq!(r.into_handler_result().unwrap_err().to_string(), "y");
    }

    #[test]
    fn decode_is_not_retryable() {
        assert!(!HandlerErrorKind::Decode.is_retryable());
        assert!(HandlerErrorKind::Panicked.is_retryable());
    }
}
