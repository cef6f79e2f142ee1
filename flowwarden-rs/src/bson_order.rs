//! MongoDB's order of BSON types ("Comparison/Sort Order" in the manual) and the type aliases
//! of `$type`: what the matcher compares with, and what backends need to continue a scan in
//! `_id` order across types ([`crate::port::ids_after`]). Always compiled: a backend without
//! the matcher uses it too.

use bson::Bson;

/// The rank of a value's type in MongoDB's sort order. Values of different brackets never
/// compare equal; query comparisons (`$lt`, `$gt`, ...) only apply within one bracket.
///
/// Order: MinKey < Null (and undefined) < numbers < strings/symbols < documents < arrays <
/// binary < ObjectId < booleans < dates < timestamps < regular expressions < code < MaxKey.
#[cfg_attr(not(feature = "matcher"), allow(unreachable_pub))] // public through `matcher`
pub fn type_bracket(value: &Bson) -> u8 {
    match value {
        Bson::MinKey => 0,
        Bson::Null | Bson::Undefined => 1,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 2,
        Bson::String(_) | Bson::Symbol(_) => 3,
        Bson::Document(_) => 4,
        Bson::Array(_) => 5,
        Bson::Binary(_) => 6,
        Bson::ObjectId(_) => 7,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        Bson::Timestamp(_) => 10,
        Bson::RegularExpression(_) => 11,
        Bson::DbPointer(_) => 12,
        Bson::JavaScriptCode(_) | Bson::JavaScriptCodeWithScope(_) => 13,
        Bson::MaxKey => 14,
    }
}

/// Every `$type` alias with its numeric code and its sort bracket (`number` has no code: it
/// stands for the four numeric types).
const ALIASES: [(&str, Option<i64>, u8); 22] = [
    ("double", Some(1), 2),
    ("string", Some(2), 3),
    ("object", Some(3), 4),
    ("array", Some(4), 5),
    ("binData", Some(5), 6),
    ("undefined", Some(6), 1),
    ("objectId", Some(7), 7),
    ("bool", Some(8), 8),
    ("date", Some(9), 9),
    ("null", Some(10), 1),
    ("regex", Some(11), 11),
    ("dbPointer", Some(12), 12),
    ("javascript", Some(13), 13),
    ("symbol", Some(14), 3),
    ("javascriptWithScope", Some(15), 13),
    ("int", Some(16), 2),
    ("timestamp", Some(17), 10),
    ("long", Some(18), 2),
    ("decimal", Some(19), 2),
    ("minKey", Some(-1), 0),
    ("maxKey", Some(127), 14),
    ("number", None, 2),
];

/// The `$type` alias of a numeric type code (`2` is `string`), `None` for unknown codes.
#[cfg_attr(not(feature = "matcher"), allow(dead_code))]
pub(crate) fn type_alias_of_code(code: i64) -> Option<&'static str> {
    ALIASES
        .iter()
        .find(|(_, c, _)| *c == Some(code))
        .map(|(a, _, _)| *a)
}

/// The known `$type` alias spelled `alias`, `None` when there is none.
#[cfg_attr(not(feature = "matcher"), allow(dead_code))]
pub(crate) fn type_alias(alias: &str) -> Option<&'static str> {
    ALIASES
        .iter()
        .find(|(a, _, _)| *a == alias)
        .map(|(a, _, _)| *a)
}

/// Whether `value` is of the type a `$type` alias names (the value itself, not its elements).
#[cfg_attr(not(feature = "matcher"), allow(dead_code))]
pub(crate) fn is_of_type(alias: &str, value: &Bson) -> bool {
    matches!(
        (alias, value),
        ("double", Bson::Double(_))
            | ("string", Bson::String(_))
            | ("object", Bson::Document(_))
            | ("array", Bson::Array(_))
            | ("binData", Bson::Binary(_))
            | ("undefined", Bson::Undefined)
            | ("objectId", Bson::ObjectId(_))
            | ("bool", Bson::Boolean(_))
            | ("date", Bson::DateTime(_))
            | ("null", Bson::Null)
            | ("regex", Bson::RegularExpression(_))
            | ("dbPointer", Bson::DbPointer(_))
            | ("javascript", Bson::JavaScriptCode(_))
            | ("symbol", Bson::Symbol(_))
            | ("javascriptWithScope", Bson::JavaScriptCodeWithScope(_))
            | ("int", Bson::Int32(_))
            | ("timestamp", Bson::Timestamp(_))
            | ("long", Bson::Int64(_))
            | ("decimal", Bson::Decimal128(_))
            | ("minKey", Bson::MinKey)
            | ("maxKey", Bson::MaxKey)
            | (
                "number",
                Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
            )
    )
}

/// The `$type` aliases of every type that sorts after `bracket` (one alias per type, `number`
/// left out since its four types are listed).
pub(crate) fn aliases_after(bracket: u8) -> Vec<&'static str> {
    ALIASES
        .iter()
        .filter(|(_, code, b)| *b > bracket && code.is_some())
        .map(|(a, _, _)| *a)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alias_names_a_type_of_its_bracket() {
        let samples = [
            Bson::Double(1.5),
            Bson::String("a".into()),
            Bson::Document(bson::doc! {}),
            Bson::Array(vec![]),
            Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: vec![1],
            }),
            Bson::Undefined,
            Bson::ObjectId(bson::oid::ObjectId::new()),
            Bson::Boolean(true),
            Bson::DateTime(bson::DateTime::from_millis(0)),
            Bson::Null,
            Bson::RegularExpression(bson::Regex {
                pattern: "a".into(),
                options: String::new(),
            }),
            Bson::JavaScriptCode("x".into()),
            Bson::Symbol("s".into()),
            Bson::Int32(1),
            Bson::Timestamp(bson::Timestamp {
                time: 1,
                increment: 1,
            }),
            Bson::Int64(1),
            Bson::MinKey,
            Bson::MaxKey,
        ];
        for (alias, _, bracket) in ALIASES {
            for v in &samples {
                if is_of_type(alias, v) {
                    assert_eq!(type_bracket(v), bracket, "{alias} on {v:?}");
                }
            }
        }
        assert!(is_of_type("number", &Bson::Int64(3)));
        assert!(!is_of_type("int", &Bson::Int64(3)));
        assert_eq!(type_alias_of_code(2), Some("string"));
        assert_eq!(type_alias_of_code(99), None);
    }

    #[test]
    fn aliases_after_a_bracket_are_exactly_the_later_types() {
        let after_numbers = aliases_after(2);
        assert!(after_numbers.contains(&"string"));
        assert!(after_numbers.contains(&"objectId"));
        assert!(after_numbers.contains(&"maxKey"));
        assert!(!after_numbers.contains(&"int"));
        assert!(!after_numbers.contains(&"null"));
        assert!(aliases_after(14).is_empty());
        assert_eq!(aliases_after(0).len(), 20);
    }
}
