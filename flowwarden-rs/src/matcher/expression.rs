//! Aggregation expressions ("Aggregation Operators" in the MongoDB manual), for the subset that
//! `$expr` in a query, pipeline-style updates and the `$project` / `$addFields` stages of a
//! change-stream pipeline use here.

use std::cmp::Ordering;

use bson::{Bson, DateTime, Document};

use super::compare::compare_bson;
use super::{get_path, MatchError};

/// A parsed aggregation expression.
///
/// Supported: literals, `{$literal: v}`, field paths (`"$a.b"`), the variables `$$NOW` and
/// `$$ROOT`, documents and arrays of expressions, and the operators `$add`, `$ifNull`, `$cond`,
/// `$eq`, `$ne`, `$lt`, `$lte`, `$gt`, `$gte`, `$and`, `$or` and `$not`. Every other operator or
/// variable is refused by [`Expression::parse`] with [`MatchError::UnknownExpression`].
///
/// Deviation from the server, kept on purpose: a missing field compares as `null` (the server
/// orders "missing" just below `null`).
#[derive(Debug, Clone, PartialEq)]
pub struct Expression(Node);

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Literal(Bson),
    Path(String),
    Now,
    Root,
    Object(Vec<(String, Node)>),
    Array(Vec<Node>),
    Op(Op, Vec<Node>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Add,
    IfNull,
    Cond,
    Cmp(Cmp),
    And,
    Or,
    Not,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Lte,
    Gt,
    Gte,
}

impl Expression {
    /// Parses an expression; unknown operators and variables are refused, naming them.
    pub fn parse(value: &Bson) -> Result<Expression, MatchError> {
        parse(value).map(Expression)
    }

    /// The expression `"$path"`: the value of a field.
    pub fn field(path: &str) -> Expression {
        Expression(Node::Path(path.to_owned()))
    }

    /// Evaluates the expression on `root`, with `now` as `$$NOW`. `None` means "missing" (a
    /// field that is not there); callers that set fields skip it, as the server does.
    pub fn eval(&self, root: &Document, now: DateTime) -> Option<Bson> {
        eval(&self.0, root, now)
    }

    /// Whether the expression is true on `root` by the aggregation rules (`false`, `null`,
    /// missing, undefined and numeric zero are false; everything else is true).
    pub fn is_true(&self, root: &Document, now: DateTime) -> bool {
        truthy(self.eval(root, now).as_ref())
    }
}

fn bad(op: &str, message: &str) -> MatchError {
    MatchError::BadValue {
        op: op.to_owned(),
        message: message.to_owned(),
    }
}

fn parse(value: &Bson) -> Result<Node, MatchError> {
    Ok(match value {
        Bson::String(s) if s == "$$NOW" => Node::Now,
        Bson::String(s) if s == "$$ROOT" || s == "$$CURRENT" => Node::Root,
        Bson::String(s) if s.starts_with("$$") => {
            return Err(MatchError::UnknownExpression(s.clone()))
        }
        Bson::String(s) if s.starts_with('$') => {
            let path = &s[1..];
            if path.is_empty() || path.split('.').any(str::is_empty) {
                return Err(bad(s, "invalid field path"));
            }
            Node::Path(path.to_owned())
        }
        Bson::Document(d) => match d.keys().next() {
            Some(k) if k.starts_with('$') => {
                if d.len() != 1 {
                    return Err(bad(
                        k,
                        "an expression object must have exactly one operator",
                    ));
                }
                let arg = d.get(k).unwrap_or(&Bson::Null);
                parse_operator(k, arg)?
            }
            _ => Node::Object(
                d.iter()
                    .map(|(k, v)| Ok((k.clone(), parse(v)?)))
                    .collect::<Result<_, MatchError>>()?,
            ),
        },
        Bson::Array(items) => Node::Array(items.iter().map(parse).collect::<Result<_, _>>()?),
        other => Node::Literal(other.clone()),
    })
}

