//! `aggregate`: opening a change stream when the pipeline starts with `$changeStream`, else
//! running the emulated stages (`$match`, `$sort`, `$skip`, `$limit`, `$project`, `$count`,
//! `$group` with `$sum`) over a collection.

use std::collections::HashMap;
use std::sync::Arc;

use bson::{doc, Bson, Document};
use flowwarden::matcher::{get_path, Filter, Projection};

use super::cursors::{cursor_reply, open_find_cursor, Cursor};
use super::queries::sort_docs;
use super::{as_i64, batch_size, get_docs, truthy, CmdResult, State};
use crate::changestream::{ChangeCursor, Scope};
use crate::error::CommandError;

pub(super) fn aggregate(st: &mut State, db: &str, body: &Document) -> CmdResult {
    let stages: Vec<Document> = get_docs(body, "pipeline")?.into_iter().cloned().collect();
    let cursor_opts =
        match body.get("cursor") {
            Some(Bson::Document(c)) => c.clone(),
            _ if truthy(body.get("explain")) => doc! {},
            _ => return Err(CommandError::failed_to_parse(
                "The 'cursor' option is required, except for aggregate with the explain argument",
            )),
        };
    let batch = batch_size(cursor_opts.get("batchSize"))?;
    let target = body.get("aggregate");
    if let Some(spec) = stages.first().and_then(|s| s.get("$changeStream")) {
        let spec = spec
            .as_document()
            .ok_or_else(|| CommandError::type_mismatch("$changeStream must take an object"))?;
        let (scope, ns) = match target {
            Some(Bson::String(coll)) => {
                if ["admin", "config", "local"].contains(&db) {
                    return Err(CommandError::new(
                        73,
                        "InvalidNamespace",
                        format!("$changeStream may not be opened on the internal {db} database"),
                    ));
                }
                (
                    Scope::Coll(db.to_string(), coll.clone()),
                    format!("{db}.{coll}"),
                )
            }
            Some(t) if as_i64(Some(t)) == Some(1) => {
                if truthy(spec.get("allChangesForCluster")) {
                    (Scope::Cluster, format!("{db}.$cmd.aggregate"))
                } else if ["admin", "config", "local"].contains(&db) {
                    return Err(CommandError::new(
                        73,
                        "InvalidNamespace",
                        format!("$changeStream may not be opened on the internal {db} database"),
                    ));
                } else {
                    (Scope::Db(db.to_string()), format!("{db}.$cmd.aggregate"))
                }
            }
            _ => {
                return Err(CommandError::type_mismatch(
                    "aggregate must be a collection name or 1",
                ))
            }
        };
        let opened_at_now = !["resumeAfter", "startAfter", "startAtOperationTime"]
            .iter()
            .any(|k| spec.contains_key(*k));
        let mut cursor = ChangeCursor::open(&st.data, scope, ns.clone(), spec, &stages[1..])?;
        if opened_at_now {
            if let Some(pos) = st.open_at_now_after.take() {
                cursor.start_after(&st.data, pos);
            }
        }
        let first = cursor.read(&st.data, batch.unwrap_or(101))?;
        let id = if cursor.closed { 0 } else { st.new_cursor_id() };
        let pbrt = cursor.pbrt.clone();
        if !cursor.closed {
            st.cursors.insert(id, Cursor::Change(Box::new(cursor)));
        }
        return cursor_reply(id, &ns, true, first.events, Some(&pbrt));
    }
    if stages
        .iter()
        .skip(1)
        .any(|s| s.contains_key("$changeStream"))
    {
        return Err(CommandError::new(
            40602,
            "Location40602",
            "$changeStream is only valid as the first stage in a pipeline",
        ));
    }
    let coll = match target {
        Some(Bson::String(c)) => c.clone(),
        _ => {
            return Err(CommandError::new(
                59,
                "CommandNotFound",
                "collection-less aggregate stages are not emulated",
            ))
        }
    };
    let mut docs: Vec<Document> = st
        .data
        .coll(db, &coll)
        .map(|c| c.docs.values().map(|d| (**d).clone()).collect())
        .unwrap_or_default();
    for stage in &stages {
        docs = run_stage(stage, docs)?;
    }
    open_find_cursor(st, format!("{db}.{coll}"), docs, batch, false)
}

