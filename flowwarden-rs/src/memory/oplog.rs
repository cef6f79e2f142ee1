//! Oplog entries of the in-memory backend, their tokens, and the change events built from them.

use std::sync::Arc;

use bson::{doc, Bson, DateTime, Document, Timestamp};

use crate::definition::{FullDocument, FullDocumentBeforeChange};
use crate::event::ResumeToken;
use crate::matcher::update::UpdateChanges;

/// What an oplog entry records.
#[derive(Debug, Clone)]
pub(crate) enum OpKind {
    Insert,
    Update(UpdateChanges),
    Replace,
    Delete,
    Drop,
    Rename { to_db: String, to_coll: String },
}

/// One write, as the change stream sees it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) seq: u64,
    pub(crate) db: String,
    pub(crate) coll: String,
    pub(crate) kind: OpKind,
    pub(crate) key: Option<Document>,
    /// The document after the write (post-image), for insert, update and replace.
    pub(crate) post: Option<Arc<Document>>,
    /// The document before the write (pre-image), for update, replace and delete.
    pub(crate) pre: Option<Arc<Document>>,
    pub(crate) wall: DateTime,
}

const BASE_SECS: u32 = 1_767_225_600;

/// The token of the entry with sequence `seq` (ordered as strings and as numbers).
pub(crate) fn token(seq: u64) -> ResumeToken {
    ResumeToken::from_document(doc! { "_data": format!("{seq:016X}") })
}

/// The token of the invalidate that follows the drop or rename at `seq`.
pub(crate) fn invalidate_token(seq: u64) -> ResumeToken {
    ResumeToken::from_document(doc! { "_data": format!("{seq:016X}FF") })
}

/// A parsed token: the sequence it follows, and whether it is an invalidate's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ParsedToken {
    pub(crate) seq: u64,
    pub(crate) invalidate: bool,
}

pub(crate) fn parse_token(t: &ResumeToken) -> Option<ParsedToken> {
    let data = t.data()?;
    if t.as_document().len() != 1 {
        return None;
    }
    let (head, tail) = if data.len() == 18 {
        data.split_at(16)
    } else if data.len() == 16 {
        (data, "")
    } else {
        return None;
    };
    let seq = u64::from_str_radix(head, 16).ok()?;
    match tail {
        "" => Some(ParsedToken {
            seq,
            invalidate: false,
        }),
        "FF" => Some(ParsedToken {
            seq,
            invalidate: true,
        }),
        _ => None,
    }
}

pub(crate) fn cluster_time(seq: u64) -> Timestamp {
    Timestamp {
        time: BASE_SECS + (seq >> 32) as u32,
        increment: seq as u32,
    }
}

/// The first sequence number at or after an operation time.
pub(crate) fn seq_at(ts: Timestamp) -> u64 {
    if ts.time < BASE_SECS {
        return 0;
    }
    (u64::from(ts.time - BASE_SECS) << 32) | u64::from(ts.increment)
}

impl Entry {
    /// Builds the change event for this entry as a collection stream with these options
    /// would deliver it. `current` is the document as it is now (for `updateLookup`).
    pub(crate) fn event(
        &self,
        full_document: FullDocument,
        before: FullDocumentBeforeChange,
        current: Option<&Document>,
    ) -> Document {
        let op = match &self.kind {
            OpKind::Insert => "insert",
            OpKind::Update(_) => "update",
            OpKind::Replace => "replace",
            OpKind::Delete => "delete",
            OpKind::Drop => "drop",
            OpKind::Rename { .. } => "rename",
        };
        let mut ev = doc! {
            "_id": token(self.seq).into_document(),
            "operationType": op,
            "clusterTime": cluster_time(self.seq),
            "wallTime": self.wall,
            "ns": { "db": &self.db, "coll": &self.coll },
        };
        if let Some(key) = &self.key {
            ev.insert("documentKey", key.clone());
        }
        match &self.kind {
            OpKind::Insert | OpKind::Replace => {
                ev.insert("fullDocument", image(self.post.as_ref()));
            }
            OpKind::Update(changes) => {
                ev.insert(
                    "updateDescription",
                    doc! {
                        "updatedFields": changes.updated_fields.clone(),
                        "removedFields": changes.removed_fields.clone(),
                        "truncatedArrays": Bson::Array(vec![]),
                    },
                );
                match full_document {
                    FullDocument::Default => {}
                    FullDocument::UpdateLookup => {
                        ev.insert("fullDocument", opt(current.cloned()));
                    }
                    FullDocument::WhenAvailable | FullDocument::Required => {
                        ev.insert("fullDocument", image(self.post.as_ref()));
                    }
                }
            }
            OpKind::Rename { to_db, to_coll } => {
                ev.insert("to", doc! { "db": to_db, "coll": to_coll });
            }
            OpKind::Delete | OpKind::Drop => {}
        }
        if before != FullDocumentBeforeChange::Off
            && matches!(
                self.kind,
                OpKind::Update(_) | OpKind::Replace | OpKind::Delete
            )
        {
            ev.insert("fullDocumentBeforeChange", image(self.pre.as_ref()));
        }
        ev
    }

    /// The invalidate event that follows a drop or rename of the watched collection.
    pub(crate) fn invalidate_event(&self) -> Document {
        doc! {
            "_id": invalidate_token(self.seq).into_document(),
            "operationType": "invalidate",
            "clusterTime": cluster_time(self.seq),
            "wallTime": self.wall,
        }
    }
}

fn opt(d: Option<Document>) -> Bson {
    d.map(Bson::Document).unwrap_or(Bson::Null)
}

fn image(d: Option<&Arc<Document>>) -> Bson {
    opt(d.map(|d| (**d).clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_order() {
        assert_eq!(
            parse_token(&token(42)),
            Some(ParsedToken {
                seq: 42,
                invalidate: false
            })
        );
        assert_eq!(
            parse_token(&invalidate_token(42)),
            Some(ParsedToken {
                seq: 42,
                invalidate: true
            })
        );
        let a = token(9).data().map(str::to_owned);
        let b = token(10).data().map(str::to_owned);
        assert!(a < b);
        assert!(parse_token(&ResumeToken::from_document(doc! {"_data": "zz"})).is_none());
    }

    #[test]
    fn cluster_time_maps_back_to_seq() {
        for seq in [0u64, 1, 77, 1 << 33] {
            assert_eq!(seq_at(cluster_time(seq)), seq);
        }
    }
}
