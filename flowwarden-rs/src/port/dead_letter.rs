//! Dead letters: events whose handling failed for good, kept with everything needed to
//! understand and replay them.

use async_trait::async_trait;
use bson::{doc, DateTime, Document};

use super::codec::{encode_dead_letter, encoded_len};
use super::store_error::StoreError;
use crate::event::ResumeToken;

/// The life of a dead-letter record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadLetterStatus {
    /// Waiting for an operator.
    Pending,
    /// Replayed through the stream's handler successfully.
    Replayed,
    /// Discarded by an operator.
    Discarded,
}

impl DeadLetterStatus {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Replayed => "replayed",
            Self::Discarded => "discarded",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "replayed" => Some(Self::Replayed),
            "discarded" => Some(Self::Discarded),
            _ => None,
        }
    }
}

/// One dead-lettered event (`_fw_dlq` on MongoDB).
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterRecord {
    /// Idempotent identity: derived from the stream and the event's token, so a redelivered
    /// or replayed event never creates a second record.
    pub id: String,
    /// The stream.
    pub stream: String,
    /// The raw event (truncated with a `_fw_truncated` marker when too large to store).
    pub event: Document,
    /// Whether `event` was truncated.
    pub truncated: bool,
    /// The event's resume token.
    pub token: ResumeToken,
    /// `operationType`.
    pub operation_type: String,
    /// `documentKey`.
    pub document_key: Option<Document>,
    /// The error and its sources, outermost first.
    pub error_chain: Vec<String>,
    /// The error's class (`Failed`, `Panicked`, `Decode`, ...).
    pub error_kind: String,
    /// Attempts made.
    pub attempts: u32,
    /// First failure.
    pub first_failed_at: DateTime,
    /// Last failure.
    pub last_failed_at: DateTime,
    /// Status.
    pub status: DeadLetterStatus,
    /// The writing leader's identity (`SingleLeader` streams).
    pub owner: Option<String>,
    /// The writing leader's fencing epoch (`SingleLeader` streams).
    pub epoch: Option<i64>,
}

impl DeadLetterRecord {
    /// The record's id for an event of `stream` with `token`.
    pub fn id_for(stream: &str, token: &ResumeToken) -> String {
        format!("{stream}:{token}")
    }

    /// Shrinks the record under `max_bytes` by replacing the event's body with a marker that
    /// keeps its identity (token, operation, namespace, key) and its original size.
    pub fn truncate_to(&mut self, max_bytes: usize) {
        let size = encoded_len(&encode_dead_letter(self));
        if size <= max_bytes {
            return;
        }
        let mut kept = Document::new();
        for key in [
            "_id",
            "operationType",
            "ns",
            "documentKey",
            "clusterTime",
            "wallTime",
        ] {
            if let Some(v) = self.event.get(key) {
                kept.insert(key, v.clone());
            }
        }
        kept.insert(
            "_fw_truncated",
            doc! { "originalBytes": size as i64, "limitBytes": max_bytes as i64 },
        );
        self.event = kept;
        self.truncated = true;
        for line in &mut self.error_chain {
            if line.len() > 4096 {
                let mut cut = 4096;
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                line.truncate(cut);
                line.push_str("…[truncated]");
            }
        }
    }
}

/// A listing query.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadLetterQuery {
    /// Only this stream.
    pub stream: Option<String>,
    /// Only this status.
    pub status: Option<DeadLetterStatus>,
    /// At most this many (oldest first).
    pub limit: Option<usize>,
}

/// What a `put` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// A new record was stored.
    Inserted,
    /// A record with this id existed; its attempts and last failure were updated.
    AlreadyPresent,
}

/// Where dead letters live (`_fw_dlq` on MongoDB).
#[async_trait]
pub trait DeadLetterStore: Send + Sync + 'static {
    /// Stores a record, idempotently by `id`.
    async fn put(&self, record: &DeadLetterRecord) -> Result<PutOutcome, StoreError>;

    /// Lists records, oldest first.
    async fn list(&self, query: &DeadLetterQuery) -> Result<Vec<DeadLetterRecord>, StoreError>;

    /// One record.
    async fn get(&self, id: &str) -> Result<Option<DeadLetterRecord>, StoreError>;

    /// Sets a record's status; `false` when there is no such record.
    async fn set_status(&self, id: &str, status: DeadLetterStatus) -> Result<bool, StoreError>;

    /// The largest record this store accepts, in encoded bytes: the engine truncates a record
    /// above it (see [`DeadLetterRecord::truncate_to`]). A store of BSON documents answers
    /// [`crate::port::codec::MAX_BSON_RECORD_BYTES`].
    fn max_record_bytes(&self) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::codec::decode_dead_letter;

    fn record(event: Document) -> DeadLetterRecord {
        let token = ResumeToken::from_document(doc! {"_data": "AA"});
        DeadLetterRecord {
            id: DeadLetterRecord::id_for("s", &token),
            stream: "s".into(),
            event,
            truncated: false,
            token,
            operation_type: "insert".into(),
            document_key: Some(doc! {"_id": 1}),
            error_chain: vec!["boom".into()],
            error_kind: "Failed".into(),
            attempts: 3,
            first_failed_at: DateTime::from_millis(1),
            last_failed_at: DateTime::from_millis(2),
            status: DeadLetterStatus::Pending,
            owner: None,
            epoch: None,
        }
    }

    #[test]
    fn round_trips() {
        let r = record(doc! {"_id": {"_data": "AA"}, "operationType": "insert"});
        assert_eq!(decode_dead_letter(&encode_dead_letter(&r)), Ok(r));
    }

    #[test]
    fn truncation_keeps_identity_and_marks() {
        let big = "x".repeat(10_000);
        let mut r = record(
            doc! {"_id": {"_data": "AA"}, "operationType": "insert", "documentKey": {"_id": 1}, "fullDocument": {"blob": big}},
        );
        r.truncate_to(2_000);
        assert!(r.truncated);
        assert!(r.event.get_document("_fw_truncated").is_ok());
        assert_eq!(
            r.event.get_document("documentKey").ok(),
            Some(&doc! {"_id": 1})
        );
        assert!(encoded_len(&encode_dead_letter(&r)) <= 2_000);
    }

    #[test]
    fn small_records_are_untouched() {
        let mut r = record(doc! {"_id": {"_data": "AA"}});
        let before = r.clone();
        r.truncate_to(1_000_000);
        assert_eq!(r, before);
    }
}
