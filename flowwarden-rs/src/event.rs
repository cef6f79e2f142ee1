//! The raw change event as the source delivers it, and the fields the runtime reads from it.
//!
//! The event keeps MongoDB's shape (`_id`, `operationType`, `ns`, `documentKey`, ...) as a
//! BSON document. Decoding the user's document type happens later, in the runtime, so an
//! undecodable document is a failure of that event and never moves a position by itself.

mod token;

use std::fmt;
use std::sync::{Arc, LazyLock, OnceLock};

use bson::{Bson, DateTime, Document, Timestamp};

pub use token::ResumeToken;

/// What happened to the document (`operationType`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OperationType {
    /// A document was inserted.
    Insert,
    /// A document was updated with operators.
    Update,
    /// A document was replaced.
    Replace,
    /// A document was deleted.
    Delete,
    /// The watched collection was dropped.
    Drop,
    /// The watched collection was renamed.
    Rename,
    /// The watched database was dropped.
    DropDatabase,
    /// The stream can no longer continue (after a drop or rename); the cursor closes.
    Invalidate,
    /// Any other operation type the server reports.
    Other(String),
}

impl OperationType {
    /// Parses the server's `operationType` string.
    pub fn parse(s: &str) -> Self {
        match s {
            "insert" => Self::Insert,
            "update" => Self::Update,
            "replace" => Self::Replace,
            "delete" => Self::Delete,
            "drop" => Self::Drop,
            "rename" => Self::Rename,
            "dropDatabase" => Self::DropDatabase,
            "invalidate" => Self::Invalidate,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The server's spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Insert => "insert",
            Self::Update => "update",
            Self::Replace => "replace",
            Self::Delete => "delete",
            Self::Drop => "drop",
            Self::Rename => "rename",
            Self::DropDatabase => "dropDatabase",
            Self::Invalidate => "invalidate",
            Self::Other(s) => s,
        }
    }
}

impl fmt::Display for OperationType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The namespace of an event (`ns`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Namespace {
    /// Database name.
    pub db: String,
    /// Collection name; absent for database-level events.
    pub coll: Option<String>,
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.coll {
            Some(c) => write!(f, "{}.{}", self.db, c),
            None => f.write_str(&self.db),
        }
    }
}

/// What an update changed (`updateDescription`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateDescription {
    /// Fields set by the update, with their new values (dotted paths as keys).
    pub updated_fields: Document,
    /// Fields removed by the update.
    pub removed_fields: Vec<String>,
    /// Arrays truncated by the update (`{field, newSize}` documents).
    pub truncated_arrays: Vec<Document>,
}

/// A fragment marker of `$changeStreamSplitLargeEvent` (`splitEvent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitEvent {
    /// 1-based fragment number.
    pub fragment: u32,
    /// Number of fragments.
    pub of: u32,
}

/// An event as received from the source: the raw document plus the fields the runtime routes on.
///
/// Only what every event needs is read when it is received (the token, the operation type and
/// the times); the other fields are read from the raw document when asked for (`documentKey`,
/// `lsid`, `txnNumber`, `splitEvent` in place, `ns` and `updateDescription` once, then kept),
/// so an event is not copied on its way to the handler.
///
/// A `ChangeEvent` is a handle: the raw document and what was read from it sit in one shared
/// allocation, which the event's token ([`ChangeEvent::token`]) is a view of. Cloning an event
/// (the runtime and the handler's context each keep one) copies a pointer.
#[derive(Clone)]
pub struct ChangeEvent {
    /// Always the event's own token, a view of its body (`ResumeToken::of_event`).
    token: ResumeToken,
}

/// What one received event is made of: its raw document and the fields read from it, in one
/// allocation shared by every clone of the event and of its token.
pub(crate) struct EventBody {
    raw: Document,
    operation_type: OperationType,
    cluster_time: Option<Timestamp>,
    wall_time: Option<DateTime>,
    namespace: OnceLock<Namespace>,
    update_description: OnceLock<Option<UpdateDescription>>,
}