fn parse_operator(name: &str, arg: &Bson) -> Result<Node, MatchError> {
    if name == "$literal" {
        return Ok(Node::Literal(arg.clone()));
    }
    let op = match name {
        "$add" => Op::Add,
        "$ifNull" => Op::IfNull,
        "$cond" => Op::Cond,
        "$eq" => Op::Cmp(Cmp::Eq),
        "$ne" => Op::Cmp(Cmp::Ne),
        "$lt" => Op::Cmp(Cmp::Lt),
        "$lte" => Op::Cmp(Cmp::Lte),
        "$gt" => Op::Cmp(Cmp::Gt),
        "$gte" => Op::Cmp(Cmp::Gte),
        "$and" => Op::And,
        "$or" => Op::Or,
        "$not" => Op::Not,
        other => return Err(MatchError::UnknownExpression(other.to_owned())),
    };
    let args: Vec<Node> = match (op, arg) {
        (Op::Cond, Bson::Document(d)) => {
            let part = |k: &str| {
                d.get(k)
                    .ok_or_else(|| bad("$cond", &format!("missing '{k}'")))
                    .and_then(parse)
            };
            vec![part("if")?, part("then")?, part("else")?]
        }
        (_, Bson::Array(items)) => items.iter().map(parse).collect::<Result<_, _>>()?,
        (_, single) => vec![parse(single)?],
    };
    let arity_ok = match op {
        Op::Cmp(_) => args.len() == 2,
        Op::Cond => args.len() == 3,
        Op::Not => args.len() == 1,
        Op::IfNull => args.len() >= 2,
        Op::Add | Op::And | Op::Or => true,
    };
    if !arity_ok {
        return Err(bad(name, "wrong number of arguments"));
    }
    Ok(Node::Op(op, args))
}

fn eval(node: &Node, root: &Document, now: DateTime) -> Option<Bson> {
    match node {
        Node::Literal(v) => Some(v.clone()),
        Node::Path(p) => get_path(root, p).cloned(),
        Node::Now => Some(Bson::DateTime(now)),
        Node::Root => Some(Bson::Document(root.clone())),
        Node::Object(fields) => {
            let mut out = Document::new();
            for (k, e) in fields {
                if let Some(v) = eval(e, root, now) {
                    out.insert(k.clone(), v);
                }
            }
            Some(Bson::Document(out))
        }
        Node::Array(items) => Some(Bson::Array(
            items
                .iter()
                .map(|e| eval(e, root, now).unwrap_or(Bson::Null))
                .collect(),
        )),
        Node::Op(op, args) => {
            let arg = |i: usize| eval(&args[i], root, now);
            match op {
                Op::Add => Some(add(args.iter().map(|a| eval(a, root, now)))),
                Op::IfNull => {
                    let (last, rest) = args.split_last()?;
                    rest.iter()
                        .filter_map(|a| eval(a, root, now))
                        .find(|v| !matches!(v, Bson::Null | Bson::Undefined))
                        .or_else(|| eval(last, root, now))
                }
                Op::Cond => {
                    if truthy(arg(0).as_ref()) {
                        arg(1)
                    } else {
                        arg(2)
                    }
                }
                Op::Cmp(c) => {
                    let a = arg(0).unwrap_or(Bson::Null);
                    let b = arg(1).unwrap_or(Bson::Null);
                    let ord = compare_bson(&a, &b);
                    Some(Bson::Boolean(match c {
                        Cmp::Eq => ord == Ordering::Equal,
                        Cmp::Ne => ord != Ordering::Equal,
                        Cmp::Lt => ord == Ordering::Less,
                        Cmp::Lte => ord != Ordering::Greater,
                        Cmp::Gt => ord == Ordering::Greater,
                        Cmp::Gte => ord != Ordering::Less,
                    }))
                }
                Op::And => Some(Bson::Boolean(
                    args.iter().all(|a| truthy(eval(a, root, now).as_ref())),
                )),
                Op::Or => Some(Bson::Boolean(
                    args.iter().any(|a| truthy(eval(a, root, now).as_ref())),
                )),
                Op::Not => Some(Bson::Boolean(!truthy(arg(0).as_ref()))),
            }
        }
    }
}

