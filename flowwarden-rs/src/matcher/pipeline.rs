//! The aggregation stages a change stream accepts after `$changeStream` ("Modify Change Stream
//! Output" in the MongoDB manual), evaluated on one change event at a time.

use bson::{Bson, DateTime, Document};

use super::expression::Expression;
use super::update::{set_path, unset_path};
use super::{Filter, MatchError, Projection};

/// A parsed change-stream pipeline (the stages after `$changeStream`).
///
/// Supported stages: `$match`, `$project` (inclusion/exclusion, plus computed fields in an
/// inclusion projection), `$addFields` / `$set` (with the aggregation expressions of
/// [`Expression`]), `$unset`, and `$changeStreamSplitLargeEvent`
/// as the last stage (reported by [`EventPipeline::splits_large_events`]; splitting is the
/// caller's business). Any other stage is refused with [`MatchError::UnknownStage`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventPipeline {
    stages: Vec<Stage>,
    split_large_events: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Stage {
    Match(Filter),
    Project(Projection),
    ProjectComputed(Vec<(String, Expression)>, bool),
    AddFields(Vec<(String, Expression)>),
    Unset(Vec<String>),
}

impl EventPipeline {
    /// Parses the stages that follow `$changeStream`.
    pub fn parse(stages: &[Document]) -> Result<EventPipeline, MatchError> {
        let mut out = EventPipeline::default();
        for (i, stage) in stages.iter().enumerate() {
            let mut entries = stage.iter();
            let (name, arg) = match (entries.next(), entries.next()) {
                (Some(entry), None) => entry,
                _ => {
                    return Err(MatchError::BadValue {
                        op: "pipeline".into(),
                        message: "a pipeline stage must have exactly one field".into(),
                    })
                }
            };
            let doc_arg = || {
                arg.as_document().ok_or_else(|| MatchError::BadValue {
                    op: name.clone(),
                    message: "argument must be a document".into(),
                })
            };
            let parsed = match name.as_str() {
                "$match" => Stage::Match(Filter::parse(doc_arg()?)?),
                "$project" => parse_project(doc_arg()?)?,
                "$addFields" | "$set" => Stage::AddFields(parse_fields(doc_arg()?)?),
                "$unset" => Stage::Unset(match arg {
                    Bson::String(s) => vec![s.clone()],
                    Bson::Array(items) => items
                        .iter()
                        .map(|b| {
                            b.as_str()
                                .map(str::to_string)
                                .ok_or_else(|| MatchError::BadValue {
                                    op: name.clone(),
                                    message: "field names must be strings".into(),
                                })
                        })
                        .collect::<Result<_, _>>()?,
                    _ => {
                        return Err(MatchError::BadValue {
                            op: name.clone(),
                            message: "argument must be a string or an array of strings".into(),
                        })
                    }
                }),
                "$changeStreamSplitLargeEvent" => {
                    if i + 1 != stages.len() {
                        return Err(MatchError::BadValue {
                            op: name.clone(),
                            message: "must be the last stage of the pipeline".into(),
                        });
                    }
                    out.split_large_events = true;
                    continue;
                }
                other => return Err(MatchError::UnknownStage(other.to_string())),
            };
            out.stages.push(parsed);
        }
        Ok(out)
    }

    /// Whether the pipeline ends with `$changeStreamSplitLargeEvent`.
    pub fn splits_large_events(&self) -> bool {
        self.split_large_events
    }

    /// Whether the pipeline has no stage that changes or filters events.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Whether the pipeline has a `$match` stage (an update pipeline may not).
    pub fn has_match(&self) -> bool {
        self.stages.iter().any(|s| matches!(s, Stage::Match(_)))
    }

    /// Runs the stages on one event; `None` when a `$match` rejects it.
    pub fn apply(&self, event: Document) -> Option<Document> {
        self.apply_at(event, DateTime::now())
    }

    /// [`EventPipeline::apply`] with `now` as `$$NOW`.
    pub fn apply_at(&self, event: Document, now: DateTime) -> Option<Document> {
        let mut event = event;
        for stage in &self.stages {
            event = match stage {
                Stage::Match(f) => {
                    if !f.matches_at(&event, now) {
                        return None;
                    }
                    event
                }
                Stage::Project(p) => p.apply(&event),
                Stage::ProjectComputed(fields, include_id) => {
                    let mut out = Document::new();
                    if *include_id {
                        if let Some(id) = event.get("_id") {
                            out.insert("_id", id.clone());
                        }
                    }
                    for (path, expr) in fields {
                        if let Some(v) = expr.eval(&event, now) {
                            let _ = set_path(&mut out, path, v);
                        }
                    }
                    out
                }
                Stage::AddFields(fields) => {
                    let snapshot = event.clone();
                    for (path, expr) in fields {
                        match expr.eval(&snapshot, now) {
                            Some(v) => {
                                let _ = set_path(&mut event, path, v);
                            }
                            None => {
                                unset_path(&mut event, path);
                            }
                        }
                    }
                    event
                }
                Stage::Unset(paths) => {
                    for p in paths {
                        unset_path(&mut event, p);
                    }
                    event
                }
            };
        }
        Some(event)
    }
}

