//! [`NatsBridgeError`]: why one publish did not end with a JetStream acknowledgement.

use std::time::Duration;

use async_nats::jetstream::context::PublishError;

/// Why the bridge did not get a JetStream acknowledgement for an event.
///
/// Every variant is a failure of the event's handling: returned from a handler (it converts
/// into [`HandlerError`](crate::HandlerError) with `?`), the engine retries it per `#[retry]`,
/// then dead-letters it, and never checkpoints past it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsBridgeError {
    /// The user's mapping function refused the event.
    #[error("the mapping of event {event_id} failed")]
    Map {
        /// The event's identity.
        event_id: String,
        /// What the mapping function returned.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The envelope could not be encoded as JSON (the mapped payload is not serializable).
    #[error("the envelope of event {event_id} cannot be encoded as JSON")]
    Encode {
        /// The event's identity.
        event_id: String,
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// The subject chosen for the event is not a valid NATS publish subject.
    #[error("`{subject}` is not a valid NATS subject for event {event_id}: {reason}")]
    InvalidSubject {
        /// The event's identity.
        event_id: String,
        /// The subject.
        subject: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The event's identity cannot be sent as the `Nats-Msg-Id` header (it holds a line break).
    #[error("event id {event_id:?} cannot be a Nats-Msg-Id header value")]
    InvalidMessageId {
        /// The event's identity.
        event_id: String,
    },
    /// JetStream refused the message, or the connection failed while it waited: no stream
    /// listens on the subject (`no responders`), the stream rejected it, the connection broke.
    #[error("JetStream did not store event {event_id} published to `{subject}`")]
    Refused {
        /// The event's identity.
        event_id: String,
        /// The subject.
        subject: String,
        /// The client's error.
        #[source]
        source: PublishError,
    },
    /// No acknowledgement arrived within the bridge's ack timeout (the server is down,
    /// unreachable, or too slow). The message may still be stored later: the retry carries the
    /// same `Nats-Msg-Id`, so JetStream drops the second copy within its duplicate window.
    #[error("no JetStream acknowledgement for event {event_id} on `{subject}` within {timeout:?}")]
    AckTimeout {
        /// The event's identity.
        event_id: String,
        /// The subject.
        subject: String,
        /// The configured ack timeout.
        timeout: Duration,
    },
}
