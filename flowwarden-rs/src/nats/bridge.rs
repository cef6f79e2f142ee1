//! [`NatsBridge`]: publishes one event as an [`Envelope`] and waits for JetStream's ack.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::HeaderMap;
use metrics::counter;
use serde::Serialize;
use tracing::{debug, warn};

use super::envelope::Envelope;
use super::error::NatsBridgeError;
use super::subject::{default_subject, invalid_prefix, invalid_subject, DEFAULT_SUBJECT_PREFIX};
use crate::context::ChangeContext;
use crate::handler_error::HandlerError;

/// The default time the bridge waits for JetStream's acknowledgement of one message.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

type Encoder<T> =
    Arc<dyn Fn(&ChangeContext<T>) -> Result<Vec<u8>, NatsBridgeError> + Send + Sync + 'static>;
type SubjectFn<T> = Arc<dyn Fn(&ChangeContext<T>) -> String + Send + Sync + 'static>;

#[derive(Clone)]
enum Subjects<T> {
    Prefix(String),
    Custom(SubjectFn<T>),
}

/// Publishes change events of a stream whose document type is `T` to NATS JetStream, each as
/// an [`Envelope`] whose `data` a mapping function makes from the event's context.
///
/// Call [`publish`](Self::publish) from a handler and return its result: the event is settled
/// (and may be checkpointed) only once JetStream acknowledged the message; a refused or
/// timed-out publish fails the event, which the engine retries per `#[retry]` and then
/// dead-letters. Every message carries `Nats-Msg-Id` = the event's id, so a redelivery after a
/// crash is dropped by the JetStream stream's duplicate window. See `docs/integrations/nats.md`.
///
/// ```no_run
/// use flowwarden::nats::{async_nats, NatsBridge};
/// use flowwarden::{change_stream, ChangeContext, HandlerError};
///
/// #[derive(serde::Deserialize)]
/// struct Order { total: i64 }
/// #[derive(serde::Serialize)]
/// struct OrderChanged { total: Option<i64> }
///
/// struct OrderEvents { bridge: NatsBridge<Order> }
///
/// #[change_stream(name = "orders", collection = "orders", document = Order)]
/// impl OrderEvents {
///     #[on_change]
///     async fn forward(&self, ctx: &ChangeContext<Order>) -> Result<(), HandlerError> {
///         self.bridge.publish(ctx).await
///     }
/// }
///
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let bridge = NatsBridge::new(async_nats::jetstream::new(client), |ctx: &ChangeContext<Order>| {
///     OrderChanged { total: ctx.document().map(|o| o.total) }
/// });
/// let runtime = flowwarden::builder().stream(OrderEvents { bridge }).start().await?;
/// # let _ = runtime; Ok(()) }
/// ```
pub struct NatsBridge<T> {
    jetstream: jetstream::Context,
    encode: Encoder<T>,
    subjects: Subjects<T>,
    ack_timeout: Duration,
}

impl<T> Clone for NatsBridge<T> {
    fn clone(&self) -> Self {
        Self {
            jetstream: self.jetstream.clone(),
            encode: self.encode.clone(),
            subjects: match &self.subjects {
                Subjects::Prefix(p) => Subjects::Prefix(p.clone()),
                Subjects::Custom(f) => Subjects::Custom(f.clone()),
            },
            ack_timeout: self.ack_timeout,
        }
    }
}

impl<T> fmt::Debug for NatsBridge<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let subjects = match &self.subjects {
            Subjects::Prefix(p) => format!("{p}.<stream>.<operation>"),
            Subjects::Custom(_) => "custom".to_owned(),
        };
        f.debug_struct("NatsBridge")
            .field("subjects", &subjects)
            .field("ack_timeout", &self.ack_timeout)
            .finish_non_exhaustive()
    }
}

/// What JetStream acknowledged for one published event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// The subject the message was published to.
    pub subject: String,
    /// The JetStream stream that stored it.
    pub stream: String,
    /// Its sequence number in that stream (of the first copy, for a duplicate).
    pub sequence: u64,
    /// Whether JetStream recognised the `Nats-Msg-Id` within its duplicate window and dropped
    /// this copy (a redelivery of an event published before).
    pub duplicate: bool,
}

/// The subject prefix given to [`NatsBridge::subject_prefix`] is not a valid subject.
#[derive(Debug, thiserror::Error)]
#[error("`{prefix}` cannot prefix NATS subjects: {reason}")]
pub struct InvalidSubjectPrefix {
    /// The refused prefix.
    pub prefix: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl<T: Send + Sync + 'static> NatsBridge<T> {
    /// A bridge publishing through `jetstream`, with `data` = `map(ctx)` (any `Serialize`
    /// value), to `flowwarden.<stream>.<operation>`, waiting at most
    /// [`DEFAULT_ACK_TIMEOUT`] for each acknowledgement.
    pub fn new<D, F>(jetstream: jetstream::Context, map: F) -> Self
    where
        D: Serialize,
        F: Fn(&ChangeContext<T>) -> D + Send + Sync + 'static,
    {
        Self::try_new(jetstream, move |ctx| {
            Ok::<_, std::convert::Infallible>(map(ctx))
        })
    }

