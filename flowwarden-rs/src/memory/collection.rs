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
#[derive(Debug, Default)]
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
    pub fn insert_one(&self, mut doc: Document) -> Result<Bson, MemoryError> {
        if !doc.contains_key("_id") {
            let mut with_id = doc! { "_id": ObjectId::new() };
            with_id.extend(doc);
            doc = with_id;
        }
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        self.write(|st, db, coll, wall| {
            let c = st
                .collections
                .entry((db.to_owned(), coll.to_owned()))
                .or_default();
            let key = id_key(&id);
            if c.docs.contains_key(&key) {
                return Err(MemoryError::DuplicateKey(id.to_string()));
            }
            let doc = Arc::new(doc);
            c.docs.insert(key, doc.clone());
            st.append(
                db,
                coll,
                OpKind::Insert,
                Some(doc! {"_id": id.clone()}),
                Some(doc),
                None,
                wall,
            );
            Ok(id)
        })
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
        let replacement = !is_operator_update(&update);
        if replacement {
            validate_replacement(&update)?;
        }
        self.write(|st, db, coll, wall| {
            let ns = (db.to_owned(), coll.to_owned());
            let found = st.collections.get(&ns).and_then(|c| {
                c.docs
                    .iter()
                    .find(|(_, d)| f.matches(d))
                    .map(|(k, d)| (k.clone(), d.clone()))
            });
            match found {
                Some((key, before)) => {
                    let mut after = (*before).clone();
                    let changes = apply_update(&mut after, &update, false)?;
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
                    if let Some(c) = st.collections.get_mut(&ns) {
                        c.docs.insert(key, after.clone());
                    }
                    let kind = if replacement {
                        OpKind::Replace
                    } else {
                        OpKind::Update(changes)
                    };
                    st.append(
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
                    apply_update(&mut doc, &update, true)?;
                    if !doc.contains_key("_id") {
                        let mut with_id = doc! { "_id": ObjectId::new() };
                        with_id.extend(doc);
                        doc = with_id;
                    }
                    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
                    let doc = Arc::new(doc);
                    st.collections
                        .entry(ns)
                        .or_default()
                        .docs
                        .insert(id_key(&id), doc.clone());
                    st.append(
                        db,
                        coll,
                        OpKind::Insert,
                        Some(doc! {"_id": id}),
                        Some(doc),
                        None,
                        wall,
                    );
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
        })
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
        self.write(|st, db, coll, wall| {
            let ns = (db.to_owned(), coll.to_owned());
            let Some(c) = st.collections.get_mut(&ns) else {
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
            st.append(
                db,
                coll,
                OpKind::Delete,
                Some(doc! {"_id": id}),
                None,
                Some(before),
                wall,
            );
            Ok(1)
        })
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