/// `$add`: numbers, plus at most one date (milliseconds are added to it). Any null or missing
/// operand gives `null`; a non-number gives `null` too (the server refuses it with an error).
fn add(values: impl Iterator<Item = Option<Bson>>) -> Bson {
    let mut date: Option<i64> = None;
    let mut int: i64 = 0;
    let mut float: Option<f64> = None;
    let mut wide = false;
    for v in values {
        match v {
            Some(Bson::Int32(n)) => int = int.saturating_add(i64::from(n)),
            Some(Bson::Int64(n)) => {
                int = int.saturating_add(n);
                wide = true;
            }
            Some(Bson::Double(f)) => float = Some(float.unwrap_or(0.0) + f),
            Some(Bson::DateTime(d)) if date.is_none() => date = Some(d.timestamp_millis()),
            _ => return Bson::Null,
        }
    }
    match (date, float) {
        // Truncation to whole milliseconds is what the server does with a double.
        (Some(ms), f) => Bson::DateTime(DateTime::from_millis(
            ms.saturating_add(int)
                .saturating_add(f.unwrap_or(0.0) as i64),
        )),
        (None, Some(f)) => Bson::Double(f + int as f64),
        (None, None) => match i32::try_from(int) {
            Ok(n) if !wide => Bson::Int32(n),
            _ => Bson::Int64(int),
        },
    }
}

fn truthy(v: Option<&Bson>) -> bool {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) | Some(Bson::Boolean(false)) => false,
        Some(Bson::Int32(n)) => *n != 0,
        Some(Bson::Int64(n)) => *n != 0,
        Some(Bson::Double(f)) => *f != 0.0,
        Some(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn ev(e: Bson, root: &Document, now: i64) -> Option<Bson> {
        Expression::parse(&e)
            .unwrap()
            .eval(root, DateTime::from_millis(now))
    }

    #[test]
    fn dates_plus_milliseconds_and_now() {
        let root = doc! { "n": 2, "at": DateTime::from_millis(1_000) };
        assert_eq!(
            ev(Bson::Document(doc! {"$add": ["$$NOW", 30_000]}), &root, 5),
            Some(Bson::DateTime(DateTime::from_millis(30_005)))
        );
        assert_eq!(
            ev(Bson::Document(doc! {"$add": ["$at", "$n", 1]}), &root, 0),
            Some(Bson::DateTime(DateTime::from_millis(1_003)))
        );
        assert_eq!(
            ev(Bson::Document(doc! {"$add": ["$n", 1]}), &root, 0),
            Some(Bson::Int32(3))
        );
        assert_eq!(
            ev(Bson::Document(doc! {"$add": ["$n", 1_i64]}), &root, 0),
            Some(Bson::Int64(3))
        );
        assert_eq!(
            ev(Bson::Document(doc! {"$add": ["$missing", 1]}), &root, 0),
            Some(Bson::Null)
        );
    }

    #[test]
    fn if_null_comparisons_and_logic() {
        let root = doc! { "epoch": 4, "owner": "a", "exp": DateTime::from_millis(100) };
        let e = |b: Document, now| ev(Bson::Document(b), &root, now);
        assert_eq!(
            e(doc! {"$add": [{"$ifNull": ["$nope", 0]}, 1]}, 0),
            Some(Bson::Int32(1))
        );
        assert_eq!(
            e(doc! {"$add": [{"$ifNull": ["$epoch", 0]}, 1]}, 0),
            Some(Bson::Int32(5))
        );
        let expired = doc! {"$or": [{"$lte": ["$exp", "$$NOW"]}, {"$eq": ["$owner", "b"]}]};
        assert_eq!(e(expired.clone(), 99), Some(Bson::Boolean(false)));
        assert_eq!(e(expired, 100), Some(Bson::Boolean(true)));
        assert_eq!(
            e(
                doc! {"$cond": {"if": {"$gt": ["$epoch", 3]}, "then": "big", "else": "small"}},
                0
            ),
            Some(Bson::String("big".into()))
        );
        assert_eq!(
            e(doc! {"$not": [{"$and": [true, "$epoch"]}]}, 0),
            Some(Bson::Boolean(false))
        );
    }

    #[test]
    fn refuses_unknown_operators_and_variables() {
        for bad in [
            Bson::Document(doc! {"$function": {}}),
            Bson::String("$$CLUSTER_TIME".into()),
            Bson::Document(doc! {"$eq": [1]}),
        ] {
            assert!(Expression::parse(&bad).is_err(), "{bad}");
        }
    }
}
