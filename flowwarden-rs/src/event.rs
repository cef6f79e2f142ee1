//! The raw change event as the source delivers it, and the fields the runtime reads from it.
//!
//! The event keeps MongoDB's shape (`_id`, `operationType`, `ns`, `documentKey`, ...) as a
//! BSON document. Decoding the user's document type happens later, in the runtime, so an
//! undecodable document is a failure of that event and never moves a position by itself.

use std::fmt;
use std::sync::{Arc, LazyLock, OnceLock};

use bson::{Bson, DateTime, Document, Timestamp};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An opaque, ordered stream position as the server issues it (`{_data: "<hex>"}`).
///
/// The document is shared: cloning a token (the tracker, the checkpoint, the lag probe and the
/// dead-letter record each keep one) copies a pointer, not the document. The token of a
/// received event ([`ChangeEvent::token`]) is the event's own `_id`, read in place, so a clone
/// of it keeps the event's raw document alive as long as it lives; the runtime keeps such a
/// clone only for the latest settled positions. It serializes as the bare document.
#[derive(Clone)]
pub struct ResumeToken(Repr);

#[derive(Clone)]
enum Repr {
    /// A token document of its own.
    Own(Arc<Document>),
    /// The `_id` of this raw change event (a document, checked when the event was received).
    InEvent(Arc<Document>),
}

/// The `_id` document of a raw event whose `_id` was checked to be a document. The server puts
/// `_id` first; any other place is looked up.
fn event_id(raw: &Document) -> &Document {
    static EMPTY: LazyLock<Document> = LazyLock::new(Document::new);
    match raw.iter().next() {
        Some((key, Bson::Document(id))) if key == "_id" => id,
        _ => match raw.get("_id") {
            Some(Bson::Document(id)) => id,
            // Unreachable: the event was checked on receipt and cannot be changed since.
            _ => &EMPTY,
        },
    }
}

impl ResumeToken {
    /// Wraps a token document as the server returned it.
    pub fn from_document(doc: Document) -> Self {
        Self(Repr::Own(Arc::new(doc)))
    }

    /// The token of a raw event whose `_id` the caller checked to be a document, sharing it.
    fn of_event(raw: &Arc<Document>) -> Self {
        Self(Repr::InEvent(raw.clone()))
    }

    /// The token as a BSON document, for storing it or handing it back to the server.
    pub fn as_document(&self) -> &Document {
        match &self.0 {
            Repr::Own(doc) => doc,
            Repr::InEvent(raw) => event_id(raw),
        }
    }

    /// Consumes the token into its document (a copy only when the token is still shared).
    pub fn into_document(self) -> Document {
        match self.0 {
            Repr::Own(doc) => Arc::unwrap_or_clone(doc),
            Repr::InEvent(raw) => event_id(&raw).clone(),
        }
    }

    /// The same token, holding its document on its own (not its event's): for a position that
    /// is kept for long, so it does not keep a whole event alive.
    pub(crate) fn detached(&self) -> Self {
        match &self.0 {
            Repr::Own(_) => self.clone(),
            Repr::InEvent(raw) => Self::from_document(event_id(raw).clone()),
        }
    }

    /// The `_data` string of the token, when it has one.
    pub fn data(&self) -> Option<&str> {
        self.as_document().get_str("_data").ok()
    }

    /// The order of two positions of one stream, when both tokens carry a hex `_data` string:
    /// MongoDB documents that such tokens (4.0 and later) sort in event order by `_data`, and
    /// the in-memory backend and the emulator issue tokens that do too. `None` for anything
    /// else (3.6 binary tokens, foreign shapes): then the runtime does not compare.
    pub fn position_cmp(&self, other: &ResumeToken) -> Option<std::cmp::Ordering> {
        let hex = |t: &ResumeToken| {
            t.data()
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_hexdigit()))
                .map(str::to_ascii_uppercase)
        };
        Some(hex(self)?.cmp(&hex(other)?))
    }

    /// The cluster time a token stands at, decoded from its `_data` string.
    ///
    /// MongoDB 4.2 and later issue `_data` as uppercase hex of a KeyString whose first value
    /// is the event's cluster time: the type byte `0x82` (a BSON timestamp), then the
    /// timestamp as 8 bytes big-endian, seconds first, then the increment. A post-batch token
    /// (of an empty or fully filtered batch) has the same shape, so this also tells how far a
    /// stream has scanned where no event carries a `clusterTime`. `None` for anything else:
    /// the 3.6 and 4.0 binary tokens, tokens of another source, a foreign shape. The runtime
    /// uses it only to measure lag, never to order or resume.
    pub fn cluster_time(&self) -> Option<Timestamp> {
        let data = self.data()?;
        let head = data.get(..18)?;
        if !head.bytes().all(|b| b.is_ascii_hexdigit()) || !head[..2].eq_ignore_ascii_case("82") {
            return None;
        }
        let time = u32::from_str_radix(&head[2..10], 16).ok()?;
        let increment = u32::from_str_radix(&head[10..18], 16).ok()?;
        Some(Timestamp { time, increment })
    }
}

