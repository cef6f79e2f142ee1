//! What a command fails with, and the exit code each failure maps to.
//!
//! The codes are part of the tool's interface (scripts test them); `docs/operations.md` lists
//! them. 2 is also what `clap` exits with on a usage error.

use flowwarden::port::{StoreError, StoreErrorKind};

/// The runbook of a checkpoint that does not parse.
pub const CORRUPT_CHECKPOINT_RUNBOOK: &str = "docs/runbooks/corrupt-checkpoint.md";

/// The exit codes of the `flowwarden` tool.
pub mod exit {
    /// Done.
    pub const OK: i32 = 0;
    /// A MongoDB or other unexpected error (for example missing privileges).
    pub const FAILURE: i32 = 1;
    /// A usage error: unknown option, missing or malformed argument (also `clap`'s code).
    pub const USAGE: i32 = 2;
    /// The connection settings are unusable: malformed connection string, bad database name,
    /// no connection string given.
    pub const BAD_CONFIG: i32 = 3;
    /// The server cannot be reached (server selection timed out) or refused the login.
    pub const UNREACHABLE: i32 = 4;
    /// No such stream, dead letter or lease.
    pub const NOT_FOUND: i32 = 5;
    /// A stored document (checkpoint, lease, dead letter) does not parse.
    pub const CORRUPT: i32 = 6;
    /// Refused: the stream looks running (a live lease, a recent checkpoint save), the lease is
    /// held, or the document changed under the command. `--force` overrides where offered.
    pub const REFUSED_RUNNING: i32 = 7;
    /// Refused: `dlq replay` needs the running service's admin API (`--admin`).
    pub const NEEDS_SERVICE: i32 = 8;
    /// The admin API answered with an error or could not be reached.
    pub const ADMIN_API: i32 = 9;
    /// The requested position is not in the retained history (older than the oplog).
    pub const HISTORY_LOST: i32 = 10;
}

/// A failed command. Every message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A malformed argument value (time, token, URL).
    #[error("{0}")]
    Usage(String),
    /// The connection settings are unusable.
    #[error("{0}")]
    BadConfig(String),
    /// The server cannot be reached or refused the login.
    #[error("{0}")]
    Unreachable(String),
    /// No such stream, dead letter or lease.
    #[error("{0}")]
    NotFound(String),
    /// A stored checkpoint does not parse.
    #[error("{message}; see {CORRUPT_CHECKPOINT_RUNBOOK}, then `flowwarden checkpoint reset {stream} --to-now|--to-time|--to-token` writes a sound one")]
    CorruptCheckpoint {
        /// The checkpoint's name (`_id`).
        stream: String,
        /// What does not parse.
        message: String,
    },
    /// Another stored document (lease, dead letter) does not parse.
    #[error("{0}")]
    Corrupt(String),
    /// Refused because the stream looks running, or the document moved under the command.
    #[error("{0}")]
    Refused(String),
    /// `dlq replay` without `--admin`.
    #[error("{0}")]
    NeedsService(String),
    /// The admin API failed.
    #[error("{0}")]
    Admin(String),
    /// The requested position is older than the retained history.
    #[error("{0}")]
    HistoryLost(String),
    /// Anything else (a driver error, missing privileges).
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    /// The process exit code of this error (see [`exit`]).
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Usage(_) => exit::USAGE,
            Self::BadConfig(_) => exit::BAD_CONFIG,
            Self::Unreachable(_) => exit::UNREACHABLE,
            Self::NotFound(_) => exit::NOT_FOUND,
            Self::CorruptCheckpoint { .. } | Self::Corrupt(_) => exit::CORRUPT,
            Self::Refused(_) => exit::REFUSED_RUNNING,
            Self::NeedsService(_) => exit::NEEDS_SERVICE,
            Self::Admin(_) => exit::ADMIN_API,
            Self::HistoryLost(_) => exit::HISTORY_LOST,
            Self::Failed(_) => exit::FAILURE,
        }
    }

    /// A short machine-readable name of the error, for `--json` output.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Usage(_) => "usage",
            Self::BadConfig(_) => "bad_config",
            Self::Unreachable(_) => "unreachable",
            Self::NotFound(_) => "not_found",
            Self::CorruptCheckpoint { .. } => "corrupt_checkpoint",
            Self::Corrupt(_) => "corrupt",
            Self::Refused(_) => "refused_running",
            Self::NeedsService(_) => "needs_service",
            Self::Admin(_) => "admin_api",
            Self::HistoryLost(_) => "history_lost",
            Self::Failed(_) => "failed",
        }
    }

    /// A driver error met while doing `what`: unreachable (server selection, network, login)
    /// or a plain failure.
    pub(crate) fn driver(what: &str, e: &mongodb::error::Error) -> CliError {
        use mongodb::error::ErrorKind;
        let detail = crate::short_error(e);
        match e.kind.as_ref() {
            ErrorKind::ServerSelection { .. } | ErrorKind::Io(_) => CliError::Unreachable(format!(
                "cannot reach MongoDB while {what}: {detail}; check --uri / FLOWWARDEN_MONGODB_URI, the network, and --timeout"
            )),
            ErrorKind::Authentication { .. } => CliError::Unreachable(format!(
                "MongoDB refused the login while {what}: {detail}; check the credentials in the connection string"
            )),
            _ if crate::stores::code_of(e) == Some(13) => CliError::Failed(format!(
                "not authorized while {what}: {detail}; the tool needs read and write on the _fw_checkpoints, _fw_dlq and _fw_locks collections (docs/operations.md, Command-line tool)"
            )),
            _ => CliError::Failed(format!("MongoDB error while {what}: {detail}")),
        }
    }

    /// A store error of the reused stores, classified.
    pub(crate) fn store(e: StoreError) -> CliError {
        match e.kind {
            StoreErrorKind::Corrupt => CliError::Corrupt(e.message),
            StoreErrorKind::Unavailable if looks_unreachable(&e.message) => {
                CliError::Unreachable(format!(
                    "{}; check --uri / FLOWWARDEN_MONGODB_URI, the network, and --timeout",
                    e.message
                ))
            }
            _ => CliError::Failed(e.message),
        }
    }
}

