//! Query filters ("Query and Projection Operators" in the MongoDB manual).

use std::cmp::Ordering;

use bson::{Bson, DateTime, Document};

use super::compare::{bson_equal, compare_bson, type_bracket};
use super::expression::Expression;
use super::{array_index, MatchError};
use crate::bson_order::{is_of_type, type_alias, type_alias_of_code};

/// A parsed MongoDB query filter.
///
/// Supported: implicit equality, `$eq`, `$ne`, `$in`, `$nin`, `$lt`, `$lte`, `$gt`, `$gte`,
/// `$exists`, `$type` (aliases, codes and arrays of them), `$not`, `$size`, `$and`, `$or`, `$nor`, `$comment` (ignored) and `$expr` (with the
/// aggregation expressions of [`Expression`]), on dotted paths that go through sub-documents and
/// arrays of sub-documents. Every other operator is refused by [`Filter::parse`] with
/// [`MatchError::UnknownOperator`].
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    root: Expr,
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Nor(Vec<Expr>),
    Field(String, Vec<Cond>),
    Aggregate(Expression),
}

#[derive(Debug, Clone, PartialEq)]
enum Cond {
    Eq(Bson),
    Ne(Bson),
    In(Vec<Bson>),
    Nin(Vec<Bson>),
    Cmp(CmpOp, Bson),
    Exists(bool),
    Size(usize),
    Type(Vec<&'static str>),
    Not(Vec<Cond>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum CmpOp {
    Lt,
    Lte,
    Gt,
    Gte,
}

impl Filter {
    /// Parses a filter document. Unknown operators are refused, naming the operator.
    pub fn parse(filter: &Document) -> Result<Filter, MatchError> {
        Ok(Filter {
            root: Expr::And(parse_clauses(filter)?),
        })
    }

    /// A filter that matches every document (the empty filter `{}`).
    pub fn match_all() -> Filter {
        Filter {
            root: Expr::And(Vec::new()),
        }
    }

    /// Whether `doc` satisfies the filter, with the current time as `$$NOW`.
    pub fn matches(&self, doc: &Document) -> bool {
        self.matches_at(doc, DateTime::now())
    }

    /// Whether `doc` satisfies the filter, with `now` as `$$NOW` (a server with its own clock).
    pub fn matches_at(&self, doc: &Document, now: DateTime) -> bool {
        eval(&self.root, doc, now)
    }

    /// The fields an upsert seeds a new document with: top-level equality conditions
    /// (implicit or `$eq`, also inside `$and`), as MongoDB does when an upsert inserts.
    pub fn equality_seed(&self) -> Document {
        let mut out = Document::new();
        seed(&self.root, &mut out);
        out
    }
}

fn seed(expr: &Expr, out: &mut Document) {
    match expr {
        Expr::And(items) => items.iter().for_each(|e| seed(e, out)),
        Expr::Field(path, conds) => {
            for c in conds {
                if let Cond::Eq(v) = c {
                    // Dotted equality seeds are set as nested fields.
                    let _ = super::update::set_path(out, path, v.clone());
                }
            }
        }
        Expr::Or(_) | Expr::Nor(_) | Expr::Aggregate(_) => {}
    }
}

fn parse_clauses(filter: &Document) -> Result<Vec<Expr>, MatchError> {
    let mut out = Vec::with_capacity(filter.len());
    for (key, value) in filter {
        match key.as_str() {
            "$and" | "$or" | "$nor" => {
                let items = value.as_array().ok_or_else(|| MatchError::BadValue {
                    op: key.clone(),
                    message: "argument must be an array".into(),
                })?;
                if items.is_empty() {
                    return Err(MatchError::BadValue {
                        op: key.clone(),
                        message: "argument must be a non-empty array".into(),
                    });
                }
                let mut exprs = Vec::with_capacity(items.len());
                for item in items {
                    let d = item.as_document().ok_or_else(|| MatchError::BadValue {
                        op: key.clone(),
                        message: "array entries must be documents".into(),
                    })?;
                    exprs.push(Expr::And(parse_clauses(d)?));
                }
                out.push(match key.as_str() {
                    "$and" => Expr::And(exprs),
                    "$or" => Expr::Or(exprs),
                    _ => Expr::Nor(exprs),
                });
            }
            "$comment" => {}
            "$expr" => out.push(Expr::Aggregate(Expression::parse(value)?)),
            k if k.starts_with('$') => return Err(MatchError::UnknownOperator(k.to_string())),
            _ => out.push(Expr::Field(key.clone(), parse_conditions(value)?)),
        }
    }
    Ok(out)
}

fn is_operator_doc(value: &Bson) -> Option<&Document> {
    match value {
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => Some(d),
        _ => None,
    }
}

fn parse_conditions(value: &Bson) -> Result<Vec<Cond>, MatchError> {
    let Some(ops) = is_operator_doc(value) else {
        return Ok(vec![Cond::Eq(value.clone())]);
    };
    let mut conds = Vec::with_capacity(ops.len());
    for (op, arg) in ops {
        let array_arg = || {
            arg.as_array().cloned().ok_or_else(|| MatchError::BadValue {
                op: op.clone(),
                message: "argument must be an array".into(),
            })
        };
        conds.push(match op.as_str() {
            "$eq" => Cond::Eq(arg.clone()),
            "$ne" => Cond::Ne(arg.clone()),
            "$in" => Cond::In(array_arg()?),
            "$nin" => Cond::Nin(array_arg()?),
            "$lt" => Cond::Cmp(CmpOp::Lt, arg.clone()),
            "$lte" => Cond::Cmp(CmpOp::Lte, arg.clone()),
            "$gt" => Cond::Cmp(CmpOp::Gt, arg.clone()),
            "$gte" => Cond::Cmp(CmpOp::Gte, arg.clone()),
            "$exists" => Cond::Exists(truthy(arg)),
            "$type" => Cond::Type(type_aliases(op, arg)?),
            "$size" => {
                let n = match arg {
                    Bson::Int32(n) => usize::try_from(*n).ok(),
                    Bson::Int64(n) => usize::try_from(*n).ok(),
                    Bson::Double(f) if f.fract() == 0.0 && *f >= 0.0 =>
                    {
                        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                        Some(*f as usize)
                    }
                    _ => None,
                };
                Cond::Size(n.ok_or_else(|| MatchError::BadValue {
                    op: op.clone(),
                    message: "argument must be a non-negative whole number".into(),
                })?)
            }
            "$not" => match arg {
                Bson::Document(d) if is_operator_doc(arg).is_some() => {
                    Cond::Not(parse_conditions(&Bson::Document(d.clone()))?)
                }
                _ => {
                    return Err(MatchError::BadValue {
                        op: op.clone(),
                        message: "argument must be a document of operators".into(),
                    })
                }
            },
            other => return Err(MatchError::UnknownOperator(other.to_string())),
        });
    }
    Ok(conds)
}

fn truthy(value: &Bson) -> bool {
    match value {
        Bson::Boolean(b) => *b,
        Bson::Int32(n) => *n != 0,
        Bson::Int64(n) => *n != 0,
        Bson::Double(f) => *f != 0.0,
        Bson::Null | Bson::Undefined => false,
        _ => true,
    }
}

fn eval(expr: &Expr, doc: &Document, now: DateTime) -> bool {
    match expr {
        Expr::And(items) => items.iter().all(|e| eval(e, doc, now)),
        Expr::Or(items) => items.iter().any(|e| eval(e, doc, now)),
        Expr::Nor(items) => !items.iter().any(|e| eval(e, doc, now)),
        Expr::Aggregate(e) => e.is_true(doc, now),
        Expr::Field(path, conds) => {
            let mut values = Vec::new();
            collect(doc, path, &mut values);
            conds.iter().all(|c| check(c, &values))
        }
    }
}

/// Collects the values a dotted path reaches, expanding arrays met on the way (an array of
/// sub-documents contributes each element's field). The final value is not expanded.
fn collect<'a>(doc: &'a Document, path: &str, out: &mut Vec<&'a Bson>) {
    match path.split_once('.') {
        None => {
            if let Some(v) = doc.get(path) {
                out.push(v);
            }
        }
        Some((head, rest)) => {
            if let Some(v) = doc.get(head) {
                collect_value(v, rest, out);
            }
        }
    }
}

fn collect_value<'a>(value: &'a Bson, path: &str, out: &mut Vec<&'a Bson>) {
    match value {
        Bson::Document(d) => collect(d, path, out),
        Bson::Array(items) => {
            let (head, rest) = match path.split_once('.') {
                Some((h, r)) => (h, Some(r)),
                None => (path, None),
            };
            if let Some(i) = array_index(head) {
                if let Some(item) = items.get(i) {
                    match rest {
                        None => out.push(item),
                        Some(r) => collect_value(item, r, out),
                    }
                }
            }
            for item in items {
                if let Bson::Document(d) = item {
                    collect(d, path, out);
                }
            }
        }
        _ => {}
    }
}

/// The aliases a `$type` argument names: an alias, a numeric code, or an array of them.
fn type_aliases(op: &str, arg: &Bson) -> Result<Vec<&'static str>, MatchError> {
    let one = |v: &Bson| -> Result<&'static str, MatchError> {
        let alias = match v {
            Bson::String(s) => type_alias(s),
            Bson::Int32(n) => type_alias_of_code(i64::from(*n)),
            Bson::Int64(n) => type_alias_of_code(*n),
            Bson::Double(f) if f.fract() == 0.0 =>
            {
                #[allow(clippy::cast_possible_truncation)]
                type_alias_of_code(*f as i64)
            }
            _ => None,
        };
        alias.ok_or_else(|| MatchError::BadValue {
            op: op.to_owned(),
            message: format!("unknown type name alias or code: {v}"),
        })
    };
    match arg {
        Bson::Array(items) if !items.is_empty() => items.iter().map(one).collect(),
        Bson::Array(_) => Err(MatchError::BadValue {
            op: op.to_owned(),
            message: "must match at least one type".into(),
        }),
        other => Ok(vec![one(other)?]),
    }
}

