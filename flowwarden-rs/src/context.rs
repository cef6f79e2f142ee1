//! What a handler sees of an event: [`ChangeContext`].

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use bson::{DateTime, Document, Timestamp};
use serde::de::DeserializeOwned;

use crate::event::{ChangeEvent, Namespace, OperationType, ResumeToken, UpdateDescription};
use crate::handler_error::{HandlerError, HandlerErrorKind};
use crate::port::{TransactionHandle, TransactionHandleType};

/// A stable identity of an event, the same on every redelivery: use it to make handlers
/// idempotent (for example as a unique key of the side effect).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);

impl EventId {
    /// The identity of the event with `token` on `stream`.
    pub fn new(stream: &str, token: &ResumeToken) -> Self {
        Self(format!("{stream}:{token}"))
    }

    /// The identity as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything about one event, handed to filters and handlers.
///
/// `T` is the stream's `document` type (`bson::Document` when none is declared).
pub struct ChangeContext<T> {
    event: ChangeEvent,
    document: Slot<T>,
    document_before_change: Slot<T>,
    stream: &'static str,
    id: OnceLock<EventId>,
    attempt: AtomicU32,
    dead_letter_reason: Mutex<Option<String>>,
    /// Set once `dead_letter_reason` holds a reason: the runtime reads this flag after every
    /// attempt and takes the lock only when a handler asked.
    dead_letter_requested: AtomicBool,
    save_checkpoint_now: AtomicBool,
    /// The open transaction of this attempt, for `transactional = true` streams.
    transaction: Mutex<Option<TransactionHandle>>,
}

/// The event's document could not be decoded into the stream's type.
#[derive(Debug, thiserror::Error)]
#[error("cannot decode `{field}` of event {token} into `{type_name}`")]
pub struct DecodeError {
    /// `fullDocument` or `fullDocumentBeforeChange`.
    pub field: &'static str,
    /// The target type.
    pub type_name: &'static str,
    /// The event's token.
    pub token: String,
    /// The decoder's error.
    #[source]
    pub source: bson::de::Error,
}

/// Where a context finds its typed document.
enum Slot<T> {
    /// The event carries none.
    Absent,
    /// Decoded into `T`.
    Decoded(T),
    /// `T` is `bson::Document`: the field of the shared raw event itself, read in place (the
    /// function finds it), so a raw-document stream copies nothing.
    InEvent(fn(&ChangeEvent) -> Option<&T>),
}

impl<T> Slot<T> {
    fn get<'a>(&'a self, event: &'a ChangeEvent) -> Option<&'a T> {
        match self {
            Slot::Absent => None,
            Slot::Decoded(doc) => Some(doc),
            Slot::InEvent(find) => find(event),
        }
    }
}

impl<T: DeserializeOwned + 'static> ChangeContext<T> {
    /// Builds the context, decoding `fullDocument` and `fullDocumentBeforeChange` into `T`.
    pub fn decode(stream: &'static str, event: ChangeEvent) -> Result<Self, DecodeError> {
        let document = slot::<T>(&event, "fullDocument", |e| {
            e.full_document().and_then(as_t::<T>)
        })?;
        let document_before_change = slot::<T>(&event, "fullDocumentBeforeChange", |e| {
            e.full_document_before_change().and_then(as_t::<T>)
        })?;
        Ok(Self {
            id: OnceLock::new(),
            event,
            document,
            document_before_change,
            stream,
            attempt: AtomicU32::new(1),
            dead_letter_reason: Mutex::new(None),
            dead_letter_requested: AtomicBool::new(false),
            save_checkpoint_now: AtomicBool::new(false),
            transaction: Mutex::new(None),
        })
    }

    /// An owned copy of the document, decoded again from the raw event (used for handlers
    /// that take the document by value). Fails when the event carries no document.
    pub fn document_owned(&self) -> Result<T, HandlerError> {
        self.document_owned_opt()?.ok_or_else(|| {
            HandlerError::kind_msg(
                HandlerErrorKind::MissingDocument,
                format!(
                    "the {} event {} carries no fullDocument (deleted before the lookup, or no post-image); take `Option<T>` or the context to handle this case",
                    self.event.operation_type(),
                    self.event.token()
                ),
            )
        })
    }

    /// An owned copy of the document when the event carries one.
    pub fn document_owned_opt(&self) -> Result<Option<T>, HandlerError> {
        decode_field::<T>(&self.event, "fullDocument")
            .map_err(|e| HandlerError::with_kind(HandlerErrorKind::Decode, e))
    }
}

/// `doc` as a `T` when `T` is `bson::Document`.
fn as_t<T: 'static>(doc: &Document) -> Option<&T> {
    (doc as &dyn std::any::Any).downcast_ref::<T>()
}

