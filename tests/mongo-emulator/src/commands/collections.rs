//! Databases and collections: `listDatabases`, `listCollections`, `create`, `collMod`,
//! `drop`, `dropDatabase` and `renameCollection`.

use bson::{doc, Bson, Document};

use super::cursors::open_find_cursor;
use super::{batch_size, coll_name, ok, parse_filter, truthy, CmdResult, State};
use crate::error::CommandError;
use crate::state::{Collection, OpKind};

pub(super) fn list_databases(st: &State, body: &Document) -> CmdResult {
    let name_only = truthy(body.get("nameOnly"));
    let filter = parse_filter(body, "filter")?;
    let dbs: Vec<Bson> = st
        .data
        .dbs
        .iter()
        .filter(|(_, colls)| !colls.is_empty())
        .map(|(name, _)| {
            if name_only {
                doc! {"name": name.clone()}
            } else {
                doc! {"name": name.clone(), "sizeOnDisk": 0i64, "empty": false}
            }
        })
        .filter(|d| filter.matches(d))
        .map(Bson::Document)
        .collect();
    ok(doc! {"databases": dbs, "totalSize": 0i64, "totalSizeMb": 0i64, "ok": 1.0})
}

fn coll_options(c: &Collection) -> Document {
    if c.images {
        doc! {"changeStreamPreAndPostImages": {"enabled": true}}
    } else {
        doc! {}
    }
}

pub(super) fn list_collections(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let filter = parse_filter(body, "filter")?;
    let name_only = truthy(body.get("nameOnly"));
    let docs: Vec<Document> = st
        .data
        .dbs
        .get(db)
        .map(|colls| {
            colls
                .iter()
                .map(|(name, c)| {
                    if name_only {
                        doc! {"name": name.clone(), "type": "collection"}
                    } else {
                        doc! {
                            "name": name.clone(),
                            "type": "collection",
                            "options": coll_options(c),
                            "info": {"readOnly": false},
                            "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"},
                        }
                    }
                })
                .filter(|d| filter.matches(d))
                .collect()
        })
        .unwrap_or_default();
    let batch = batch_size(
        body.get_document("cursor")
            .ok()
            .and_then(|c| c.get("batchSize")),
    )?;
    open_find_cursor(st, format!("{db}.$cmd.listCollections"), docs, batch, false)
}

fn images_option(body: &Document) -> Result<Option<bool>, CommandError> {
    match body.get("changeStreamPreAndPostImages") {
        None => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(truthy(d.get("enabled")))),
        Some(_) => Err(CommandError::type_mismatch(
            "BSON field 'changeStreamPreAndPostImages' is the wrong type, expected type 'object'",
        )),
    }
}

pub(super) fn create(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let name = coll_name(body, "create")?;
    let images = images_option(body)?.unwrap_or(false);
    if st.data.coll(db, name).is_some() {
        return Err(CommandError::new(
            48,
            "NamespaceExists",
            format!("Collection {db}.{name} already exists."),
        ));
    }
    st.data.coll_or_create(db, name).images = images;
    ok(doc! {"ok": 1.0})
}

pub(super) fn coll_mod(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let name = coll_name(body, "collMod")?;
    let images = images_option(body)?;
    let c = st.data.coll_mut(db, name).ok_or_else(|| {
        CommandError::namespace_not_found(format!("ns does not exist: {db}.{name}"))
    })?;
    if let Some(on) = images {
        c.images = on;
    }
    ok(doc! {"ok": 1.0})
}

pub(super) fn drop_coll(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let name = coll_name(body, "drop")?;
    let removed = st.data.dbs.get_mut(db).and_then(|colls| colls.remove(name));
    match removed {
        Some(c) => {
            st.data
                .log(db.to_string(), name.to_string(), c.images, OpKind::Drop);
            ok(
                doc! {"nIndexesWas": c.indexes.len() as i32, "ns": format!("{db}.{name}"), "ok": 1.0},
            )
        }
        None => ok(doc! {"ok": 1.0}),
    }
}

pub(super) fn drop_database(st: &mut State, db: &str) -> CmdResult {
    if let Some(colls) = st.data.dbs.remove(db) {
        for (name, c) in colls {
            st.data.log(db.to_string(), name, c.images, OpKind::Drop);
        }
        st.data
            .log(db.to_string(), String::new(), false, OpKind::DropDatabase);
    }
    ok(doc! {"dropped": db, "ok": 1.0})
}

fn split_ns(ns: &str) -> Result<(&str, &str), CommandError> {
    ns.split_once('.')
        .filter(|(d, c)| !d.is_empty() && !c.is_empty())
        .ok_or_else(|| {
            CommandError::new(
                73,
                "InvalidNamespace",
                format!("Invalid namespace specified '{ns}'"),
            )
        })
}

pub(super) fn rename(st: &mut State, db: &str, body: &Document) -> CmdResult {
    if db != "admin" {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            "renameCollection may only be run against the admin database.",
        ));
    }
    let from = coll_name(body, "renameCollection")?;
    let to = body
        .get_str("to")
        .map_err(|_| CommandError::type_mismatch("BSON field 'to' must be a string"))?;
    let (fdb, fcoll) = split_ns(from)?;
    let (tdb, tcoll) = split_ns(to)?;
    if st.data.coll(fdb, fcoll).is_none() {
        return Err(CommandError::namespace_not_found(
            "source namespace does not exist",
        ));
    }
    if st.data.coll(tdb, tcoll).is_some() {
        if !truthy(body.get("dropTarget")) {
            return Err(CommandError::new(
                48,
                "NamespaceExists",
                "target namespace exists",
            ));
        }
        if let Some(c) = st.data.dbs.get_mut(tdb).and_then(|m| m.remove(tcoll)) {
            st.data
                .log(tdb.to_string(), tcoll.to_string(), c.images, OpKind::Drop);
        }
    }
    let c = st
        .data
        .dbs
        .get_mut(fdb)
        .and_then(|m| m.remove(fcoll))
        .ok_or_else(|| CommandError::namespace_not_found("source namespace does not exist"))?;
    let images = c.images;
    st.data
        .dbs
        .entry(tdb.to_string())
        .or_default()
        .insert(tcoll.to_string(), c);
    st.data.log(
        fdb.to_string(),
        fcoll.to_string(),
        images,
        OpKind::Rename {
            to_db: tdb.to_string(),
            to_coll: tcoll.to_string(),
        },
    );
    ok(doc! {"ok": 1.0})
}
