//! Update operators ("Update Operators" in the MongoDB manual): `$set`, `$setOnInsert`,
//! `$unset`, `$inc`, `$max`, `$min`, replacement documents, and pipeline-style updates.

use std::cmp::Ordering;

use bson::{Bson, DateTime, Document};

use super::compare::{bson_equal, compare_bson};
use super::pipeline::EventPipeline;
use super::{array_index, MatchError};

/// What an update changed, in the shape of a change event's `updateDescription`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateChanges {
    /// Dotted path of each field set by the update, with its new value.
    pub updated_fields: Document,
    /// Dotted path of each field the update removed.
    pub removed_fields: Vec<String>,
}

impl UpdateChanges {
    /// Whether the update changed nothing (MongoDB then writes no oplog entry and reports
    /// `nModified: 0`).
    pub fn is_empty(&self) -> bool {
        self.updated_fields.is_empty() && self.removed_fields.is_empty()
    }
}

/// Whether `update` is an operator update (`{$set: ..}`) rather than a replacement document.
/// Decided by the first key, as the server does; [`apply_update`] then refuses a mix.
pub fn is_operator_update(update: &Document) -> bool {
    update.keys().next().is_some_and(|k| k.starts_with('$'))
}

/// Checks that a replacement document has no operator keys.
pub fn validate_replacement(replacement: &Document) -> Result<(), MatchError> {
    match replacement.keys().find(|k| k.starts_with('$')) {
        Some(k) => Err(MatchError::MixedUpdate(k.clone())),
        None => Ok(()),
    }
}

/// Replaces `doc` by `replacement`, keeping `doc`'s `_id` first. A replacement that carries a
/// different `_id` is refused with [`MatchError::ImmutableField`].
pub fn apply_replacement(doc: &mut Document, replacement: &Document) -> Result<(), MatchError> {
    validate_replacement(replacement)?;
    let id = doc.get("_id").cloned();
    if let (Some(old), Some(new)) = (&id, replacement.get("_id")) {
        if !bson_equal(old, new) {
            return Err(MatchError::ImmutableField("_id".into()));
        }
    }
    let mut out = Document::new();
    if let Some(id) = id.or_else(|| replacement.get("_id").cloned()) {
        out.insert("_id", id);
    }
    for (k, v) in replacement {
        if k != "_id" {
            out.insert(k.clone(), v.clone());
        }
    }
    *doc = out;
    Ok(())
}

const OPERATORS: [&str; 6] = ["$set", "$setOnInsert", "$unset", "$inc", "$max", "$min"];

