//! Redis client errors as store errors: what the engine should do with them.

use ::redis::{ErrorKind, RedisError, ServerErrorKind};
use tracing::warn;

use crate::port::{StoreError, StoreErrorKind};

/// A client error as a [`StoreError`]: a dropped or refused connection, a timeout, a server
/// that is loading, read-only (a replica after a failover) or down is `Unavailable` (the engine
/// retries); a key of the wrong type is `Corrupt`; anything else (authentication, permissions,
/// a script error) is `Other`.
pub(crate) fn store_error(what: &str, e: &RedisError) -> StoreError {
    let kind = classify(e);
    if kind == StoreErrorKind::Unavailable {
        warn!(operation = what, error = %e, "Redis unavailable");
    }
    StoreError::new(kind, format!("{what}: {e}"))
}

fn classify(e: &RedisError) -> StoreErrorKind {
    if e.code() == Some("WRONGTYPE") {
        return StoreErrorKind::Corrupt;
    }
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return StoreErrorKind::Unavailable;
    }
    match e.kind() {
        ErrorKind::Io
        | ErrorKind::Parse
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::MasterNameNotFoundBySentinel
        | ErrorKind::NoValidReplicasFoundBySentinel => StoreErrorKind::Unavailable,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => StoreErrorKind::Unavailable,
        _ => StoreErrorKind::Other,
    }
}