/// The slot of `field`: read in place (through `in_event`) when `T` is `bson::Document`,
/// otherwise decoded.
fn slot<T: DeserializeOwned + 'static>(
    event: &ChangeEvent,
    field: &'static str,
    in_event: fn(&ChangeEvent) -> Option<&T>,
) -> Result<Slot<T>, DecodeError> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<Document>() {
        // Looked up when asked for (absent or null: none).
        return Ok(Slot::InEvent(in_event));
    }
    Ok(match decode_field::<T>(event, field)? {
        Some(doc) => Slot::Decoded(doc),
        None => Slot::Absent,
    })
}

fn decode_field<T: DeserializeOwned + 'static>(
    event: &ChangeEvent,
    field: &'static str,
) -> Result<Option<T>, DecodeError> {
    match event.raw().get_document(field) {
        // A stream without a `document` type reads raw documents: a clone, not a decode.
        Ok(doc) if std::any::TypeId::of::<T>() == std::any::TypeId::of::<Document>() => {
            let any: Box<dyn std::any::Any> = Box::new(doc.clone());
            Ok(any.downcast::<T>().ok().map(|b| *b))
        }
        Ok(doc) => bson::from_document::<T>(doc.clone())
            .map(Some)
            .map_err(|source| DecodeError {
                field,
                type_name: std::any::type_name::<T>(),
                token: event.token().to_string(),
                source,
            }),
        Err(_) => Ok(None),
    }
}

impl<T> ChangeContext<T> {
    /// The name of the stream that received the event.
    pub fn stream_name(&self) -> &'static str {
        self.stream
    }

    /// A stable identity for deduplication: the same on every redelivery of this event.
    pub fn event_id(&self) -> &EventId {
        self.id
            .get_or_init(|| EventId::new(self.stream, self.event.token()))
    }

    /// The operation.
    pub fn operation_type(&self) -> &OperationType {
        self.event.operation_type()
    }

    /// The namespace the event happened in.
    pub fn namespace(&self) -> &Namespace {
        self.event.namespace()
    }

    /// `documentKey`.
    pub fn document_key(&self) -> Option<&Document> {
        self.event.document_key()
    }

    /// The typed document (`fullDocument`), when the event carries one.
    pub fn document(&self) -> Option<&T> {
        self.document.get(&self.event)
    }

    /// The typed pre-image (`fullDocumentBeforeChange`), when the event carries one.
    pub fn document_before_change(&self) -> Option<&T> {
        self.document_before_change.get(&self.event)
    }

    /// `updateDescription`, for updates.
    pub fn update_description(&self) -> Option<&UpdateDescription> {
        self.event.update_description()
    }

    /// The event's resume token.
    pub fn resume_token(&self) -> &ResumeToken {
        self.event.token()
    }

    /// `clusterTime`.
    pub fn cluster_time(&self) -> Option<Timestamp> {
        self.event.cluster_time()
    }

    /// `wallTime`.
    pub fn wall_time(&self) -> Option<DateTime> {
        self.event.wall_time()
    }

    /// The transaction number, for events written in a transaction.
    pub fn txn_number(&self) -> Option<i64> {
        self.event.txn_number()
    }

    /// The raw event, as the source delivered it.
    pub fn raw_event(&self) -> &Document {
        self.event.raw()
    }

    /// The shared parsed event.
    pub fn event(&self) -> &ChangeEvent {
        &self.event
    }

    /// Which attempt this is (1 for the first try).
    pub fn attempt(&self) -> u32 {
        self.attempt.load(Ordering::Relaxed)
    }

    /// Asks the runtime to dead-letter this event with `reason` once the handler returns,
    /// without further retries. The event counts as settled once the record is stored.
    pub fn dead_letter(&self, reason: impl Into<String>) {
        let mut slot = self
            .dead_letter_reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *slot = Some(reason.into());
        self.dead_letter_requested.store(true, Ordering::Release);
    }

    /// Asks the runtime to write the checkpoint as soon as this event is settled, regardless
    /// of `save_every_n`.
    pub fn save_checkpoint_now(&self) {
        self.save_checkpoint_now.store(true, Ordering::Relaxed);
    }

    /// The handle of this attempt's transaction, typed as the backend's handle type `X`
    /// (`flowwarden_rs_mongo::Transaction`, [`crate::MemoryTransaction`]): `None` when the
    /// stream is not `transactional = true`, outside a handler attempt, or when `X` is not the
    /// backend's type. Handlers declared with `#[change_stream]` take it as a `&Transaction`
    /// parameter instead.
    pub fn transaction<X: TransactionHandleType>(&self) -> Option<X> {
        let slot = self.transaction.lock().ok()?;
        slot.as_ref()?.downcast_ref::<X>().cloned()
    }

    /// Whether an attempt's transaction is open for this event.
    pub fn in_transaction(&self) -> bool {
        self.transaction.lock().is_ok_and(|s| s.is_some())
    }

    pub(crate) fn set_transaction(&self, handle: Option<TransactionHandle>) {
        if let Ok(mut slot) = self.transaction.lock() {
            *slot = handle;
        }
    }

    pub(crate) fn set_attempt(&self, attempt: u32) {
        self.attempt.store(attempt, Ordering::Relaxed);
    }

    pub(crate) fn take_dead_letter_request(&self) -> Option<String> {
        // A plain load first: the swap (a locked instruction) only when a handler asked.
        if !self.dead_letter_requested.load(Ordering::Relaxed)
            || !self.dead_letter_requested.swap(false, Ordering::Acquire)
        {
            return None;
        }
        self.dead_letter_reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    pub(crate) fn take_save_request(&self) -> bool {
        // A plain load first: the swap (a locked instruction) only when a handler asked.
        self.save_checkpoint_now.load(Ordering::Relaxed)
            && self.save_checkpoint_now.swap(false, Ordering::Relaxed)
    }
}