impl EventBody {
    /// The raw change event.
    pub(crate) fn raw(&self) -> &Document {
        &self.raw
    }
}

/// A raw event the runtime cannot even identify (no usable `_id` or `operationType`).
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("malformed change event: {reason}")]
pub struct EventParseError {
    /// What is missing or wrong.
    pub reason: String,
}

impl ChangeEvent {
    /// Reads the routing fields of a raw event. Fails only when the event cannot be identified
    /// (no `_id` token document or no `operationType`); other odd fields are left to decoding.
    pub fn from_raw(raw: Document) -> Result<Self, EventParseError> {
        // One pass over the top-level fields (a handful) instead of a lookup per field, ending
        // once the four are found (the server sends them first).
        let (mut has_token, mut operation, mut cluster_time, mut wall_time) =
            (false, None, None, None);
        let mut found = 0;
        for (key, value) in &raw {
            match (key.as_str(), value) {
                ("_id", value) => has_token = matches!(value, Bson::Document(_)),
                ("operationType", Bson::String(op)) => operation = Some(op.as_str()),
                ("clusterTime", Bson::Timestamp(ts)) => cluster_time = Some(*ts),
                ("wallTime", Bson::DateTime(time)) => wall_time = Some(*time),
                _ => continue,
            }
            found += 1;
            if found == 4 {
                break;
            }
        }
        if !has_token {
            return Err(EventParseError {
                reason: "`_id` (the resume token) is missing or not a document".into(),
            });
        }
        let Some(operation) = operation else {
            return Err(EventParseError {
                reason: "`operationType` is missing or not a string".into(),
            });
        };
        let operation_type = OperationType::parse(operation);
        let body = Arc::new(EventBody {
            raw,
            operation_type,
            cluster_time,
            wall_time,
            namespace: OnceLock::new(),
            update_description: OnceLock::new(),
        });
        Ok(Self {
            token: ResumeToken::of_event(body),
        })
    }

    /// The event's body. Every event is made by [`ChangeEvent::from_raw`], whose token is a
    /// view of one; the empty body is never reached.
    fn body(&self) -> &EventBody {
        static EMPTY: LazyLock<EventBody> = LazyLock::new(|| EventBody {
            raw: Document::new(),
            operation_type: OperationType::Other(String::new()),
            cluster_time: None,
            wall_time: None,
            namespace: OnceLock::new(),
            update_description: OnceLock::new(),
        });
        self.token.event_body().unwrap_or(&EMPTY)
    }

    /// The whole event as the source delivered it.
    pub fn raw(&self) -> &Document {
        &self.body().raw
    }

    /// The event's resume token (`_id`).
    pub fn token(&self) -> &ResumeToken {
        &self.token
    }

    /// `operationType`.
    pub fn operation_type(&self) -> &OperationType {
        &self.body().operation_type
    }

    /// `ns` (empty when the event has none).
    pub fn namespace(&self) -> &Namespace {
        let body = self.body();
        body.namespace
            .get_or_init(|| match body.raw.get_document("ns") {
                Ok(ns) => Namespace {
                    db: ns.get_str("db").unwrap_or_default().to_owned(),
                    coll: ns.get_str("coll").ok().map(str::to_owned),
                },
                Err(_) => Namespace::default(),
            })
    }

    /// `documentKey` (the `_id`, plus the shard key on sharded collections).
    pub fn document_key(&self) -> Option<&Document> {
        self.raw().get_document("documentKey").ok()
    }

    /// `clusterTime`: the operation's time in the oplog.
    pub fn cluster_time(&self) -> Option<Timestamp> {
        self.body().cluster_time
    }

    /// `wallTime`: the server's wall clock when the operation ran.
    pub fn wall_time(&self) -> Option<DateTime> {
        self.body().wall_time
    }

