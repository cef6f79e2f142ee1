//! Collections of the in-memory backend. Every write appends to the oplog, as on a replica
//! set, so change streams see it.

use std::collections::BTreeMap;
use std::sync::Arc;

use bson::{doc, oid::ObjectId, Bson, Document};

use super::oplog::{Entry, OpKind};
use super::{MemoryBackend, State};
use crate::matcher::update::{apply_update, is_operator_update, validate_replacement};
use crate::matcher::{Filter, MatchError};

/// Documents of one collection, by `_id`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Coll {
    /// Shared with the oplog entries that carry them as post- or pre-images: one copy each.
    docs: BTreeMap<String, Arc<Document>>,
}

impl Coll {
    /// Every document, in no particular order.
    pub(crate) fn documents(&self) -> impl Iterator<Item = &Arc<Document>> {
        self.docs.values()
    }
}

/// An error of an in-memory collection operation.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum MemoryError {
    /// A document with this `_id` exists already.
    #[error("E11000 duplicate key error: _id {0}")]
    DuplicateKey(String),
    /// The filter or update is not valid.
    #[error(transparent)]
    Match(#[from] MatchError),
    /// A write through a [`super::MemoryTransaction`] after the transaction was committed or
    /// aborted (a handler kept the handle past its return).
    #[error("the transaction was {0}; a write through it is refused")]
    TransactionEnded(&'static str),
}

/// What an update matched and changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateOutcome {
    /// Documents matched.
    pub matched: u64,
    /// Documents changed (an update that changes nothing writes no oplog entry).
    pub modified: u64,
    /// Whether an upsert inserted a document.
    pub upserted: bool,
}

fn id_key(id: &Bson) -> String {
    match id {
        Bson::Int32(i) => format!("n:{}", i64::from(*i)),
        Bson::Int64(i) => format!("n:{i}"),
        other => format!("{other:?}"),
    }
}

/// `doc` with an `_id` first: its own, or a new `ObjectId`.
pub(crate) fn with_id(doc: Document) -> Document {
    if doc.contains_key("_id") {
        return doc;
    }
    let mut with_id = doc! { "_id": ObjectId::new() };
    with_id.extend(doc);
    with_id
}

/// A handle on one collection of a [`MemoryBackend`].
#[derive(Clone)]
pub struct MemoryCollection {
    backend: MemoryBackend,
    db: String,
    name: String,
}

impl MemoryCollection {
    pub(crate) fn new(backend: MemoryBackend, db: &str, name: &str) -> Self {
        Self {
            backend,
            db: db.to_owned(),
            name: name.to_owned(),
        }
    }

    /// The collection's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's name.
    pub fn database(&self) -> &str {
        &self.db
    }

    fn write<R>(&self, f: impl FnOnce(&mut State, &str, &str, bson::DateTime) -> R) -> R {
        let wall = self.backend.wall_time();
        let r = {
            let mut st = self.backend.lock();
            f(&mut st, &self.db, &self.name, wall)
        };
        self.backend.notify_appended();
        r
    }

    /// Inserts a document (an `_id` is added when missing); returns its `_id`.
    pub fn insert_one(&self, doc: Document) -> Result<Bson, MemoryError> {
        let doc = with_id(doc);
        self.write(|st, db, coll, wall| st.insert_doc(db, coll, doc, wall))
    }

    /// Inserts several documents in order; stops at the first error.
    pub fn insert_many(
        &self,
        docs: impl IntoIterator<Item = Document>,
    ) -> Result<Vec<Bson>, MemoryError> {
        docs.into_iter().map(|d| self.insert_one(d)).collect()
    }

    /// Applies an operator update (or a replacement) to the first matching document.
    pub fn update_one(
        &self,
        filter: Document,
        update: Document,
    ) -> Result<UpdateOutcome, MemoryError> {
        self.update(filter, update, false)
    }