impl PartialEq for ResumeToken {
    fn eq(&self, other: &Self) -> bool {
        self.as_document() == other.as_document()
    }
}

impl fmt::Debug for ResumeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResumeToken")
            .field(self.as_document())
            .finish()
    }
}

impl Serialize for ResumeToken {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.as_document().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ResumeToken {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Document::deserialize(deserializer).map(Self::from_document)
    }
}

impl fmt::Display for ResumeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.data() {
            Some(data) => f.write_str(data),
            None => write!(f, "{}", self.as_document()),
        }
    }
}

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
#[derive(Clone)]
pub struct ChangeEvent {
    raw: Arc<Document>,
    token: ResumeToken,
    operation_type: OperationType,
    cluster_time: Option<Timestamp>,
    wall_time: Option<DateTime>,
    namespace: OnceLock<Namespace>,
    update_description: OnceLock<Option<UpdateDescription>>,
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
        // One pass over the top-level fields (a handful) instead of a lookup per field.
        let (mut has_token, mut operation, mut cluster_time, mut wall_time) =
            (false, None, None, None);
        for (key, value) in &raw {
            match (key.as_str(), value) {
                ("_id", value) => has_token = matches!(value, Bson::Document(_)),
                ("operationType", Bson::String(op)) => operation = Some(op.as_str()),
                ("clusterTime", Bson::Timestamp(ts)) => cluster_time = Some(*ts),
                ("wallTime", Bson::DateTime(time)) => wall_time = Some(*time),
                _ => {}
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
        let raw = Arc::new(raw);
        Ok(Self {
            token: ResumeToken::of_event(&raw),
            operation_type,
            cluster_time,
            wall_time,
            namespace: OnceLock::new(),
            update_description: OnceLock::new(),
            raw,
        })
    }

    /// The whole event as the source delivered it.
    pub fn raw(&self) -> &Document {
        &self.raw
    }

    /// The event's resume token (`_id`).
    pub fn token(&self) -> &ResumeToken {
        &self.token
    }

    /// `operationType`.
    pub fn operation_type(&self) -> &OperationType {
        &self.operation_type
    }

    /// `ns` (empty when the event has none).
    pub fn namespace(&self) -> &Namespace {
        self.namespace
            .get_or_init(|| match self.raw.get_document("ns") {
                Ok(ns) => Namespace {
                    db: ns.get_str("db").unwrap_or_default().to_owned(),
                    coll: ns.get_str("coll").ok().map(str::to_owned),
                },
                Err(_) => Namespace::default(),
            })
    }

    /// `documentKey` (the `_id`, plus the shard key on sharded collections).
    pub fn document_key(&self) -> Option<&Document> {
        self.raw.get_document("documentKey").ok()
    }

    /// `clusterTime`: the operation's time in the oplog.
    pub fn cluster_time(&self) -> Option<Timestamp> {
        self.cluster_time
    }

    /// `wallTime`: the server's wall clock when the operation ran.
    pub fn wall_time(&self) -> Option<DateTime> {
        self.wall_time
    }

    /// `txnNumber`, for events written in a transaction.
    pub fn txn_number(&self) -> Option<i64> {
        self.raw.get_i64("txnNumber").ok()
    }

    /// `lsid`, for events written in a session.
    pub fn lsid(&self) -> Option<&Document> {
        self.raw.get_document("lsid").ok()
    }

    /// `updateDescription`, for updates.
    pub fn update_description(&self) -> Option<&UpdateDescription> {
        self.update_description
            .get_or_init(|| {
                self.raw
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
        self.raw
            .get_document("splitEvent")
            .ok()
            .map(|s| SplitEvent {
                fragment: int_field(s, "fragment").unwrap_or(1),
                of: int_field(s, "of").unwrap_or(1),
            })
    }

    /// `fullDocument`, when present and not null.
    pub fn full_document(&self) -> Option<&Document> {
        self.raw.get_document("fullDocument").ok()
    }

    /// `fullDocumentBeforeChange`, when present and not null.
    pub fn full_document_before_change(&self) -> Option<&Document> {
        self.raw.get_document("fullDocumentBeforeChange").ok()
    }
}

impl fmt::Debug for ChangeEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeEvent")
            .field("raw", &self.raw)
            .field("token", &self.token)
            .field("operation_type", &self.operation_type)
            .field("namespace", self.namespace())
            .field("document_key", &self.document_key())
            .field("cluster_time", &self.cluster_time)
            .field("wall_time", &self.wall_time)
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
    fn a_token_serializes_as_its_bare_document_and_clones_share_it() {
        let doc = doc! {"_data": "8200AB"};
        let token = ResumeToken::from_document(doc.clone());
        assert_eq!(
            bson::to_bson(&token).expect("serializes"),
            Bson::Document(doc.clone())
        );
        let back: ResumeToken = bson::from_bson(Bson::Document(doc.clone())).expect("deserializes");
        assert_eq!(back, token);
        let copy = token.clone();
        assert!(std::ptr::eq(copy.as_document(), token.as_document()));
        assert_eq!(copy.into_document(), doc, "a shared token copies out");
        assert_eq!(token.into_document(), doc, "the last one moves out");
    }

    #[test]
    fn an_event_token_is_its_id_read_in_place() {
        let raw = doc! {"_id": {"_data": "00AE"}, "operationType": "insert"};
        let ev = ChangeEvent::from_raw(raw.clone()).expect("parses");
        let id = ev.raw().get_document("_id").expect("id");
        assert!(std::ptr::eq(ev.token().as_document(), id), "not a copy");
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
    fn tokens_with_hex_data_compare_by_position() {
        use std::cmp::Ordering;
        let t = |d: &str| ResumeToken::from_document(doc! {"_data": d});
        assert_eq!(t("8200A1").position_cmp(&t("8200b2")), Some(Ordering::Less));
        assert_eq!(
            t("0005FF").position_cmp(&t("0005")),
            Some(Ordering::Greater)
        );
        assert_eq!(t("00AB").position_cmp(&t("00ab")), Some(Ordering::Equal));
        assert_eq!(t("zz").position_cmp(&t("00")), None);
        let binary = ResumeToken::from_document(doc! {"_data": 1});
        assert_eq!(binary.position_cmp(&t("00")), None);
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

    #[test]
    fn cluster_time_is_decoded_from_real_token_shapes() {
        // An insert's token as MongoDB 6.0 prints it in its manual (clusterTime
        // Timestamp(1666193824, 1)): 0x82, the timestamp, then version, type, document key.
        let event = ResumeToken::from_document(bson::doc! {"_data":
        "82635019A0000000012B042C0100296E5A1004AB1154ACACD849A48C61756D70D3B21F463C6F7065726174696F6E54797065003C696E736572740046646F63756D656E744B65790046645F69640064635019A078BE67426D7CF4D2000004"});
        assert_eq!(
            event.cluster_time(),
            Some(Timestamp {
                time: 1_666_193_824,
                increment: 1
            })
        );
        // A post-batch resume token of an empty batch: the timestamp, then the high-water
        // mark's fields only.
        let post_batch =
            ResumeToken::from_document(bson::doc! {"_data": "8265A1B2C3000000072B0229296E04"});
        assert_eq!(
            post_batch.cluster_time(),
            Some(Timestamp {
                time: 0x65A1_B2C3,
                increment: 7
            })
        );
        // Lowercase hex decodes the same.
        let lower =
            ResumeToken::from_document(bson::doc! {"_data": "8265a1b2c3000000072b0229296e04"});
        assert_eq!(lower.cluster_time(), post_batch.cluster_time());
    }

    #[test]
    fn tokens_without_a_leading_timestamp_have_no_cluster_time() {
        for data in [
            "",
            "82",
            "82635019A0",
            "81635019A0000000012B",
            "8263501ZA0000000012B04",
            "0000000000000001",
            "82é3501A0000000012B",
            "82+635019A000000012B",
        ] {
            let t = ResumeToken::from_document(bson::doc! {"_data": data});
            assert_eq!(t.cluster_time(), None, "{data:?}");
        }
        let binary = ResumeToken::from_document(bson::doc! {"_data": bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: vec![0x82, 0, 0, 0, 1, 0, 0, 0, 1],
        }});
        assert_eq!(binary.cluster_time(), None);
        assert_eq!(
            ResumeToken::from_document(bson::doc! {}).cluster_time(),
            None
        );
    }
}