    /// `txnNumber`, for events written in a transaction.
    pub fn txn_number(&self) -> Option<i64> {
        self.raw().get_i64("txnNumber").ok()
    }

    /// `lsid`, for events written in a session.
    pub fn lsid(&self) -> Option<&Document> {
        self.raw().get_document("lsid").ok()
    }

    /// `updateDescription`, for updates.
    pub fn update_description(&self) -> Option<&UpdateDescription> {
        let body = self.body();
        body.update_description
            .get_or_init(|| {
                body.raw
                    .get_document("updateDescription")
                    .ok()
                    .map(|u| UpdateDescription {
                        updated_fields: u
                            .get_document("updatedFields")
                            .cloned()
                            .unwrap_or_default(),
                        removed_fields: u
                            .get_array("removedFields")
                            .map(|a| {
                                a.iter()
                                    .filter_map(|b| b.as_str().map(str::to_owned))
                                    .collect()
                            })
                            .unwrap_or_default(),
                        truncated_arrays: u
                            .get_array("truncatedArrays")
                            .map(|a| a.iter().filter_map(|b| b.as_document().cloned()).collect())
                            .unwrap_or_default(),
                    })
            })
            .as_ref()
    }

    /// `splitEvent`, for fragments of a large event.
    pub fn split(&self) -> Option<SplitEvent> {
        self.raw()
            .get_document("splitEvent")
            .ok()
            .map(|s| SplitEvent {
                fragment: int_field(s, "fragment").unwrap_or(1),
                of: int_field(s, "of").unwrap_or(1),
            })
    }

    /// `fullDocument`, when present and not null.
    pub fn full_document(&self) -> Option<&Document> {
        self.raw().get_document("fullDocument").ok()
    }

    /// `fullDocumentBeforeChange`, when present and not null.
    pub fn full_document_before_change(&self) -> Option<&Document> {
        self.raw().get_document("fullDocumentBeforeChange").ok()
    }
}

impl fmt::Debug for ChangeEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeEvent")
            .field("raw", self.raw())
            .field("token", &self.token)
            .field("operation_type", self.operation_type())
            .field("namespace", self.namespace())
            .field("document_key", &self.document_key())
            .field("cluster_time", &self.cluster_time())
            .field("wall_time", &self.wall_time())
            .field("txn_number", &self.txn_number())
            .field("lsid", &self.lsid())
            .field("update_description", &self.update_description())
            .field("split", &self.split())
            .finish()
    }
}

