//! Find projections ("Project Fields to Return from Query" in the MongoDB manual).

use std::collections::BTreeMap;

use bson::{Bson, Document};

use super::MatchError;

/// A parsed inclusion or exclusion projection (`{a: 1, "b.c": 1}` or `{a: 0}`), with the
/// `_id` rules of MongoDB: `_id` is included unless excluded explicitly, and `_id: 0` may be
/// combined with an inclusion projection.
///
/// Projection operators (`$slice`, `$elemMatch`, `$`) and expressions are refused.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    inclusion: bool,
    include_id: bool,
    tree: Node,
}

#[derive(Debug, Clone, PartialEq, Default)]
struct Node {
    leaf: bool,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn insert(&mut self, path: &str) {
        let mut node = self;
        for part in path.split('.') {
            node = node.children.entry(part.to_string()).or_default();
            if node.leaf {
                return;
            }
        }
        node.leaf = true;
        node.children.clear();
    }
}

impl Projection {
    /// Parses a projection document. Values must be numbers or booleans.
    pub fn parse(spec: &Document) -> Result<Projection, MatchError> {
        let mut inclusion: Option<bool> = None;
        let mut include_id = true;
        let mut tree = Node::default();
        for (key, value) in spec {
            if key.starts_with('$') {
                return Err(MatchError::UnknownOperator(key.clone()));
            }
            let on = match value {
                Bson::Boolean(b) => *b,
                Bson::Int32(n) => *n != 0,
                Bson::Int64(n) => *n != 0,
                Bson::Double(f) => *f != 0.0,
                Bson::Document(d) => {
                    let op = d.keys().next().cloned().unwrap_or_else(|| "{}".into());
                    return Err(MatchError::UnknownOperator(op));
                }
                other => {
                    return Err(MatchError::BadValue {
                        op: "projection".into(),
                        message: format!("unsupported value for '{key}': {other}"),
                    })
                }
            };
            if key == "_id" {
                include_id = on;
                continue;
            }
            match inclusion {
                None => inclusion = Some(on),
                Some(mode) if mode != on => {
                    return Err(if mode {
                        MatchError::MixedProjection("exclusion", key.clone(), "inclusion")
                    } else {
                        MatchError::MixedProjection("inclusion", key.clone(), "exclusion")
                    })
                }
                Some(_) => {}
            }
            tree.insert(key);
        }
        // `{_id: 1}` alone is an inclusion projection; `{_id: 0}` alone an exclusion one.
        let inclusion = inclusion.unwrap_or(include_id && !spec.is_empty());
        Ok(Projection {
            inclusion,
            include_id,
            tree,
        })
    }

    /// Whether this is an inclusion projection.
    pub fn is_inclusion(&self) -> bool {
        self.inclusion
    }

    /// Applies the projection, returning the projected copy of `doc`.
    pub fn apply(&self, doc: &Document) -> Document {
        let mut out = if self.inclusion {
            include(doc, &self.tree)
        } else {
            exclude(doc, &self.tree)
        };
        if self.inclusion && self.include_id {
            if let Some(id) = doc.get("_id") {
                if !out.contains_key("_id") {
                    let mut with_id = Document::new();
                    with_id.insert("_id", id.clone());
                    with_id.extend(out);
                    out = with_id;
                }
            }
        }
        if !self.include_id {
            out.remove("_id");
        }
        out
    }
}

fn include(doc: &Document, node: &Node) -> Document {
    let mut out = Document::new();
    for (key, value) in doc {
        let Some(child) = node.children.get(key) else {
            if key == "_id" {
                out.insert(key, value.clone());
            }
            continue;
        };
        if child.leaf {
            out.insert(key, value.clone());
            continue;
        }
        match value {
            Bson::Document(d) => {
                out.insert(key, include(d, child));
            }
            Bson::Array(items) => {
                let kept: Vec<Bson> = items
                    .iter()
                    .filter_map(|item| match item {
                        Bson::Document(d) => Some(Bson::Document(include(d, child))),
                        _ => None,
                    })
                    .collect();
                out.insert(key, kept);
            }
            _ => {}
        }
    }
    out
}

fn exclude(doc: &Document, node: &Node) -> Document {
    let mut out = Document::new();
    for (key, value) in doc {
        let Some(child) = node.children.get(key) else {
            out.insert(key, value.clone());
            continue;
        };
        if child.leaf {
            continue;
        }
        match value {
            Bson::Document(d) => {
                out.insert(key, exclude(d, child));
            }
            Bson::Array(items) => {
                let kept: Vec<Bson> = items
                    .iter()
                    .map(|item| match item {
                        Bson::Document(d) => Bson::Document(exclude(d, child)),
                        other => other.clone(),
                    })
                    .collect();
                out.insert(key, kept);
            }
            other => {
                out.insert(key, other.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn p(spec: Document, d: &Document) -> Document {
        Projection::parse(&spec)
            .expect("projection parses")
            .apply(d)
    }

    #[test]
    fn inclusion_keeps_id_and_order() {
        let d = doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": 4};
        assert_eq!(
            p(doc! {"e": 1, "a": 1}, &d),
            doc! {"_id": 1, "a": 1, "e": 4}
        );
        assert_eq!(p(doc! {"b.c": 1, "_id": 0}, &d), doc! {"b": {"c": 2}});
        assert_eq!(p(doc! {"_id": 1}, &d), doc! {"_id": 1});
        assert_ne!(p(doc! {"a": 1}, &d), doc! {"a": 1});
    }

    #[test]
    fn inclusion_through_arrays() {
        let d = doc! {"_id": 1, "xs": [{"k": 1, "v": 2}, 7, {"v": 3}]};
        assert_eq!(
            p(doc! {"xs.v": 1}, &d),
            doc! {"_id": 1, "xs": [{"v": 2}, {"v": 3}]}
        );
    }

    #[test]
    fn exclusion() {
        let d = doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}};
        assert_eq!(p(doc! {"a": 0}, &d), doc! {"_id": 1, "b": {"c": 2, "d": 3}});
        assert_eq!(
            p(doc! {"b.c": 0, "_id": 0}, &d),
            doc! {"a": 1, "b": {"d": 3}}
        );
        assert_eq!(p(doc! {"_id": 0}, &d), doc! {"a": 1, "b": {"c": 2, "d": 3}});
        assert_eq!(p(doc! {}, &d), d);
    }

    #[test]
    fn refuses_mixing_and_operators() {
        assert!(matches!(
            Projection::parse(&doc! {"a": 1, "b": 0}),
            Err(MatchError::MixedProjection(..))
        ));
        assert_eq!(
            Projection::parse(&doc! {"a": {"$slice": 1}}),
            Err(MatchError::UnknownOperator("$slice".into()))
        );
        assert!(Projection::parse(&doc! {"a": 1, "_id": 0}).is_ok());
        assert!(Projection::parse(&doc! {"a": "x"}).is_err());
    }
}
