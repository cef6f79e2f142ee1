//! Every spelling the macros recognise: attribute names, keys, and the hints given for
//! spellings that FlowWarden (Java) or earlier drafts used.

/// `#[change_stream(..)]`.
pub(crate) const CHANGE_STREAM: &str = "change_stream";
/// `#[checkpoint(..)]`.
pub(crate) const CHECKPOINT: &str = "checkpoint";
/// `#[retry(..)]`.
pub(crate) const RETRY: &str = "retry";
/// `#[restart(..)]`.
pub(crate) const RESTART: &str = "restart";

/// First path segment of a companion that moved itself below `#[change_stream]` (it was
/// written above and expanded first): read, never re-emitted.
pub(crate) const MOVED: &str = "__flowwarden_moved";
/// The argument of a companion `#[change_stream]` has already read: it expands to the item
/// unchanged. Re-emitting the companion this way keeps the user's import of it in use.
pub(crate) const CONSUMED: &str = "__flowwarden_consumed";

/// The impl-level companions of `#[change_stream]`.
pub(crate) const COMPANIONS: &[&str] = &[CHECKPOINT, RETRY, RESTART];

/// Method attributes.
pub(crate) const ON_INSERT: &str = "on_insert";
pub(crate) const ON_UPDATE: &str = "on_update";
pub(crate) const ON_DELETE: &str = "on_delete";
pub(crate) const ON_REPLACE: &str = "on_replace";
pub(crate) const ON_CHANGE: &str = "on_change";
pub(crate) const PIPELINE: &str = "pipeline";
pub(crate) const FILTER: &str = "filter";
pub(crate) const ON_ERROR: &str = "on_error";
pub(crate) const KEY: &str = "key";

// Keys of #[change_stream].
pub(crate) const NAME: &str = "name";
pub(crate) const COLLECTION: &str = "collection";
pub(crate) const DATABASE: &str = "database";
pub(crate) const DOCUMENT: &str = "document";
pub(crate) const FULL_DOCUMENT: &str = "full_document";
pub(crate) const FULL_DOCUMENT_BEFORE_CHANGE: &str = "full_document_before_change";
pub(crate) const ENABLED: &str = "enabled";
pub(crate) const AUTO_START: &str = "auto_start";
pub(crate) const CRATE: &str = "crate";
pub(crate) const DEPLOYMENT: &str = "deployment";
pub(crate) const LEASE_SECS: &str = "lease_secs";
pub(crate) const RENEW_SECS: &str = "renew_secs";
pub(crate) const STANDBY_POLL_SECS: &str = "standby_poll_secs";
pub(crate) const CONCURRENCY: &str = "concurrency";
pub(crate) const MAX_IN_FLIGHT: &str = "max_in_flight";
pub(crate) const TRANSACTIONAL: &str = "transactional";

pub(crate) const CHANGE_STREAM_KEYS: &[&str] = &[
    NAME,
    COLLECTION,
    DATABASE,
    DOCUMENT,
    FULL_DOCUMENT,
    FULL_DOCUMENT_BEFORE_CHANGE,
    ENABLED,
    AUTO_START,
    DEPLOYMENT,
    LEASE_SECS,
    RENEW_SECS,
    STANDBY_POLL_SECS,
    CONCURRENCY,
    MAX_IN_FLIGHT,
    TRANSACTIONAL,
    CRATE,
];

// Keys of #[checkpoint].
pub(crate) const SAVE_EVERY_N: &str = "save_every_n";
pub(crate) const SAVE_INTERVAL_SECS: &str = "save_interval_secs";
pub(crate) const START_POSITION: &str = "start_position";
pub(crate) const ON_HISTORY_LOST: &str = "on_history_lost";
pub(crate) const RESUME_STRATEGY: &str = "resume_strategy";

pub(crate) const CHECKPOINT_KEYS: &[&str] = &[
    SAVE_EVERY_N,
    SAVE_INTERVAL_SECS,
    START_POSITION,
    ON_HISTORY_LOST,
    RESUME_STRATEGY,
];

// Keys of #[retry] and #[restart].
pub(crate) const MAX_ATTEMPTS: &str = "max_attempts";
pub(crate) const INITIAL_DELAY_MS: &str = "initial_delay_ms";
pub(crate) const MULTIPLIER: &str = "multiplier";
pub(crate) const MAX_DELAY_MS: &str = "max_delay_ms";
pub(crate) const JITTER: &str = "jitter";

pub(crate) const RETRY_KEYS: &[&str] = &[
    MAX_ATTEMPTS,
    INITIAL_DELAY_MS,
    MULTIPLIER,
    MAX_DELAY_MS,
    JITTER,
];

pub(crate) const RESTART_KEYS: &[&str] = &[MAX_ATTEMPTS, INITIAL_DELAY_MS, MAX_DELAY_MS];