    /// Like [`new`](Self::new), with a mapping that may refuse an event; its error fails the
    /// event ([`NatsBridgeError::Map`]), retried and then dead-lettered like a refused publish.
    pub fn try_new<D, E, F>(jetstream: jetstream::Context, map: F) -> Self
    where
        D: Serialize,
        E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
        F: Fn(&ChangeContext<T>) -> Result<D, E> + Send + Sync + 'static,
    {
        let encode = move |ctx: &ChangeContext<T>| {
            let event_id = || ctx.event_id().as_str().to_owned();
            let data = map(ctx).map_err(|e| NatsBridgeError::Map {
                event_id: event_id(),
                source: e.into(),
            })?;
            serde_json::to_vec(&Envelope::new(ctx, &data)).map_err(|source| {
                NatsBridgeError::Encode {
                    event_id: event_id(),
                    source,
                }
            })
        };
        let mut jetstream = jetstream;
        jetstream.set_timeout(DEFAULT_ACK_TIMEOUT);
        Self {
            jetstream,
            encode: Arc::new(encode),
            subjects: Subjects::Prefix(DEFAULT_SUBJECT_PREFIX.to_owned()),
            ack_timeout: DEFAULT_ACK_TIMEOUT,
        }
    }

    /// Publishes to `<prefix>.<stream>.<operation>` instead of `flowwarden.<stream>.<operation>`
    /// (the stream's name and the operation are made single tokens: `.`, `*`, `>` and
    /// whitespace become `_`).
    pub fn subject_prefix(
        mut self,
        prefix: impl Into<String>,
    ) -> Result<Self, InvalidSubjectPrefix> {
        let prefix = prefix.into();
        if let Some(reason) = invalid_prefix(&prefix) {
            return Err(InvalidSubjectPrefix { prefix, reason });
        }
        self.subjects = Subjects::Prefix(prefix);
        Ok(self)
    }

    /// Publishes each event to the subject `subject(ctx)` returns (for example one per
    /// document key). A subject that is not valid fails the event
    /// ([`NatsBridgeError::InvalidSubject`]).
    pub fn subject_with(
        mut self,
        subject: impl Fn(&ChangeContext<T>) -> String + Send + Sync + 'static,
    ) -> Self {
        self.subjects = Subjects::Custom(Arc::new(subject));
        self
    }

    /// How long one publish may wait for JetStream's acknowledgement (default
    /// [`DEFAULT_ACK_TIMEOUT`]); past it the attempt fails with
    /// [`NatsBridgeError::AckTimeout`].
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self.jetstream.set_timeout(timeout);
        self
    }

    /// The JetStream context the bridge publishes through.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// The subject the event of `ctx` is published to.
    pub fn subject_for(&self, ctx: &ChangeContext<T>) -> String {
        match &self.subjects {
            Subjects::Prefix(prefix) => {
                default_subject(prefix, ctx.stream_name(), ctx.operation_type().as_str())
            }
            Subjects::Custom(f) => f(ctx),
        }
    }

    /// Publishes the event of `ctx` and waits for JetStream's acknowledgement: `Ok` once it is
    /// stored (or recognised as a duplicate), so the handler that returns it lets the engine
    /// settle the event. The form to return from a handler; [`publish_acked`](Self::publish_acked)
    /// tells what JetStream acknowledged.
    pub async fn publish(&self, ctx: &ChangeContext<T>) -> Result<(), HandlerError> {
        self.publish_acked(ctx).await.map(drop).map_err(Into::into)
    }

    /// Like [`publish`](Self::publish), returning the acknowledgement or the typed error.
    pub async fn publish_acked(
        &self,
        ctx: &ChangeContext<T>,
    ) -> Result<Published, NatsBridgeError> {
        let stream = ctx.stream_name();
        let result = self.try_publish(ctx).await;
        match &result {
            Ok(p) if p.duplicate => {
                counter!("flowwarden.nats.duplicates", "stream" => stream).increment(1);
                debug!(stream, event_id = %ctx.event_id(), subject = %p.subject, sequence = p.sequence,
                    "JetStream dropped a redelivered event as a duplicate");
            }
            Ok(p) => {
                counter!("flowwarden.nats.published", "stream" => stream).increment(1);
                debug!(stream, event_id = %ctx.event_id(), subject = %p.subject, sequence = p.sequence,
                    "event published and acknowledged");
            }
            Err(error) => {
                counter!("flowwarden.nats.failed", "stream" => stream).increment(1);
                warn!(stream, event_id = %ctx.event_id(), attempt = ctx.attempt(), error = %error,
                    "event not acknowledged by JetStream");
            }
        }
        result
    }

    async fn try_publish(&self, ctx: &ChangeContext<T>) -> Result<Published, NatsBridgeError> {
        let event_id = ctx.event_id().as_str();
        let subject = self.subject_for(ctx);
        if let Some(reason) = invalid_subject(&subject) {
            return Err(NatsBridgeError::InvalidSubject {
                event_id: event_id.to_owned(),
                subject,
                reason,
            });
        }
        if event_id.contains(['\r', '\n']) {
            return Err(NatsBridgeError::InvalidMessageId {
                event_id: event_id.to_owned(),
            });
        }
        let payload = (self.encode)(ctx)?;
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, event_id);
        headers.insert("Content-Type", "application/json");

        let refused = |source| NatsBridgeError::Refused {
            event_id: event_id.to_owned(),
            subject: subject.clone(),
            source,
        };
        let timed_out = || NatsBridgeError::AckTimeout {
            event_id: event_id.to_owned(),
            subject: subject.clone(),
            timeout: self.ack_timeout,
        };
        let publish = async {
            let ack = self
                .jetstream
                .publish_with_headers(subject.clone(), headers, payload.into())
                .await?;
            ack.await
        };
        let ack = match tokio::time::timeout(self.ack_timeout, publish).await {
            Err(_elapsed) => return Err(timed_out()),
            Ok(Err(e)) if e.kind() == PublishErrorKind::TimedOut => return Err(timed_out()),
            Ok(Err(e)) => return Err(refused(e)),
            Ok(Ok(ack)) => ack,
        };
        Ok(Published {
            subject: subject.clone(),
            stream: ack.stream,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}