/// Applies an operator update to `doc` in place. `is_insert` is true when the document is being
/// created by an upsert (only then does `$setOnInsert` apply).
///
/// A replacement document is also accepted (see [`apply_replacement`]); it reports no changes.
/// Refuses unknown operators, a mix of operators and fields, conflicting paths, changes to
/// `_id`, and `$inc` on non-numbers. On error `doc` is left unchanged.
pub fn apply_update(
    doc: &mut Document,
    update: &Document,
    is_insert: bool,
) -> Result<UpdateChanges, MatchError> {
    if !is_operator_update(update) {
        apply_replacement(doc, update)?;
        return Ok(UpdateChanges::default());
    }
    // Validate everything first so that a refused update leaves the document untouched.
    let mut paths: Vec<&str> = Vec::new();
    for (op, arg) in update {
        if !op.starts_with('$') {
            return Err(MatchError::MixedUpdate(op.clone()));
        }
        if !OPERATORS.contains(&op.as_str()) {
            return Err(MatchError::UnknownUpdateOperator(op.clone()));
        }
        let fields = arg.as_document().ok_or_else(|| MatchError::BadValue {
            op: op.clone(),
            message: "argument must be a document".into(),
        })?;
        for (path, value) in fields {
            if path.is_empty() || path.split('.').any(str::is_empty) || path.starts_with('$') {
                return Err(MatchError::BadValue {
                    op: op.clone(),
                    message: format!("invalid field path '{path}'"),
                });
            }
            if op == "$inc" && !is_number(value) {
                return Err(MatchError::TypeMismatch {
                    op: op.clone(),
                    path: path.clone(),
                });
            }
            if op == "$setOnInsert" && !is_insert {
                continue;
            }
            if path == "_id" || path.starts_with("_id.") {
                let same = op == "$set" || op == "$setOnInsert";
                let unchanged =
                    same && super::get_path(doc, path).is_some_and(|old| bson_equal(old, value));
                if !(unchanged || (is_insert && same)) {
                    return Err(MatchError::ImmutableField(path.clone()));
                }
            }
            for other in &paths {
                if conflicts(other, path) {
                    return Err(MatchError::ConflictingUpdate(
                        path.clone(),
                        (*other).to_string(),
                    ));
                }
            }
            paths.push(path);
        }
    }

    let mut work = doc.clone();
    let mut changes = UpdateChanges::default();
    for (op, arg) in update {
        let Some(fields) = arg.as_document() else {
            continue;
        };
        for (path, value) in fields {
            match op.as_str() {
                "$set" => set_tracked(&mut work, path, value.clone(), &mut changes)?,
                "$setOnInsert" if is_insert => {
                    set_tracked(&mut work, path, value.clone(), &mut changes)?
                }
                "$setOnInsert" => {}
                "$unset" => {
                    if unset_path(&mut work, path) {
                        changes.removed_fields.push(path.clone());
                    }
                }
                "$inc" => {
                    let new = match super::get_path(&work, path) {
                        None => value.clone(),
                        Some(old) => add(old, value).ok_or_else(|| MatchError::TypeMismatch {
                            op: op.clone(),
                            path: path.clone(),
                        })?,
                    };
                    set_tracked(&mut work, path, new, &mut changes)?;
                }
                "$max" | "$min" => {
                    let want = if op == "$max" {
                        Ordering::Greater
                    } else {
                        Ordering::Less
                    };
                    let replace = match super::get_path(&work, path) {
                        None => true,
                        Some(old) => compare_bson(value, old) == want,
                    };
                    if replace {
                        set_tracked(&mut work, path, value.clone(), &mut changes)?;
                    }
                }
                other => return Err(MatchError::UnknownUpdateOperator(other.to_string())),
            }
        }
    }
    *doc = work;
    Ok(changes)
}

fn conflicts(a: &str, b: &str) -> bool {
    let prefix = |short: &str, long: &str| {
        long.len() > short.len()
            && long.starts_with(short)
            && long.as_bytes().get(short.len()) == Some(&b'.')
    };
    a == b || prefix(a, b) || prefix(b, a)
}

fn is_number(v: &Bson) -> bool {
    matches!(v, Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))
}

fn add(a: &Bson, b: &Bson) -> Option<Bson> {
    Some(match (a, b) {
        (Bson::Int32(x), Bson::Int32(y)) => match x.checked_add(*y) {
            Some(v) => Bson::Int32(v),
            None => Bson::Int64(i64::from(*x) + i64::from(*y)),
        },
        (Bson::Int32(x), Bson::Int64(y)) => Bson::Int64(i64::from(*x).checked_add(*y)?),
        (Bson::Int64(x), Bson::Int32(y)) => Bson::Int64(x.checked_add(i64::from(*y))?),
        (Bson::Int64(x), Bson::Int64(y)) => Bson::Int64(x.checked_add(*y)?),
        #[allow(clippy::cast_precision_loss)]
        (Bson::Double(x), Bson::Int64(y)) => Bson::Double(x + *y as f64),
        #[allow(clippy::cast_precision_loss)]
        (Bson::Int64(x), Bson::Double(y)) => Bson::Double(*x as f64 + y),
        (Bson::Double(x), Bson::Int32(y)) => Bson::Double(x + f64::from(*y)),
        (Bson::Int32(x), Bson::Double(y)) => Bson::Double(f64::from(*x) + y),
        (Bson::Double(x), Bson::Double(y)) => Bson::Double(x + y),
        _ => return None,
    })
}