fn looks_unreachable(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("server selection") || m.contains("connection refused") || m.contains("timed out")
}

/// Exit codes and their meaning, in the order of [`exit`], for help texts and docs.
pub const EXIT_CODES: &[(i32, &str)] = &[
    (exit::OK, "done"),
    (
        exit::FAILURE,
        "MongoDB or other error (for example missing privileges)",
    ),
    (
        exit::USAGE,
        "usage error: unknown option, malformed argument",
    ),
    (
        exit::BAD_CONFIG,
        "unusable connection settings (bad URI, bad database name, no URI)",
    ),
    (
        exit::UNREACHABLE,
        "server unreachable (server selection timed out) or login refused",
    ),
    (exit::NOT_FOUND, "unknown stream, dead-letter id or lease"),
    (
        exit::CORRUPT,
        "a stored checkpoint, lease or dead letter does not parse",
    ),
    (
        exit::REFUSED_RUNNING,
        "refused: the stream looks running or the lease is held (see --force)",
    ),
    (
        exit::NEEDS_SERVICE,
        "refused: dlq replay needs the service's admin API (--admin)",
    ),
    (
        exit::ADMIN_API,
        "the admin API answered an error or cannot be reached",
    ),
    (
        exit::HISTORY_LOST,
        "the requested position is older than the retained history",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_listed() {
        let mut seen: Vec<i32> = EXIT_CODES.iter().map(|(c, _)| *c).collect();
        seen.dedup();
        assert_eq!(seen.len(), EXIT_CODES.len());
        let e = CliError::CorruptCheckpoint {
            stream: "orders".into(),
            message: "checkpoint of stream 'orders' is corrupt".into(),
        };
        assert_eq!(e.exit_code(), exit::CORRUPT);
        let m = e.to_string();
        assert!(
            m.contains(CORRUPT_CHECKPOINT_RUNBOOK) && m.contains("reset orders"),
            "{m}"
        );
    }
}
