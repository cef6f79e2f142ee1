//! MongoDB's cross-type comparison and sort order ("Comparison/Sort Order" in the manual).

use std::cmp::Ordering;

use bson::{Bson, Document};

pub use crate::bson_order::type_bracket;

/// A number as either an exact integer or a double.
enum Num {
    Int(i64),
    Float(f64),
}

fn as_num(value: &Bson) -> Option<Num> {
    match value {
        Bson::Int32(v) => Some(Num::Int(i64::from(*v))),
        Bson::Int64(v) => Some(Num::Int(*v)),
        Bson::Double(v) => Some(Num::Float(*v)),
        Bson::Decimal128(d) => Some(Num::Float(d.to_string().parse().unwrap_or(f64::NAN))),
        _ => None,
    }
}

fn cmp_f64(a: f64, b: f64) -> Ordering {
    // MongoDB sorts NaN below every other number and treats NaN as equal to NaN.
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

fn cmp_int_float(a: i64, b: f64) -> Ordering {
    if b.is_nan() {
        return Ordering::Greater;
    }
    // Exact for every i64 whose magnitude fits a double's mantissa; close enough elsewhere.
    #[allow(clippy::cast_precision_loss)]
    let af = a as f64;
    match af.partial_cmp(&b) {
        Some(Ordering::Equal) => {
            let fract = b.fract();
            if fract == 0.0 && b.abs() < 9.2e18 {
                #[allow(clippy::cast_possible_truncation)]
                a.cmp(&(b as i64))
            } else {
                Ordering::Equal
            }
        }
        Some(o) => o,
        None => Ordering::Equal,
    }
}

fn cmp_numbers(a: &Bson, b: &Bson) -> Ordering {
    match (as_num(a), as_num(b)) {
        (Some(Num::Int(x)), Some(Num::Int(y))) => x.cmp(&y),
        (Some(Num::Float(x)), Some(Num::Float(y))) => cmp_f64(x, y),
        (Some(Num::Int(x)), Some(Num::Float(y))) => cmp_int_float(x, y),
        (Some(Num::Float(x)), Some(Num::Int(y))) => cmp_int_float(y, x).reverse(),
        _ => Ordering::Equal,
    }
}

fn cmp_documents(a: &Document, b: &Document) -> Ordering {
    let mut ia = a.iter();
    let mut ib = b.iter();
    loop {
        match (ia.next(), ib.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((ka, va)), Some((kb, vb))) => {
                let ord = type_bracket(va)
                    .cmp(&type_bracket(vb))
                    .then_with(|| ka.as_bytes().cmp(kb.as_bytes()))
                    .then_with(|| compare_bson(va, vb));
                if ord != Ordering::Equal {
                    return ord;
                }
            }
        }
    }
}

fn cmp_arrays(a: &[Bson], b: &[Bson]) -> Ordering {
    for (x, y) in a.iter().zip(b.iter()) {
        let ord = compare_bson(x, y);
        if ord != Ordering::Equal {
            return ord;
        }
    }
    a.len().cmp(&b.len())
}

/// Compares two BSON values in MongoDB's sort order: first by [`type_bracket`], then by value
/// within the bracket (numbers across int32/int64/double/decimal by numeric value, strings by
/// bytes (no collation), documents field by field, arrays element by element, binary by length,
/// subtype then bytes).
pub fn compare_bson(a: &Bson, b: &Bson) -> Ordering {
    let (ta, tb) = (type_bracket(a), type_bracket(b));
    if ta != tb {
        return ta.cmp(&tb);
    }
    match (a, b) {
        (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => {
            x.as_bytes().cmp(y.as_bytes())
        }
        (Bson::Document(x), Bson::Document(y)) => cmp_documents(x, y),
        (Bson::Array(x), Bson::Array(y)) => cmp_arrays(x, y),
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then_with(|| u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.cmp(y),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::RegularExpression(x), Bson::RegularExpression(y)) => x
            .pattern
            .cmp(&y.pattern)
            .then_with(|| x.options.cmp(&y.options)),
        (Bson::JavaScriptCode(x), Bson::JavaScriptCode(y)) => x.cmp(y),
        _ if ta == 2 => cmp_numbers(a, b),
        _ => Ordering::Equal,
    }
}

/// MongoDB equality: same type bracket and equal value (so `1`, `1i64` and `1.0` are equal,
/// and documents are equal only with the same fields in the same order).
pub fn bson_equal(a: &Bson, b: &Bson) -> bool {
    type_bracket(a) == type_bracket(b) && compare_bson(a, b) == Ordering::Equal
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId, Timestamp};

    #[test]
    fn numbers_compare_across_types() {
        assert_eq!(
            compare_bson(&Bson::Int32(1), &Bson::Double(1.0)),
            Ordering::Equal
        );
        assert_eq!(
            compare_bson(&Bson::Int64(2), &Bson::Double(1.5)),
            Ordering::Greater
        );
        assert_eq!(
            compare_bson(&Bson::Int32(-3), &Bson::Int64(7)),
            Ordering::Less
        );
        assert_eq!(
            compare_bson(&Bson::Double(f64::NAN), &Bson::Int32(i32::MIN)),
            Ordering::Less
        );
        assert!(bson_equal(&Bson::Int64(5), &Bson::Int32(5)));
        assert!(!bson_equal(&Bson::Int64(5), &Bson::Int32(6)));
    }

    #[test]
    fn brackets_follow_the_manual_order() {
        let ordered = [
            Bson::MinKey,
            Bson::Null,
            Bson::Int32(100),
            Bson::String("a".into()),
            Bson::Document(doc! {}),
            Bson::Array(vec![]),
            Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bson::Boolean(false),
            Bson::DateTime(bson::DateTime::from_millis(0)),
            Bson::Timestamp(Timestamp {
                time: 0,
                increment: 0,
            }),
            Bson::MaxKey,
        ];
        for pair in ordered.windows(2) {
            assert_eq!(compare_bson(&pair[0], &pair[1]), Ordering::Less, "{pair:?}");
            assert_eq!(
                compare_bson(&pair[1], &pair[0]),
                Ordering::Greater,
                "{pair:?}"
            );
        }
        assert!(!bson_equal(&Bson::String("1".into()), &Bson::Int32(1)));
    }

    #[test]
    fn documents_and_arrays_compare_in_order() {
        let a = Bson::Document(doc! { "a": 1, "b": 2 });
        let b = Bson::Document(doc! { "b": 2, "a": 1 });
        assert_ne!(compare_bson(&a, &b), Ordering::Equal);
        assert_eq!(
            compare_bson(
                &Bson::Array(vec![1.into(), 2.into()]),
                &Bson::Array(vec![1.into()])
            ),
            Ordering::Greater
        );
        assert_eq!(
            compare_bson(&Bson::String("ab".into()), &Bson::String("b".into())),
            Ordering::Less
        );
        let t1 = Bson::Timestamp(Timestamp {
            time: 5,
            increment: 2,
        });
        let t2 = Bson::Timestamp(Timestamp {
            time: 5,
            increment: 3,
        });
        assert_eq!(compare_bson(&t1, &t2), Ordering::Less);
    }
}
