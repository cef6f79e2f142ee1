//! MongoDB query-document matching, projection and update operators, written once and shared
//! by the in-memory backend and the wire-level emulator.
//!
//! The semantics follow the MongoDB manual pages "Query and Projection Operators",
//! "Comparison/Sort Order" and "Update Operators", for the subset listed on each item. Anything
//! outside that subset is refused at parse time with a [`MatchError`] naming the operator, never
//! silently ignored.

mod compare;
pub mod expression;
mod filter;
pub mod pipeline;
mod projection;
pub mod update;

pub use compare::{bson_equal, compare_bson, type_bracket};
pub use filter::Filter;
pub use projection::Projection;

use bson::{Bson, Document};

/// Why a filter, projection, update or pipeline was refused or could not be applied.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MatchError {
    /// A query operator (such as `$regex` or `$where`) that the matcher does not implement.
    #[error("unknown or unsupported query operator '{0}'")]
    UnknownOperator(String),
    /// An update operator (such as `$push`) that the matcher does not implement.
    #[error("unknown or unsupported update operator '{0}'")]
    UnknownUpdateOperator(String),
    /// An aggregation stage that is not allowed (or not implemented) after `$changeStream`.
    #[error("stage '{0}' is not supported in a change stream pipeline here")]
    UnknownStage(String),
    /// An aggregation expression operator that is not implemented.
    #[error("unsupported expression operator '{0}'")]
    UnknownExpression(String),
    /// An operator received an argument of the wrong shape (for example `$in` without an array).
    #[error("bad argument to '{op}': {message}")]
    BadValue {
        /// The operator or stage whose argument was wrong.
        op: String,
        /// What was wrong with it.
        message: String,
    },
    /// An update tried to change a field that cannot change (the `_id`).
    #[error("performing an update on the path '{0}' would modify the immutable field '_id'")]
    ImmutableField(String),
    /// Two update operators touch the same path (or one is a prefix of the other).
    #[error("updating the path '{0}' would create a conflict at '{1}'")]
    ConflictingUpdate(String, String),
    /// An update mixes operators (`$set`) with plain replacement fields.
    #[error("an update document must contain only update operators or only fields, found '{0}'")]
    MixedUpdate(String),
    /// An update path goes through a value that is neither a document nor an array.
    #[error("cannot create field '{field}' in element {{{parent}}}")]
    PathNotViable {
        /// The path component that could not be created.
        field: String,
        /// The path of the scalar value in the way.
        parent: String,
    },
    /// An arithmetic update operator met a value of the wrong type.
    #[error("cannot apply '{op}' to a value of non-numeric type at '{path}'")]
    TypeMismatch {
        /// The update operator.
        op: String,
        /// The field path.
        path: String,
    },
    /// A projection mixes inclusion and exclusion.
    #[error("cannot do {0} on field '{1}' in {2} projection")]
    MixedProjection(&'static str, String, &'static str),
}

impl MatchError {
    /// The MongoDB server error code that the server uses for the same refusal.
    pub fn code(&self) -> i32 {
        match self {
            MatchError::UnknownOperator(_) | MatchError::BadValue { .. } => 2,
            MatchError::UnknownUpdateOperator(_) => 9,
            MatchError::UnknownStage(_) => 40324,
            MatchError::UnknownExpression(_) => 168,
            MatchError::ImmutableField(_) => 66,
            MatchError::ConflictingUpdate(..) => 40,
            MatchError::MixedUpdate(_) => 9,
            MatchError::PathNotViable { .. } => 28,
            MatchError::TypeMismatch { .. } => 14,
            MatchError::MixedProjection(..) => 31254,
        }
    }

    /// The MongoDB `codeName` matching [`MatchError::code`].
    pub fn code_name(&self) -> &'static str {
        match self.code() {
            2 => "BadValue",
            9 => "FailedToParse",
            14 => "TypeMismatch",
            28 => "PathNotViable",
            40 => "ConflictingUpdateOperators",
            66 => "ImmutableField",
            168 => "InvalidPipelineOperator",
            40324 => "Location40324",
            _ => "Location31254",
        }
    }
}

/// Reads the value at a dotted `path` (`"a.b.0.c"`): through sub-documents, and through arrays
/// when the component is a decimal index. Returns `None` when any component is missing.
///
/// This is the plain lookup used by `sort`, `documentKey` and `$field` references; query
/// matching additionally expands arrays of sub-documents (see [`Filter`]).
pub fn get_path<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let first = parts.next()?;
    let mut current = doc.get(first)?;
    for part in parts {
        current = match current {
            Bson::Document(d) => d.get(part)?,
            Bson::Array(items) => items.get(array_index(part)?)?,
            _ => return None,
        };
    }
    Some(current)
}

/// Parses a path component as an array index (`"0"`, `"12"`), as MongoDB does.
pub(crate) fn array_index(part: &str) -> Option<usize> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    part.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn get_path_reads_documents_and_array_indexes() {
        let d = doc! { "a": { "b": [ { "c": 1 }, { "c": 2 } ] }, "x": 5 };
        assert_eq!(get_path(&d, "x"), Some(&Bson::Int32(5)));
        assert_eq!(get_path(&d, "a.b.1.c"), Some(&Bson::Int32(2)));
        assert_eq!(get_path(&d, "a.b.c"), None);
        assert_eq!(get_path(&d, "a.z"), None);
        assert_eq!(get_path(&d, "x.y"), None);
    }

    #[test]
    fn error_codes_match_the_server() {
        assert_eq!(MatchError::UnknownOperator("$where".into()).code(), 2);
        assert_eq!(
            MatchError::ImmutableField("_id".into()).code_name(),
            "ImmutableField"
        );
    }
}