impl<T: fmt::Debug> fmt::Debug for ChangeContext<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeContext")
            .field("stream", &self.stream)
            .field("event_id", self.event_id())
            .field("operation_type", self.operation_type())
            .field("document_key", &self.document_key())
            .field("attempt", &self.attempt())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Order {
        status: String,
    }

    fn event(raw: Document) -> ChangeEvent {
        ChangeEvent::from_raw(raw).expect("valid event")
    }

    #[test]
    fn decodes_document_and_identity() {
        let ev = event(doc! {
            "_id": {"_data": "01"}, "operationType": "insert",
            "fullDocument": {"_id": 1, "status": "PAID"}
        });
        let ctx = ChangeContext::<Order>::decode("orders", ev).expect("decodes");
        assert_eq!(ctx.document().map(|o| o.status.as_str()), Some("PAID"));
        assert_eq!(ctx.event_id().as_str(), "orders:01");
        assert_eq!(ctx.document_owned().expect("present").status, "PAID");
    }

    #[test]
    fn raw_document_streams_get_the_document_as_is() {
        let ev = event(doc! {
            "_id": {"_data": "01"}, "operationType": "replace",
            "fullDocument": {"_id": 1, "status": 5},
            "fullDocumentBeforeChange": {"_id": 1, "status": 4}
        });
        let ctx = ChangeContext::<Document>::decode("raw", ev).expect("decodes");
        assert_eq!(ctx.document(), Some(&doc! {"_id": 1, "status": 5}));
        assert_eq!(
            ctx.document_before_change(),
            Some(&doc! {"_id": 1, "status": 4})
        );
        // Read in place: the very documents of the shared raw event, not copies.
        let raw = ctx.raw_event();
        assert!(ctx
            .document()
            .is_some_and(|d| std::ptr::eq(d, raw.get_document("fullDocument").expect("doc"))));
        assert!(ctx.document_before_change().is_some_and(|d| std::ptr::eq(
            d,
            raw.get_document("fullDocumentBeforeChange").expect("doc")
        )));
        assert_eq!(
            ctx.document_owned().expect("present"),
            doc! {"_id": 1, "status": 5}
        );
        assert_eq!(ctx.event_id().as_str(), "raw:01");

        // No document, or a null one (a deleted document's lookup): none, as for typed streams.
        let ev = event(doc! {
            "_id": {"_data": "02"}, "operationType": "update", "fullDocument": null
        });
        let ctx = ChangeContext::<Document>::decode("raw", ev).expect("decodes");
        assert_eq!(ctx.document(), None);
        assert_eq!(ctx.document_before_change(), None);
        assert!(ctx.document_owned_opt().expect("ok").is_none());
    }

    #[test]
    fn undecodable_document_is_an_error() {
        let ev = event(doc! {
            "_id": {"_data": "01"}, "operationType": "insert",
            "fullDocument": {"_id": 1, "status": 5}
        });
        let err = ChangeContext::<Order>::decode("orders", ev).unwrap_err();
        assert_eq!(err.field, "fullDocument");
    }

    #[test]
    fn missing_document_for_owned_handler_is_not_retryable() {
        let ev = event(doc! {"_id": {"_data": "01"}, "operationType": "update"});
        let ctx = ChangeContext::<Order>::decode("orders", ev).expect("decodes");
        let err = ctx.document_owned().unwrap_err();
        assert_eq!(err.kind(), HandlerErrorKind::MissingDocument);
        assert!(ctx.document_owned_opt().expect("ok").is_none());
    }

    #[test]
    fn requests_are_taken_once() {
        let ev = event(doc! {"_id": {"_data": "01"}, "operationType": "delete"});
        let ctx = ChangeContext::<Document>::decode("s", ev).expect("decodes");
        ctx.dead_letter("poison");
        ctx.save_checkpoint_now();
        assert_eq!(ctx.take_dead_letter_request().as_deref(), Some("poison"));
        assert_eq!(ctx.take_dead_letter_request(), None);
        assert!(ctx.take_save_request());
        assert!(!ctx.take_save_request());
    }
}
