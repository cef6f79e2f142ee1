//! Which subject an event is published to: `<prefix>.<stream>.<operation>` by default.

/// The default subject prefix: events go to `flowwarden.<stream>.<operation>`.
pub const DEFAULT_SUBJECT_PREFIX: &str = "flowwarden";

/// `<prefix>.<stream>.<operation>`, with the stream's name and the operation made into
/// single subject tokens ([`subject_token`]).
pub(super) fn default_subject(prefix: &str, stream: &str, operation: &str) -> String {
    format!(
        "{prefix}.{}.{}",
        subject_token(stream),
        subject_token(operation)
    )
}

/// `s` as one NATS subject token: `.`, `*`, `>` and whitespace (which would split the token,
/// or make it a wildcard) become `_`; an empty string becomes `_`.
///
/// A stream named `orders.v2` therefore publishes to `flowwarden.orders_v2.insert`.
pub fn subject_token(s: &str) -> String {
    if s.is_empty() {
        return "_".to_owned();
    }
    s.chars()
        .map(|c| match c {
            '.' | '*' | '>' => '_',
            c if c.is_whitespace() => '_',
            c => c,
        })
        .collect()
}

/// Why `subject` cannot be published to, if it cannot: empty, empty tokens (`a..b`, a leading
/// or trailing `.`), wildcards, whitespace.
pub(super) fn invalid_subject(subject: &str) -> Option<&'static str> {
    if subject.is_empty() {
        return Some("it is empty");
    }
    if subject.chars().any(char::is_whitespace) {
        return Some("it contains whitespace");
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Some("it has an empty token");
        }
        if token == "*" || token == ">" {
            return Some("wildcards cannot be published to");
        }
    }
    None
}

/// Whether `prefix` can start subjects: a valid subject itself.
pub(super) fn invalid_prefix(prefix: &str) -> Option<&'static str> {
    invalid_subject(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_subject_is_prefix_stream_operation() {
        assert_eq!(
            default_subject("flowwarden", "order-stream", "insert"),
            "flowwarden.order-stream.insert"
        );
        assert_eq!(
            default_subject("shop.events", "orders.v2", "dropDatabase"),
            "shop.events.orders_v2.dropDatabase"
        );
    }

    #[test]
    fn tokens_never_split_or_match_wildcards() {
        assert_eq!(subject_token("a.b*c>d e"), "a_b_c_d_e");
        assert_eq!(subject_token(""), "_");
    }

    #[test]
    fn invalid_subjects_are_named() {
        assert!(invalid_subject("flowwarden.orders.insert").is_none());
        assert!(invalid_subject("").is_some());
        assert!(invalid_subject("a..b").is_some());
        assert!(invalid_subject(".a").is_some());
        assert!(invalid_subject("a.>").is_some());
        assert!(invalid_subject("a.*.b").is_some());
        assert!(invalid_subject("a b").is_some());
    }
}