fn parse_project(spec: &Document) -> Result<Stage, MatchError> {
    let computed = spec.values().any(|v| {
        !matches!(
            v,
            Bson::Boolean(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)
        )
    });
    if !computed {
        return Ok(Stage::Project(Projection::parse(spec)?));
    }
    let mut fields = Vec::new();
    let mut include_id = true;
    for (key, value) in spec {
        let flag = match value {
            Bson::Boolean(b) => Some(*b),
            Bson::Int32(n) => Some(*n != 0),
            Bson::Int64(n) => Some(*n != 0),
            Bson::Double(f) => Some(*f != 0.0),
            _ => None,
        };
        match flag {
            Some(false) if key == "_id" => include_id = false,
            Some(false) => {
                return Err(MatchError::MixedProjection(
                    "exclusion",
                    key.clone(),
                    "inclusion",
                ))
            }
            Some(true) => fields.push((key.clone(), Expression::field(key))),
            None => fields.push((key.clone(), Expression::parse(value)?)),
        }
    }
    Ok(Stage::ProjectComputed(fields, include_id))
}

fn parse_fields(spec: &Document) -> Result<Vec<(String, Expression)>, MatchError> {
    spec.iter()
        .map(|(k, v)| Ok((k.clone(), Expression::parse(v)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn event() -> Document {
        doc! {
            "_id": {"_data": "00AB"},
            "operationType": "insert",
            "ns": {"db": "d", "coll": "c"},
            "fullDocument": {"_id": 1, "secret": "s", "v": 2},
        }
    }

    #[test]
    fn match_stage_filters() {
        let p =
            EventPipeline::parse(&[doc! {"$match": {"operationType": "insert"}}]).expect("parses");
        assert!(p.apply(event()).is_some());
        let p =
            EventPipeline::parse(&[doc! {"$match": {"operationType": "delete"}}]).expect("parses");
        assert!(p.apply(event()).is_none());
        let p = EventPipeline::parse(&[doc! {"$match": {"fullDocument.v": {"$gt": 1}}}])
            .expect("parses");
        assert!(p.apply(event()).is_some());
    }

    #[test]
    fn project_and_unset() {
        let p =
            EventPipeline::parse(&[doc! {"$project": {"fullDocument.secret": 0}}]).expect("parses");
        let out = p.apply(event()).expect("kept");
        assert_eq!(
            out.get_document("fullDocument").expect("doc"),
            &doc! {"_id": 1, "v": 2}
        );
        let p = EventPipeline::parse(&[doc! {"$project": {"operationType": 1}}]).expect("parses");
        assert_eq!(
            p.apply(event()),
            Some(doc! {"_id": {"_data": "00AB"}, "operationType": "insert"})
        );
        let p =
            EventPipeline::parse(&[doc! {"$unset": ["fullDocument", "ns.db"]}]).expect("parses");
        let out = p.apply(event()).expect("kept");
        assert!(!out.contains_key("fullDocument"));
        assert_eq!(out.get_document("ns").expect("ns"), &doc! {"coll": "c"});
    }

    #[test]
    fn add_fields_with_references() {
        let p = EventPipeline::parse(&[
            doc! {"$addFields": {"tag": "x", "val": "$fullDocument.v", "lit": {"$literal": "$x"}}},
        ])
        .expect("parses");
        let out = p.apply(event()).expect("kept");
        assert_eq!(out.get_str("tag"), Ok("x"));
        assert_eq!(out.get_i32("val"), Ok(2));
        assert_eq!(out.get_str("lit"), Ok("$x"));
        let p = EventPipeline::parse(&[doc! {"$project": {"op": "$operationType", "_id": 0}}])
            .expect("parses");
        assert_eq!(p.apply(event()), Some(doc! {"op": "insert"}));
    }

    #[test]
    fn refuses_other_stages() {
        assert_eq!(
            EventPipeline::parse(&[doc! {"$group": {"_id": 1}}]),
            Err(MatchError::UnknownStage("$group".into()))
        );
        assert!(EventPipeline::parse(&[doc! {"$addFields": {"x": {"$concat": ["a"]}}}]).is_err());
        assert!(EventPipeline::parse(&[doc! {"$match": {"a": {"$regex": "x"}}}]).is_err());
    }

    #[test]
    fn split_stage_must_be_last() {
        let p = EventPipeline::parse(&[
            doc! {"$match": {}},
            doc! {"$changeStreamSplitLargeEvent": {}},
        ])
        .expect("parses");
        assert!(p.splits_large_events());
        assert!(!EventPipeline::parse(&[doc! {"$match": {}}])
            .expect("parses")
            .splits_large_events());
        assert!(EventPipeline::parse(&[
            doc! {"$changeStreamSplitLargeEvent": {}},
            doc! {"$match": {}}
        ])
        .is_err());
    }
}