/// Whether one reached value, or (if it is an array) one of its elements, satisfies `pred`.
fn any_leaf(value: &Bson, pred: &dyn Fn(&Bson) -> bool) -> bool {
    if pred(value) {
        return true;
    }
    match value {
        Bson::Array(items) => items.iter().any(pred),
        _ => false,
    }
}

fn eq_matches(values: &[&Bson], target: &Bson) -> bool {
    if values.is_empty() {
        return matches!(target, Bson::Null);
    }
    values.iter().any(|v| {
        any_leaf(v, &|x| {
            bson_equal(x, target) || (matches!(target, Bson::Null) && matches!(x, Bson::Undefined))
        })
    })
}

fn check(cond: &Cond, values: &[&Bson]) -> bool {
    match cond {
        Cond::Eq(t) => eq_matches(values, t),
        Cond::Ne(t) => !eq_matches(values, t),
        Cond::In(ts) => ts.iter().any(|t| eq_matches(values, t)),
        Cond::Nin(ts) => !ts.iter().any(|t| eq_matches(values, t)),
        Cond::Exists(want) => values.is_empty() != *want,
        Cond::Type(aliases) => values
            .iter()
            .any(|v| any_leaf(v, &|x| aliases.iter().any(|a| is_of_type(a, x)))),
        Cond::Size(n) => values
            .iter()
            .any(|v| matches!(v, Bson::Array(items) if items.len() == *n)),
        Cond::Not(inner) => !inner.iter().all(|c| check(c, values)),
        Cond::Cmp(op, t) => {
            if values.is_empty() {
                // A missing field compares as null for the inclusive operators only.
                return matches!(t, Bson::Null) && matches!(op, CmpOp::Lte | CmpOp::Gte);
            }
            let pred = |x: &Bson| {
                if type_bracket(x) != type_bracket(t) {
                    return false;
                }
                let ord = compare_bson(x, t);
                match op {
                    CmpOp::Lt => ord == Ordering::Less,
                    CmpOp::Lte => ord != Ordering::Greater,
                    CmpOp::Gt => ord == Ordering::Greater,
                    CmpOp::Gte => ord != Ordering::Less,
                }
            };
            values.iter().any(|v| any_leaf(v, &pred))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn m(filter: Document, d: Document) -> bool {
        Filter::parse(&filter).expect("filter parses").matches(&d)
    }

    #[test]
    fn implicit_equality_and_arrays() {
        assert!(m(doc! {"a": 1}, doc! {"a": 1.0}));
        assert!(!m(doc! {"a": 1}, doc! {"a": 2}));
        assert!(!m(doc! {"a": 1}, doc! {"a": "1"}));
        assert!(m(doc! {"a": 2}, doc! {"a": [1, 2, 3]}));
        assert!(m(doc! {"a": [1, 2]}, doc! {"a": [1, 2]}));
        assert!(!m(doc! {"a": [2, 1]}, doc! {"a": [1, 2]}));
        assert!(m(doc! {"a": {"b": 1}}, doc! {"a": {"b": 1}}));
        assert!(!m(doc! {"a": {"b": 1}}, doc! {"a": {"b": 1, "c": 2}}));
        assert!(m(doc! {"a": null}, doc! {"b": 1}));
        assert!(!m(doc! {"a": null}, doc! {"a": 0}));
        assert!(m(doc! {}, doc! {"x": 1}));
    }

    #[test]
    fn dotted_paths() {
        let d = doc! {"a": {"b": {"c": 3}}, "items": [{"k": 1}, {"k": 2}], "n": [10, 20]};
        assert!(m(doc! {"a.b.c": 3}, d.clone()));
        assert!(!m(doc! {"a.b.c": 4}, d.clone()));
        assert!(m(doc! {"items.k": 2}, d.clone()));
        assert!(!m(doc! {"items.k": 3}, d.clone()));
        assert!(m(doc! {"items.1.k": 2}, d.clone()));
        assert!(!m(doc! {"items.0.k": 2}, d.clone()));
        assert!(m(doc! {"n.1": 20}, d.clone()));
        assert!(!m(doc! {"a.b.c.d": 3}, d));
    }

    #[test]
    fn eq_ne() {
        assert!(m(doc! {"a": {"$eq": 5}}, doc! {"a": 5i64}));
        assert!(!m(doc! {"a": {"$eq": 5}}, doc! {"a": 6}));
        assert!(m(doc! {"a": {"$ne": 5}}, doc! {"a": 6}));
        assert!(m(doc! {"a": {"$ne": 5}}, doc! {"b": 5}));
        assert!(!m(doc! {"a": {"$ne": 5}}, doc! {"a": [4, 5]}));
    }

    #[test]
    fn in_nin() {
        assert!(m(doc! {"a": {"$type": "string"}}, doc! {"a": "x"}));
        assert!(m(doc! {"a": {"$type": ["int", "objectId"]}}, doc! {"a": 3}));
        assert!(m(doc! {"a": {"$type": 2}}, doc! {"a": ["x", 1]}));
        assert!(m(doc! {"a": {"$type": "number"}}, doc! {"a": 2.5}));
        assert!(!m(doc! {"a": {"$type": "string"}}, doc! {"a": 3}));
        assert!(!m(doc! {"a": {"$type": "string"}}, doc! {}));
        assert!(Filter::parse(&doc! {"a": {"$type": "nope"}}).is_err());
        assert!(Filter::parse(&doc! {"a": {"$type": []}}).is_err());
        assert!(m(doc! {"a": {"$in": [1, 2]}}, doc! {"a": 2}));
        assert!(!m(doc! {"a": {"$in": [1, 2]}}, doc! {"a": 3}));
        assert!(m(doc! {"a": {"$in": [null]}}, doc! {}));
        assert!(m(doc! {"a": {"$nin": [1, 2]}}, doc! {"a": 3}));
        assert!(!m(doc! {"a": {"$nin": [1, 2]}}, doc! {"a": [0, 1]}));
        assert!(Filter::parse(&doc! {"a": {"$in": 1}}).is_err());
    }

    #[test]
    fn comparisons_stay_in_their_bracket() {
        assert!(m(doc! {"a": {"$gt": 1}}, doc! {"a": 1.5}));
        assert!(!m(doc! {"a": {"$gt": 1}}, doc! {"a": 1}));
        assert!(m(doc! {"a": {"$gte": 1}}, doc! {"a": 1i64}));
        assert!(m(doc! {"a": {"$lt": 1}}, doc! {"a": 0}));
        assert!(!m(doc! {"a": {"$lt": 1}}, doc! {"a": "0"}));
        assert!(m(doc! {"a": {"$lte": "b"}}, doc! {"a": "a"}));
        assert!(!m(doc! {"a": {"$gt": 1}}, doc! {}));
        assert!(!m(doc! {"a": {"$gt": 1}}, doc! {"a": null}));
        assert!(m(doc! {"a": {"$gt": 2, "$lt": 4}}, doc! {"a": [1, 3]}));
        // Each condition may be met by a different element, as in MongoDB.
        assert!(m(doc! {"a": {"$gt": 5, "$lt": 6}}, doc! {"a": [1, 9]}));
        assert!(!m(doc! {"a": {"$gt": 5, "$lt": 6}}, doc! {"a": [1, 2]}));
    }

    #[test]
    fn exists_and_size() {
        assert!(m(doc! {"a": {"$exists": true}}, doc! {"a": null}));
        assert!(!m(doc! {"a": {"$exists": true}}, doc! {"b": 1}));
        assert!(m(doc! {"a": {"$exists": false}}, doc! {"b": 1}));
        assert!(!m(doc! {"a.b": {"$exists": false}}, doc! {"a": {"b": 1}}));
        assert!(m(doc! {"a": {"$size": 2}}, doc! {"a": [1, 2]}));
        assert!(!m(doc! {"a": {"$size": 2}}, doc! {"a": [1]}));
    }

    #[test]
    fn logical_operators() {
        let d = doc! {"a": 1, "b": 2};
        assert!(m(doc! {"$and": [{"a": 1}, {"b": 2}]}, d.clone()));
        assert!(!m(doc! {"$and": [{"a": 1}, {"b": 3}]}, d.clone()));
        assert!(m(doc! {"$or": [{"a": 9}, {"b": 2}]}, d.clone()));
        assert!(!m(doc! {"$or": [{"a": 9}, {"b": 9}]}, d.clone()));
        assert!(m(doc! {"$nor": [{"a": 9}, {"b": 9}]}, d.clone()));
        assert!(!m(doc! {"$nor": [{"a": 1}]}, d.clone()));
        assert!(m(doc! {"a": {"$not": {"$gt": 5}}}, d.clone()));
        assert!(!m(doc! {"a": {"$not": {"$lt": 5}}}, d.clone()));
        assert!(m(doc! {"z": {"$not": {"$gt": 5}}}, d));
        assert!(Filter::parse(&doc! {"$or": []}).is_err());
        assert!(Filter::parse(&doc! {"a": {"$not": 5}}).is_err());
    }

    #[test]
    fn unknown_operators_are_named() {
        assert_eq!(
            Filter::parse(&doc! {"a": {"$regex": "x"}}),
            Err(MatchError::UnknownOperator("$regex".into()))
        );
        assert_eq!(
            Filter::parse(&doc! {"$where": "1"}),
            Err(MatchError::UnknownOperator("$where".into()))
        );
        assert!(Filter::parse(&doc! {"$comment": "ok", "a": 1}).is_ok());
    }

    #[test]
    fn equality_seed_takes_equalities_only() {
        let f =
            Filter::parse(&doc! {"a": 1, "b": {"$gt": 2}, "$and": [{"c.d": "x"}], "e": {"$eq": 3}})
                .expect("parses");
        assert_eq!(f.equality_seed(), doc! {"a": 1, "c": {"d": "x"}, "e": 3});
    }

    #[test]
    fn expr_compares_fields_with_the_given_now() {
        let f = Filter::parse(&doc! {"_id": "s", "$expr": {"$lte": ["$exp", "$$NOW"]}}).unwrap();
        let d = doc! {"_id": "s", "exp": DateTime::from_millis(10)};
        assert!(!f.matches_at(&d, DateTime::from_millis(9)));
        assert!(f.matches_at(&d, DateTime::from_millis(10)));
        assert_eq!(f.equality_seed(), doc! {"_id": "s"}, "$expr seeds nothing");
        assert!(Filter::parse(&doc! {"$expr": {"$function": {}}}).is_err());
    }
}