fn run_stage(stage: &Document, docs: Vec<Document>) -> Result<Vec<Document>, CommandError> {
    let Some((name, arg)) = stage.iter().next().filter(|_| stage.len() == 1) else {
        return Err(CommandError::new(
            40323,
            "Location40323",
            "A pipeline stage specification object must contain exactly one field.",
        ));
    };
    let arg_doc = || {
        arg.as_document()
            .ok_or_else(|| CommandError::type_mismatch(format!("{name} must take an object")))
    };
    let arg_n = || {
        as_i64(Some(arg))
            .filter(|n| *n >= 0)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| CommandError::bad_value(format!("invalid argument to {name} stage")))
    };
    Ok(match name.as_str() {
        "$match" => {
            let f = Filter::parse(arg_doc()?)?;
            docs.into_iter().filter(|d| f.matches(d)).collect()
        }
        "$sort" => {
            let mut arcs: Vec<Arc<Document>> = docs.into_iter().map(Arc::new).collect();
            sort_docs(&mut arcs, arg_doc()?)?;
            arcs.into_iter()
                .map(|a| Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone()))
                .collect()
        }
        "$skip" => docs.into_iter().skip(arg_n()?).collect(),
        "$limit" => docs.into_iter().take(arg_n()?).collect(),
        "$project" => {
            let p = Projection::parse(arg_doc()?)?;
            docs.iter().map(|d| p.apply(d)).collect()
        }
        "$count" => {
            let field = arg
                .as_str()
                .ok_or_else(|| CommandError::type_mismatch("$count must take a string"))?;
            if docs.is_empty() {
                Vec::new()
            } else {
                vec![doc! {field: i32::try_from(docs.len()).unwrap_or(i32::MAX)}]
            }
        }
        "$group" => group(arg_doc()?, docs)?,
        other => {
            return Err(CommandError::new(
                40324,
                "Location40324",
                format!("Unrecognized pipeline stage name: '{other}' (not emulated)"),
            ))
        }
    })
}

fn group(spec: &Document, docs: Vec<Document>) -> Result<Vec<Document>, CommandError> {
    let key_expr = spec.get("_id").ok_or_else(|| {
        CommandError::new(
            15955,
            "Location15955",
            "a group specification must include an _id",
        )
    })?;
    let eval = |e: &Bson, d: &Document| -> Bson {
        match e {
            Bson::String(s) if s.starts_with('$') => {
                get_path(d, &s[1..]).cloned().unwrap_or(Bson::Null)
            }
            other => other.clone(),
        }
    };
    let mut accs = Vec::new();
    for (field, acc) in spec.iter().filter(|(k, _)| *k != "_id") {
        let acc = acc.as_document().filter(|a| a.len() == 1).ok_or_else(|| {
            CommandError::new(
                40234,
                "Location40234",
                format!("The field '{field}' must be an accumulator object"),
            )
        })?;
        let (op, arg) = acc
            .iter()
            .next()
            .ok_or_else(|| CommandError::bad_value("empty accumulator"))?;
        if op != "$sum" {
            return Err(CommandError::new(
                15952,
                "Location15952",
                format!("unknown group operator '{op}' (only $sum is emulated)"),
            ));
        }
        accs.push((field.clone(), arg.clone()));
    }
    let mut groups: Vec<(Bson, Vec<Bson>)> = Vec::new();
    let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
    for d in &docs {
        let key = eval(key_expr, d);
        let slot = *index
            .entry(crate::state::value_key(&key))
            .or_insert_with(|| {
                groups.push((key.clone(), vec![Bson::Int32(0); accs.len()]));
                groups.len() - 1
            });
        for (i, (_, arg)) in accs.iter().enumerate() {
            let v = eval(arg, d);
            let total = &mut groups[slot].1[i];
            *total = add_numbers(total, &v);
        }
    }
    Ok(groups
        .into_iter()
        .map(|(key, totals)| {
            let mut out = doc! {"_id": key};
            for ((field, _), t) in accs.iter().zip(totals) {
                out.insert(field.clone(), t);
            }
            out
        })
        .collect())
}

fn add_numbers(a: &Bson, b: &Bson) -> Bson {
    match (a, b) {
        (Bson::Int32(x), Bson::Int32(y)) => x
            .checked_add(*y)
            .map_or(Bson::Int64(i64::from(*x) + i64::from(*y)), Bson::Int32),
        (Bson::Int32(x), Bson::Int64(y)) | (Bson::Int64(y), Bson::Int32(x)) => {
            Bson::Int64(i64::from(*x).saturating_add(*y))
        }
        (Bson::Int64(x), Bson::Int64(y)) => Bson::Int64(x.saturating_add(*y)),
        #[allow(clippy::cast_precision_loss)]
        (Bson::Double(x), Bson::Int64(y)) | (Bson::Int64(y), Bson::Double(x)) => {
            Bson::Double(x + *y as f64)
        }
        (Bson::Double(x), Bson::Int32(y)) | (Bson::Int32(y), Bson::Double(x)) => {
            Bson::Double(x + f64::from(*y))
        }
        (Bson::Double(x), Bson::Double(y)) => Bson::Double(x + y),
        _ => a.clone(),
    }
}
