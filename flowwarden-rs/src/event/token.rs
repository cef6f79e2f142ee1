//! [`ResumeToken`]: a stream position, shared rather than copied.

use std::fmt;
use std::sync::{Arc, LazyLock};

use bson::{Bson, Document, Timestamp};

use super::EventBody;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An opaque, ordered stream position as the server issues it (`{_data: "<hex>"}`).
///
/// The document is shared: cloning a token (the tracker, the checkpoint, the lag probe and the
/// dead-letter record each keep one) copies a pointer, not the document. The token of a
/// received event ([`super::ChangeEvent::token`]) is the event's own `_id`, read in place, so a clone
/// of it keeps the event's raw document alive as long as it lives; the runtime keeps such a
/// clone only for the latest settled positions. It serializes as the bare document.
#[derive(Clone)]
pub struct ResumeToken(Repr);

#[derive(Clone)]
enum Repr {
    /// A token document of its own.
    Own(Arc<Document>),
    /// The `_id` of this received event (a document, checked when the event was received).
    InEvent(Arc<EventBody>),
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

    /// The token of an event whose `_id` the caller checked to be a document: a view of the
    /// event's body, which it shares.
    pub(super) fn of_event(body: Arc<EventBody>) -> Self {
        Self(Repr::InEvent(body))
    }

    /// The body of the event this token is a view of, if it is one.
    pub(super) fn event_body(&self) -> Option<&EventBody> {
        match &self.0 {
            Repr::Own(_) => None,
            Repr::InEvent(body) => Some(body),
        }
    }

    /// The token as a BSON document, for storing it or handing it back to the server.
    pub fn as_document(&self) -> &Document {
        match &self.0 {
            Repr::Own(doc) => doc,
            Repr::InEvent(body) => event_id(body.raw()),
        }
    }

    /// Consumes the token into its document (a copy only when the token is still shared).
    pub fn into_document(self) -> Document {
        match self.0 {
            Repr::Own(doc) => Arc::unwrap_or_clone(doc),
            Repr::InEvent(body) => event_id(body.raw()).clone(),
        }
    }

    /// The same token, holding its document on its own (not its event's): for a position that
    /// is kept for long, so it does not keep a whole event alive.
    pub(crate) fn detached(&self) -> Self {
        match &self.0 {
            Repr::Own(_) => self.clone(),
            Repr::InEvent(body) => Self::from_document(event_id(body.raw()).clone()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

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