fn set_tracked(
    doc: &mut Document,
    path: &str,
    value: Bson,
    changes: &mut UpdateChanges,
) -> Result<(), MatchError> {
    let unchanged = super::get_path(doc, path).is_some_and(|old| {
        bson_equal(old, &value) && std::mem::discriminant(old) == std::mem::discriminant(&value)
    });
    if unchanged {
        return Ok(());
    }
    set_path(doc, path, value.clone())?;
    changes.removed_fields.retain(|p| p != path);
    changes.updated_fields.insert(path, value);
    Ok(())
}

/// Sets the value at a dotted `path`, creating intermediate documents (and padding arrays with
/// nulls for numeric components), as `$set` does.
pub fn set_path(doc: &mut Document, path: &str, value: Bson) -> Result<(), MatchError> {
    match path.split_once('.') {
        None => {
            doc.insert(path, value);
            Ok(())
        }
        Some((head, rest)) => {
            if !doc.contains_key(head) {
                doc.insert(head, Document::new());
            }
            match doc.get_mut(head) {
                Some(child) => set_in_value(child, head, rest, value),
                None => Ok(()),
            }
        }
    }
}

fn set_in_value(
    target: &mut Bson,
    parent: &str,
    path: &str,
    value: Bson,
) -> Result<(), MatchError> {
    match target {
        Bson::Document(d) => set_path(d, path, value),
        Bson::Array(items) => {
            let (head, rest) = match path.split_once('.') {
                Some((h, r)) => (h, Some(r)),
                None => (path, None),
            };
            let idx = array_index(head).ok_or_else(|| MatchError::PathNotViable {
                field: head.to_string(),
                parent: parent.to_string(),
            })?;
            if idx > items.len() + 1_000_000 {
                return Err(MatchError::BadValue {
                    op: "$set".into(),
                    message: "array index too large".into(),
                });
            }
            while items.len() <= idx {
                items.push(Bson::Null);
            }
            match rest {
                None => {
                    items[idx] = value;
                    Ok(())
                }
                Some(r) => {
                    if matches!(items[idx], Bson::Null) {
                        items[idx] = Bson::Document(Document::new());
                    }
                    set_in_value(&mut items[idx], head, r, value)
                }
            }
        }
        _ => Err(MatchError::PathNotViable {
            field: path.split('.').next().unwrap_or(path).to_string(),
            parent: parent.to_string(),
        }),
    }
}

/// Removes the value at a dotted `path` (an array element is set to null, as `$unset` does).
/// Returns whether something was removed.
pub fn unset_path(doc: &mut Document, path: &str) -> bool {
    match path.split_once('.') {
        None => doc.remove(path).is_some(),
        Some((head, rest)) => match doc.get_mut(head) {
            Some(child) => unset_in_value(child, rest),
            None => false,
        },
    }
}

fn unset_in_value(target: &mut Bson, path: &str) -> bool {
    match target {
        Bson::Document(d) => unset_path(d, path),
        Bson::Array(items) => {
            let (head, rest) = match path.split_once('.') {
                Some((h, r)) => (h, Some(r)),
                None => (path, None),
            };
            let Some(item) = array_index(head).and_then(|i| items.get_mut(i)) else {
                return false;
            };
            match rest {
                None => {
                    *item = Bson::Null;
                    true
                }
                Some(r) => unset_in_value(item, r),
            }
        }
        _ => false,
    }
}

