//! The data side of multi-document transactions: the writes a transaction holds back until it
//! commits, the session tag its oplog entries carry, and the per-document versions that detect
//! write-write conflicts. The commands (`commitTransaction`, `abortTransaction`, running CRUD
//! inside a transaction) are in `commands/transactions.rs`.

use std::collections::HashMap;

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};

use crate::state::{value_key, OpKind};

/// SHA-256 of the empty string: the `uid` a server without authentication puts in a session id
/// (the digest of no user name).
const NO_AUTH_UID: [u8; 32] = [
    0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
    0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55,
];

/// The session of a committed transaction, carried by each of its oplog entries and shown as
/// `lsid` and `txnNumber` in its change events.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TxnTag {
    /// `{id: <the session UUID>, uid: <SHA-256 of no user>}`.
    pub(crate) lsid: Document,
    pub(crate) txn_number: i64,
}

impl TxnTag {
    /// The tag for a session whose `lsid.id` is `id`.
    pub(crate) fn new(id: &Bson, txn_number: i64) -> TxnTag {
        TxnTag {
            lsid: doc! {
                "id": id.clone(),
                "uid": Binary { subtype: BinarySubtype::Generic, bytes: NO_AUTH_UID.to_vec() },
            },
            txn_number,
        }
    }
}

/// One write: what the oplog entry for it will record.
#[derive(Debug, Clone)]
pub(crate) struct PendingOp {
    pub(crate) db: String,
    pub(crate) coll: String,
    pub(crate) images: bool,
    pub(crate) kind: OpKind,
}

impl PendingOp {
    /// The `_id` of the document written, for CRUD entries.
    pub(crate) fn doc_id(&self) -> Option<&Bson> {
        match &self.kind {
            OpKind::Insert { doc } => doc.get("_id"),
            OpKind::Update { id, .. } | OpKind::Replace { id, .. } | OpKind::Delete { id, .. } => {
                Some(id)
            }
            _ => None,
        }
    }

    /// The bytes this write adds to a transaction (the document written, or the deleted key).
    pub(crate) fn size(&self) -> usize {
        let len =
            |d: &Document| bson::RawDocumentBuf::from_document(d).map_or(0, |r| r.as_bytes().len());
        match &self.kind {
            OpKind::Insert { doc } => len(doc),
            OpKind::Update { post, .. } | OpKind::Replace { post, .. } => len(post),
            OpKind::Delete { id, .. } => len(&doc! {"_id": id.clone()}),
            _ => 0,
        }
    }
}

/// The oplog position of the last committed write to each document (and of the last drop or
/// rename of each collection), recorded only while some transaction is open: a write older
/// than every open transaction cannot conflict with any of them.
#[derive(Debug, Default)]
pub(crate) struct Versions {
    docs: HashMap<(String, String), HashMap<Vec<u8>, u64>>,
    /// Drops and renames by namespace; `(db, "")` for `dropDatabase`.
    colls: HashMap<(String, String), u64>,
}

impl Versions {
    /// Records a committed write at oplog position `pos`.
    pub(crate) fn record(&mut self, op: &PendingOp, pos: u64) {
        let ns = (op.db.clone(), op.coll.clone());
        match &op.kind {
            OpKind::Noop => {}
            OpKind::Drop | OpKind::DropDatabase => {
                self.colls.insert(ns, pos);
            }
            OpKind::Rename { to_db, to_coll } => {
                self.colls.insert(ns, pos);
                self.colls.insert((to_db.clone(), to_coll.clone()), pos);
            }
            _ => {
                if let Some(id) = op.doc_id() {
                    self.docs.entry(ns).or_default().insert(value_key(id), pos);
                }
            }
        }
    }

    /// Whether the document (or collection) that `op` writes was changed by a committed write
    /// after oplog position `since`.
    pub(crate) fn changed_after(&self, op: &PendingOp, since: u64) -> bool {
        let ns = (op.db.clone(), op.coll.clone());
        let newer = |key: &(String, String)| self.colls.get(key).is_some_and(|p| *p > since);
        if newer(&ns) || newer(&(op.db.clone(), String::new())) {
            return true;
        }
        op.doc_id().is_some_and(|id| {
            self.docs
                .get(&ns)
                .and_then(|m| m.get(&value_key(id)))
                .is_some_and(|p| *p > since)
        })
    }
}