    /// Like [`MemoryCollection::update_one`], inserting when nothing matches.
    pub fn upsert_one(
        &self,
        filter: Document,
        update: Document,
    ) -> Result<UpdateOutcome, MemoryError> {
        self.update(filter, update, true)
    }

    fn update(
        &self,
        filter: Document,
        update: Document,
        upsert: bool,
    ) -> Result<UpdateOutcome, MemoryError> {
        let f = Filter::parse(&filter)?;
        if !is_operator_update(&update) {
            validate_replacement(&update)?;
        }
        self.write(|st, db, coll, wall| st.update_doc(db, coll, &f, &update, upsert, wall))
    }

    /// Replaces the first matching document (its `_id` is kept).
    pub fn replace_one(
        &self,
        filter: Document,
        replacement: Document,
    ) -> Result<UpdateOutcome, MemoryError> {
        validate_replacement(&replacement)?;
        self.update(filter, replacement, false)
    }

    /// Deletes the first matching document; returns how many were deleted (0 or 1).
    pub fn delete_one(&self, filter: Document) -> Result<u64, MemoryError> {
        let f = Filter::parse(&filter)?;
        self.write(|st, db, coll, wall| st.delete_doc(db, coll, &f, wall))
    }

    /// The matching documents, ordered by `_id`.
    pub fn find(&self, filter: Document) -> Result<Vec<Document>, MemoryError> {
        let f = Filter::parse(&filter)?;
        let st = self.backend.lock();
        Ok(st
            .collections
            .get(&(self.db.clone(), self.name.clone()))
            .map(|c| {
                c.docs
                    .values()
                    .filter(|d| f.matches(d))
                    .map(|d| (**d).clone())
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The first matching document.
    pub fn find_one(&self, filter: Document) -> Result<Option<Document>, MemoryError> {
        Ok(self.find(filter)?.into_iter().next())
    }

    /// Number of documents.
    pub fn count(&self) -> usize {
        self.backend
            .lock()
            .collections
            .get(&(self.db.clone(), self.name.clone()))
            .map(|c| c.docs.len())
            .unwrap_or(0)
    }

    /// Drops the collection: a `drop` entry, which invalidates streams watching it.
    pub fn drop_collection(&self) {
        self.write(|st, db, coll, wall| {
            st.collections.remove(&(db.to_owned(), coll.to_owned()));
            st.append(db, coll, OpKind::Drop, None, None, None, wall);
        })
    }

    /// Renames the collection: a `rename` entry, which invalidates streams watching it.
    pub fn rename(&self, to: &str) {
        self.write(|st, db, coll, wall| {
            if let Some(c) = st.collections.remove(&(db.to_owned(), coll.to_owned())) {
                st.collections.insert((db.to_owned(), to.to_owned()), c);
            }
            st.append(
                db,
                coll,
                OpKind::Rename {
                    to_db: db.to_owned(),
                    to_coll: to.to_owned(),
                },
                None,
                None,
                None,
                wall,
            );
        })
    }
}

impl State {
    /// Inserts `doc` (which has an `_id`) and logs it; refuses a taken `_id`.
    pub(crate) fn insert_doc(
        &mut self,
        db: &str,
        coll: &str,
        doc: Document,
        wall: bson::DateTime,
    ) -> Result<Bson, MemoryError> {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let c = self
            .collections
            .entry((db.to_owned(), coll.to_owned()))
            .or_default();
        let key = id_key(&id);
        if c.docs.contains_key(&key) {
            return Err(MemoryError::DuplicateKey(id.to_string()));
        }
        let doc = Arc::new(doc);
        c.docs.insert(key, doc.clone());
        self.append(
            db,
            coll,
            OpKind::Insert,
            Some(doc! {"_id": id.clone()}),
            Some(doc),
            None,
            wall,
        );
        Ok(id)
    }

    /// Applies an operator update or a replacement (already validated) to the first document
    /// matching `f`, inserting one when none does and `upsert` is set, and logs the change.
    pub(crate) fn update_doc(
        &mut self,
        db: &str,
        coll: &str,
        f: &Filter,
        update: &Document,
        upsert: bool,
        wall: bson::DateTime,
    ) -> Result<UpdateOutcome, MemoryError> {
        let replacement = !is_operator_update(update);
        let ns = (db.to_owned(), coll.to_owned());
        let found = self.collections.get(&ns).and_then(|c| {
            c.docs
                .iter()
                .find(|(_, d)| f.matches(d))
                .map(|(k, d)| (k.clone(), d.clone()))
        });
        match found {
            Some((key, before)) => {
                let mut after = (*before).clone();
                let changes = apply_update(&mut after, update, false)?;
                if replacement {
                    if let Some(id) = before.get("_id") {
                        let mut with_id = doc! {"_id": id.clone()};
                        with_id.extend(after.into_iter().filter(|(k, _)| k != "_id"));
                        after = with_id;
                    }
                }
                if after == *before {
                    return Ok(UpdateOutcome {
                        matched: 1,
                        modified: 0,
                        upserted: false,
                    });
                }
                let id = before.get("_id").cloned().unwrap_or(Bson::Null);
                let after = Arc::new(after);
                if let Some(c) = self.collections.get_mut(&ns) {
                    c.docs.insert(key, after.clone());
                }
                let kind = if replacement {
                    OpKind::Replace
                } else {
                    OpKind::Update(changes)
                };
                self.append(
                    db,
                    coll,
                    kind,
                    Some(doc! {"_id": id}),
                    Some(after),
                    Some(before),
                    wall,
                );
                Ok(UpdateOutcome {
                    matched: 1,
                    modified: 1,
                    upserted: false,
                })
            }
            None if upsert => {
                let mut doc = f.equality_seed();
                apply_update(&mut doc, update, true)?;
                self.insert_doc(db, coll, with_id(doc), wall)?;
                Ok(UpdateOutcome {
                    matched: 0,
                    modified: 0,
                    upserted: true,
                })
            }
            None => Ok(UpdateOutcome {
                matched: 0,
                modified: 0,
                upserted: false,
            }),
        }
    }

    /// Deletes the first document matching `f` and logs it; returns how many were deleted.
    pub(crate) fn delete_doc(
        &mut self,
        db: &str,
        coll: &str,
        f: &Filter,
        wall: bson::DateTime,
    ) -> Result<u64, MemoryError> {
        let ns = (db.to_owned(), coll.to_owned());
        let Some(c) = self.collections.get_mut(&ns) else {
            return Ok(0);
        };
        let Some(key) = c
            .docs
            .iter()
            .find(|(_, d)| f.matches(d))
            .map(|(k, _)| k.clone())
        else {
            return Ok(0);
        };
        let Some(before) = c.docs.remove(&key) else {
            return Ok(0);
        };
        let id = before.get("_id").cloned().unwrap_or(Bson::Null);
        self.append(
            db,
            coll,
            OpKind::Delete,
            Some(doc! {"_id": id}),
            None,
            Some(before),
            wall,
        );
        Ok(1)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append(
        &mut self,
        db: &str,
        coll: &str,
        kind: OpKind,
        key: Option<Document>,
        post: Option<Arc<Document>>,
        pre: Option<Arc<Document>>,
        wall: bson::DateTime,
    ) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.oplog.push_back(Entry {
            seq,
            db: db.to_owned(),
            coll: coll.to_owned(),
            kind,
            key,
            post,
            pre,
            wall,
        });
        self.enforce_retention();
        seq
    }

    pub(crate) fn current_document(
        &self,
        db: &str,
        coll: &str,
        key: Option<&Document>,
    ) -> Option<Document> {
        let id = key?.get("_id")?;
        self.collections
            .get(&(db.to_owned(), coll.to_owned()))?
            .docs
            .get(&id_key(id))
            .map(|d| (**d).clone())
    }
}