/// Keys that were renamed: `(old spelling, new key, explanation)`. Old spellings are compared
/// after [`normalize`], so `backoffMs`, `backoff_ms` and `BACKOFF_MS` all match.
const RENAMED: &[(&str, &str, &str)] = &[
    (
        "backoffms",
        INITIAL_DELAY_MS,
        "the first delay is `initial_delay_ms`; it grows by `multiplier` up to `max_delay_ms`",
    ),
    (
        "delayms",
        INITIAL_DELAY_MS,
        "the first delay is `initial_delay_ms`; it grows by `multiplier` up to `max_delay_ms`",
    ),
    (
        "backoffmultiplier",
        MULTIPLIER,
        "the growth factor between attempts is `multiplier`",
    ),
    (
        "maxbackoffms",
        MAX_DELAY_MS,
        "the upper bound of one delay is `max_delay_ms`",
    ),
    (
        "maxretries",
        MAX_ATTEMPTS,
        "`max_attempts` counts every attempt, the first one included (max_retries + 1)",
    ),
    (
        "saveinterval",
        SAVE_INTERVAL_SECS,
        "the heartbeat interval is `save_interval_secs`, in seconds",
    ),
    (
        "saveintervalms",
        SAVE_INTERVAL_SECS,
        "the heartbeat interval is `save_interval_secs`, in seconds",
    ),
    (
        "batchsize",
        SAVE_EVERY_N,
        "checkpoints are written every `save_every_n` handled events",
    ),
    ("value", NAME, "the stream's name is `name = \"...\"`"),
    ("enable", ENABLED, "the switch is spelled `enabled`"),
    (
        "autostartup",
        AUTO_START,
        "the switch is spelled `auto_start`",
    ),
    ("db", DATABASE, "the database key is spelled `database`"),
    (
        "documenttype",
        DOCUMENT,
        "the document type is `document = MyType`",
    ),
];

/// Lowercases and drops `_` and `-`, so that spellings differing only in case style compare
/// equal (`saveEveryN` ~ `save_every_n`).
pub(crate) fn normalize(s: &str) -> String {
    s.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Which attribute owns `key`, if any.
fn owner_of(key: &str) -> Option<&'static str> {
    [
        (CHANGE_STREAM, CHANGE_STREAM_KEYS),
        (CHECKPOINT, CHECKPOINT_KEYS),
        (RETRY, RETRY_KEYS),
        (RESTART, RESTART_KEYS),
    ]
    .into_iter()
    .find(|(_, keys)| keys.contains(&key))
    .map(|(attr, _)| attr)
}

/// A hint for an unknown `key` of `#[attr(..)]` whose valid keys are `valid`: a migration hint
/// for a renamed or differently cased key, or the attribute a misplaced key belongs to.
pub(crate) fn unknown_key_hint(attr: &str, key: &str, valid: &[&str]) -> Option<String> {
    let norm = normalize(key);
    if let Some(same) = valid.iter().find(|v| normalize(v) == norm) {
        return Some(format!(
            "keys are spelled in snake_case: write `{same}` instead of `{key}`"
        ));
    }
    if let Some((_, new, why)) = RENAMED.iter().find(|(old, _, _)| *old == norm) {
        if valid.contains(new) {
            return Some(format!("`{key}` was renamed to `{new}`: {why}"));
        }
        if let Some(owner) = owner_of(new) {
            return Some(format!(
                "`{key}` was renamed to `{new}`, which belongs in #[{owner}(..)]: {why}"
            ));
        }
    }
    let elsewhere = [
        CHANGE_STREAM_KEYS,
        CHECKPOINT_KEYS,
        RETRY_KEYS,
        RESTART_KEYS,
    ]
    .iter()
    .flat_map(|keys| keys.iter())
    .find(|k| normalize(k) == norm)
    .copied();
    if let Some(known) = elsewhere {
        if let Some(owner) = owner_of(known) {
            if owner != attr {
                return Some(format!("`{known}` belongs in #[{owner}(..)], not here"));
            }
        }
    }
    None
}

/// `a`, `b`, `c` as a backquoted, comma separated list.
pub(crate) fn list(items: &[&str]) -> String {
    items
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_case_gets_snake_case_hint() {
        let hint = unknown_key_hint(CHECKPOINT, "saveEveryN", CHECKPOINT_KEYS).unwrap();
        assert!(hint.contains("`save_every_n`"), "{hint}");
    }

    #[test]
    fn renamed_key_gets_migration_hint() {
        let hint = unknown_key_hint(RETRY, "backoff_ms", RETRY_KEYS).unwrap();
        assert!(hint.contains("renamed to `initial_delay_ms`"), "{hint}");
    }

    #[test]
    fn misplaced_key_names_its_attribute() {
        let hint = unknown_key_hint(RETRY, "save_every_n", RETRY_KEYS).unwrap();
        assert!(hint.contains("#[checkpoint(..)]"), "{hint}");
        let hint = unknown_key_hint(RESTART, "multiplier", RESTART_KEYS).unwrap();
        assert!(hint.contains("#[retry(..)]"), "{hint}");
    }

    #[test]
    fn unrelated_key_has_no_hint() {
        assert_eq!(unknown_key_hint(RETRY, "colour", RETRY_KEYS), None);
    }
}