/// Applies a pipeline-style update (an array of `$set` / `$addFields`, `$unset` and `$project`
/// stages, whose values are aggregation expressions evaluated with `now` as `$$NOW`) to `doc` in
/// place. The changes are reported per top-level field, as the server reports a pipeline
/// update that rewrites a field. Refuses a stage an update may not use and any change to
/// `_id`; on error `doc` is left unchanged.
pub fn apply_pipeline_update(
    doc: &mut Document,
    stages: &[Document],
    now: DateTime,
) -> Result<UpdateChanges, MatchError> {
    let pipeline = EventPipeline::parse(stages)?;
    if pipeline.has_match() || pipeline.splits_large_events() {
        return Err(MatchError::BadValue {
            op: "update".into(),
            message: "an update pipeline may only use $set, $addFields, $unset and $project".into(),
        });
    }
    let new = pipeline
        .apply_at(doc.clone(), now)
        .unwrap_or_else(|| doc.clone());
    if let Some(id) = doc.get("_id") {
        if !new.get("_id").is_some_and(|n| bson_equal(n, id)) {
            return Err(MatchError::ImmutableField("_id".into()));
        }
    }
    let mut changes = UpdateChanges::default();
    for (k, v) in &new {
        if !doc.get(k).is_some_and(|old| old == v) {
            changes.updated_fields.insert(k.clone(), v.clone());
        }
    }
    for k in doc.keys() {
        if !new.contains_key(k) {
            changes.removed_fields.push(k.clone());
        }
    }
    *doc = new;
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn upd(mut d: Document, u: Document) -> (Document, UpdateChanges) {
        let ch = apply_update(&mut d, &u, false).expect("update applies");
        (d, ch)
    }

    #[test]
    fn set_creates_paths_and_reports_them() {
        let (d, ch) = upd(doc! {"_id": 1, "a": 1}, doc! {"$set": {"a": 2, "b.c": "x"}});
        assert_eq!(d, doc! {"_id": 1, "a": 2, "b": {"c": "x"}});
        assert_eq!(ch.updated_fields, doc! {"a": 2, "b.c": "x"});
        assert!(ch.removed_fields.is_empty());
        let (_, ch) = upd(doc! {"_id": 1, "a": 1}, doc! {"$set": {"a": 1}});
        assert!(ch.is_empty());
        let (d, _) = upd(doc! {"_id": 1, "xs": [1]}, doc! {"$set": {"xs.2": 5}});
        assert_eq!(d, doc! {"_id": 1, "xs": [1, null, 5]});
    }

    #[test]
    fn set_through_a_scalar_fails() {
        let mut d = doc! {"_id": 1, "a": 5};
        let err = apply_update(&mut d, &doc! {"$set": {"a.b": 1}}, false);
        assert!(matches!(err, Err(MatchError::PathNotViable { .. })));
        assert_eq!(d, doc! {"_id": 1, "a": 5});
    }

    #[test]
    fn unset() {
        let (d, ch) = upd(
            doc! {"_id": 1, "a": 1, "b": {"c": 1, "d": 2}},
            doc! {"$unset": {"a": "", "b.c": 1, "z": 1}},
        );
        assert_eq!(d, doc! {"_id": 1, "b": {"d": 2}});
        assert_eq!(ch.removed_fields, vec!["a".to_string(), "b.c".to_string()]);
    }

    #[test]
    fn inc() {
        let (d, ch) = upd(
            doc! {"_id": 1, "n": 1, "f": 1.5},
            doc! {"$inc": {"n": 2, "f": 1, "m": 3i64}},
        );
        assert_eq!(d, doc! {"_id": 1, "n": 3, "f": 2.5, "m": 3i64});
        assert_eq!(ch.updated_fields, doc! {"n": 3, "f": 2.5, "m": 3i64});
        let (d, _) = upd(doc! {"_id": 1, "n": i32::MAX}, doc! {"$inc": {"n": 1}});
        assert_eq!(d, doc! {"_id": 1, "n": i64::from(i32::MAX) + 1});
        let mut d = doc! {"_id": 1, "s": "x"};
        assert!(matches!(
            apply_update(&mut d, &doc! {"$inc": {"s": 1}}, false),
            Err(MatchError::TypeMismatch { .. })
        ));
        assert!(apply_update(&mut d, &doc! {"$inc": {"n": "1"}}, false).is_err());
    }

    #[test]
    fn max_and_min() {
        let (d, ch) = upd(
            doc! {"_id": 1, "hi": 5, "lo": 5},
            doc! {"$max": {"hi": 7, "lo": 1}},
        );
        assert_eq!(d, doc! {"_id": 1, "hi": 7, "lo": 5});
        assert_eq!(ch.updated_fields, doc! {"hi": 7});
        let (d, _) = upd(
            doc! {"_id": 1, "hi": 5, "lo": 5},
            doc! {"$min": {"hi": 7, "lo": 1, "new": 0}},
        );
        assert_eq!(d, doc! {"_id": 1, "hi": 5, "lo": 1, "new": 0});
    }

    #[test]
    fn set_on_insert_only_on_insert() {
        let (d, _) = upd(
            doc! {"_id": 1},
            doc! {"$setOnInsert": {"a": 1}, "$set": {"b": 2}},
        );
        assert_eq!(d, doc! {"_id": 1, "b": 2});
        let mut d = doc! {"_id": 1};
        apply_update(&mut d, &doc! {"$setOnInsert": {"a": 1}}, true).expect("applies");
        assert_eq!(d, doc! {"_id": 1, "a": 1});
    }

    #[test]
    fn refusals() {
        let mut d = doc! {"_id": 1, "a": 1};
        assert_eq!(
            apply_update(&mut d, &doc! {"$push": {"a": 1}}, false),
            Err(MatchError::UnknownUpdateOperator("$push".into()))
        );
        assert!(matches!(
            apply_update(&mut d, &doc! {"$set": {"a": 1}, "b": 2}, false),
            Err(MatchError::MixedUpdate(_))
        ));
        assert!(matches!(
            apply_update(&mut d, &doc! {"$set": {"a": 1}, "$inc": {"a": 1}}, false),
            Err(MatchError::ConflictingUpdate(..))
        ));
        assert!(matches!(
            apply_update(&mut d, &doc! {"$set": {"a": 1, "a.b": 1}}, false),
            Err(MatchError::ConflictingUpdate(..))
        ));
        assert_eq!(
            apply_update(&mut d, &doc! {"$set": {"_id": 2}}, false),
            Err(MatchError::ImmutableField("_id".into()))
        );
        assert!(apply_update(&mut d, &doc! {"$set": {"_id": 1}}, false).is_ok());
        assert_eq!(d, doc! {"_id": 1, "a": 1});
    }

    #[test]
    fn replacement() {
        assert!(!is_operator_update(&doc! {"a": 1}));
        assert!(is_operator_update(&doc! {"$set": {"a": 1}}));
        let (d, ch) = upd(doc! {"_id": 1, "a": 1}, doc! {"b": 2});
        assert_eq!(d, doc! {"_id": 1, "b": 2});
        assert!(ch.is_empty());
        let mut d = doc! {"_id": 1};
        assert!(apply_update(&mut d, &doc! {"_id": 2, "b": 1}, false).is_err());
        assert!(validate_replacement(&doc! {"a": 1, "$set": {}}).is_err());
    }

    #[test]
    fn pipeline_updates_use_expressions_and_report_changes() {
        let mut d = doc! { "_id": "s", "owner": "a", "epoch": 3_i64, "gone": 1 };
        let stages = vec![
            doc! { "$set": {
                "owner": "b",
                "epoch": { "$add": [ { "$ifNull": ["$epoch", 0] }, 1 ] },
                "expiresAt": { "$add": ["$$NOW", 30_000] },
            } },
            doc! { "$unset": "gone" },
        ];
        let changes = apply_pipeline_update(&mut d, &stages, DateTime::from_millis(1_000)).unwrap();
        assert_eq!(
            d,
            doc! { "_id": "s", "owner": "b", "epoch": 4_i64, "expiresAt": DateTime::from_millis(31_000) }
        );
        assert_eq!(changes.removed_fields, vec!["gone".to_string()]);
        assert_eq!(changes.updated_fields.len(), 3);
        // An upsert starts from the filter's seed, where `$epoch` is missing.
        let mut seed = doc! { "_id": "t" };
        apply_pipeline_update(&mut seed, &stages[..1], DateTime::from_millis(0)).unwrap();
        assert_eq!(seed.get("epoch"), Some(&Bson::Int32(1)));

        let before = d.clone();
        let err = apply_pipeline_update(
            &mut d,
            &[doc! {"$set": {"_id": "x"}}],
            DateTime::from_millis(0),
        );
        assert_eq!(err, Err(MatchError::ImmutableField("_id".into())));
        let err = apply_pipeline_update(&mut d, &[doc! {"$match": {}}], DateTime::from_millis(0));
        assert!(err.is_err());
        assert_eq!(d, before, "a refused update changes nothing");
    }
}