fn int_field(doc: &Document, key: &str) -> Option<u32> {
    match doc.get(key)? {
        Bson::Int32(i) => u32::try_from(*i).ok(),
        Bson::Int64(i) => u32::try_from(*i).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn parses_routing_fields() {
        let raw = doc! {
            "_id": {"_data": "00AB"},
            "operationType": "update",
            "ns": {"db": "shop", "coll": "orders"},
            "documentKey": {"_id": 7},
            "updateDescription": {"updatedFields": {"a": 1}, "removedFields": ["b"], "truncatedArrays": []},
            "clusterTime": Timestamp { time: 5, increment: 1 },
        };
        let ev = ChangeEvent::from_raw(raw).expect("parses");
        assert_eq!(ev.operation_type(), &OperationType::Update);
        assert_eq!(ev.token().data(), Some("00AB"));
        assert_eq!(ev.namespace().to_string(), "shop.orders");
        assert_eq!(ev.document_key(), Some(&doc! {"_id": 7}));
        let ud = ev.update_description().expect("has update description");
        assert_eq!(ud.removed_fields, vec!["b".to_string()]);
        assert_eq!(
            ev.cluster_time(),
            Some(Timestamp {
                time: 5,
                increment: 1
            })
        );
    }

    #[test]
    fn fields_read_on_demand_match_the_raw_event() {
        let lsid = doc! {"id": 1, "uid": 2};
        let raw = doc! {
            "_id": {"_data": "00AC"},
            "operationType": "insert",
            "ns": {"db": "shop"},
            "txnNumber": 9_i64,
            "lsid": lsid.clone(),
            "splitEvent": {"fragment": 2, "of": 3_i64},
            "wallTime": DateTime::from_millis(1_000),
        };
        let ev = ChangeEvent::from_raw(raw.clone()).expect("parses");
        assert_eq!(ev.raw(), &raw, "the raw event is kept whole");
        assert_eq!(
            ev.namespace(),
            &Namespace {
                db: "shop".into(),
                coll: None
            }
        );
        assert_eq!(ev.txn_number(), Some(9));
        assert_eq!(ev.lsid(), Some(&lsid));
        assert_eq!(ev.split(), Some(SplitEvent { fragment: 2, of: 3 }));
        assert_eq!(ev.wall_time(), Some(DateTime::from_millis(1_000)));
        assert_eq!(ev.document_key(), None);
        assert_eq!(ev.update_description(), None);
        assert_eq!(ev.full_document(), None);
        assert_eq!(ev.cluster_time(), None);
        // A clone answers the same, before and after the lazy fields were read.
        let copy = ev.clone();
        assert_eq!(copy.namespace(), ev.namespace());
        assert_eq!(copy.token(), ev.token());

        let bare = ChangeEvent::from_raw(doc! {"_id": {"_data": "00AD"}, "operationType": "drop"})
            .expect("parses");
        assert_eq!(bare.namespace(), &Namespace::default());
        assert_eq!(
            (bare.txn_number(), bare.lsid(), bare.split()),
            (None, None, None)
        );
    }

    #[test]
    fn an_event_token_is_its_id_read_in_place() {
        let raw = doc! {"_id": {"_data": "00AE"}, "operationType": "insert"};
        let ev = ChangeEvent::from_raw(raw.clone()).expect("parses");
        let id = ev.raw().get_document("_id").expect("id");
        assert!(std::ptr::eq(ev.token().as_document(), id), "not a copy");
        let clone = ev.clone();
        assert!(
            std::ptr::eq(clone.raw(), ev.raw()),
            "a clone shares the body"
        );
        assert!(std::ptr::eq(clone.token().as_document(), id));
        assert_eq!(clone.operation_type(), &OperationType::Insert);
        let own = ResumeToken::from_document(doc! {"_data": "00AE"});
        assert_eq!(ev.token(), &own);
        assert_eq!(format!("{:?}", ev.token()), format!("{own:?}"));
        assert_eq!(ev.token().to_string(), "00AE");
        assert_eq!(
            bson::to_bson(ev.token()).expect("serializes"),
            bson::to_bson(&own).expect("serializes")
        );
        // Detached: equal, and no longer the event's.
        let detached = ev.token().detached();
        assert_eq!(detached, own);
        assert!(!std::ptr::eq(detached.as_document(), id));
        assert_eq!(ev.token().clone().into_document(), doc! {"_data": "00AE"});

        // `_id` need not come first.
        let late = ChangeEvent::from_raw(doc! {"operationType": "insert", "_id": {"_data": "01"}})
            .expect("parses");
        assert_eq!(late.token().data(), Some("01"));
        assert_eq!(
            ChangeEvent::from_raw(doc! {"_id": "01", "operationType": "insert"})
                .expect_err("no token document")
                .reason,
            "`_id` (the resume token) is missing or not a document"
        );
    }

    #[test]
    fn rejects_event_without_token() {
        let err = ChangeEvent::from_raw(doc! {"operationType": "insert"}).unwrap_err();
        assert!(err.reason.contains("_id"));
    }

    #[test]
    fn unknown_operation_types_are_kept() {
        assert_eq!(
            OperationType::parse("createIndexes"),
            OperationType::Other("createIndexes".into())
        );
        assert_eq!(
            OperationType::parse("dropDatabase").as_str(),
            "dropDatabase"
        );
    }
}
