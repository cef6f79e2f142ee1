//! The initial snapshot (`start_position = Snapshot`): what a scanned document looks like to
//! the handlers (an insert event marked as a snapshot read), and which `#[pipeline]`
//! conditions the scan can apply itself ([`pushdown`]). The scan itself is a phase of the
//! stream's worker (`worker/snapshot.rs`).

pub(crate) mod pushdown;

use bson::{doc, Bson, Document};

use crate::context::ChangeContext;
use crate::event::{ChangeEvent, EventParseError, Namespace, ResumeToken};

/// The top-level field that marks a raw event as a snapshot read. Change events of the
/// server never carry it; the runtime sets it on the insert events it builds from scanned
/// documents, so a dead-lettered snapshot read is still recognisable as one when replayed.
pub(crate) const SNAPSHOT_FIELD: &str = "snapshot";

impl ChangeEvent {
    /// Builds the insert event an initial snapshot hands over for one scanned document:
    /// `operationType: "insert"`, `ns`, `documentKey: {_id}`, `fullDocument`, and
    /// `snapshot: true`. Its token (`_id`) is not a stream position (it is never stored as
    /// one): it names the snapshot's recorded start and the document's `_id`, so the event's
    /// identity ([`crate::EventId`]) is the same when a restarted scan reads the document
    /// again. Fails when the document has no `_id`.
    pub fn snapshot_read(
        namespace: &Namespace,
        start: &ResumeToken,
        document: Document,
    ) -> Result<ChangeEvent, EventParseError> {
        let Some(id) = document.get("_id").cloned() else {
            return Err(EventParseError {
                reason: "a scanned document has no `_id`".into(),
            });
        };
        let token =
            doc! {"_data": format!("snapshot:{start}:{}", id.clone().into_relaxed_extjson())};
        let mut ns = doc! {"db": &namespace.db};
        if let Some(coll) = &namespace.coll {
            ns.insert("coll", coll);
        }
        ChangeEvent::from_raw(doc! {
            "_id": token,
            "operationType": "insert",
            "ns": ns,
            "documentKey": {"_id": id},
            "fullDocument": document,
            SNAPSHOT_FIELD: true,
        })
    }

    /// Whether this event is a document read by an initial snapshot rather than a change the
    /// server reported (see [`ChangeEvent::snapshot_read`]).
    pub fn is_snapshot(&self) -> bool {
        matches!(self.raw().get(SNAPSHOT_FIELD), Some(Bson::Boolean(true)))
    }
}

impl<T> ChangeContext<T> {
    /// Whether the event is a document read by the initial snapshot
    /// (`start_position = Snapshot`) and not a change: the insert handler sees both, and may
    /// treat a snapshot read as "this document exists" rather than "it was just created".
    pub fn is_snapshot(&self) -> bool {
        self.event().is_snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::OperationType;

    #[test]
    fn a_scanned_document_becomes_an_insert_marked_as_a_snapshot_read() {
        let ns = Namespace {
            db: "shop".into(),
            coll: Some("orders".into()),
        };
        let start = ResumeToken::from_document(doc! {"_data": "82AA"});
        let e = ChangeEvent::snapshot_read(&ns, &start, doc! {"_id": 7, "total": 3})
            .expect("a document with an _id");
        assert!(e.is_snapshot());
        assert_eq!(e.operation_type(), &OperationType::Insert);
        assert_eq!(e.namespace(), &ns);
        assert_eq!(e.document_key(), Some(&doc! {"_id": 7}));
        assert_eq!(e.full_document(), Some(&doc! {"_id": 7, "total": 3}));
        assert_eq!(e.token().data(), Some("snapshot:82AA:7"));
        // The same document under the same start has the same identity; a string `_id`
        // that prints like a number does not collide with it.
        let again =
            ChangeEvent::snapshot_read(&ns, &start, doc! {"_id": 7, "total": 4}).expect("parses");
        assert_eq!(again.token(), e.token());
        let text = ChangeEvent::snapshot_read(&ns, &start, doc! {"_id": "7"}).expect("parses");
        assert_ne!(text.token(), e.token());
        assert!(ChangeEvent::snapshot_read(&ns, &start, doc! {"total": 1}).is_err());
        // A server event is never a snapshot read.
        let change =
            ChangeEvent::from_raw(doc! {"_id": {"_data": "82AB"}, "operationType": "insert"})
                .expect("parses");
        assert!(!change.is_snapshot());
    }
}
