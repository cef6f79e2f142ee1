//! Classifies driver errors into the engine's [`SourceErrorKind`].
//!
//! The driver's own rule decides what is resumable (network errors, 43 CursorNotFound, the
//! `ResumableChangeStreamError` label, and the legacy code list for servers that do not label);
//! on top of it, server-selection timeouts and authentication hiccups are transient (the engine
//! retries them with backoff, from its settled position) — never "history lost". Lost history,
//! unusable tokens, fatal stream errors, oversized events and configuration mistakes each get
//! their own kind, because the engine reacts differently to each.

use flowwarden::port::{SourceError, SourceErrorKind};
use mongodb::error::{Error, ErrorKind, WriteFailure};

/// The driver's label for errors after which a change stream can be resumed.
pub(crate) const RESUMABLE_LABEL: &str = "ResumableChangeStreamError";
/// The server's label for change-stream errors that cannot be resumed.
pub(crate) const NON_RESUMABLE_LABEL: &str = "NonResumableChangeStreamError";

/// Codes the driver treats as resumable when the server does not label them (servers before
/// 4.4): host unreachable, host not found, network timeout, shutdown, step-down, not primary,
/// interrupted at shutdown, node recovering, socket exception, stale shard/config versions,
/// retry change stream, failed to satisfy read preference, cursor not found, and the rest of
/// the change-stream specification's list.
pub(crate) const LEGACY_RESUMABLE_CODES: &[i32] = &[
    6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436, 63, 150, 13388, 234, 133, 43,
];

/// Transient codes outside the driver's list: authentication hiccups (18 AuthenticationFailed
/// answered to a command, 391 ReauthenticationRequired), 50 MaxTimeMSExpired, 11601
/// Interrupted.
pub(crate) const TRANSIENT_CODES: &[i32] = &[18, 391, 50, 11601];

/// Codes that mean the requested position is older than the retained history.
pub(crate) const HISTORY_LOST_CODES: &[i32] = &[286, 136];

/// Codes that mean the stream definition (pipeline, options) is not acceptable to the server:
/// unrecognized pipeline stage, `$changeStream` on a standalone, a stage that must be last,
/// bad values and parse errors in the pipeline, unauthorized.
pub(crate) const CONFIGURATION_CODES: &[i32] =
    &[2, 9, 13, 14, 40324, 40573, 40602, 40415, 15983, 17276];

/// Server-side wording of lost history on servers that do not send code 286.
const HISTORY_LOST_MESSAGE: &str = "resume point may no longer be in the oplog";

/// The broad class of a driver error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// A network error (I/O, pool cleared).
    Network,
    /// No server could be selected in time (election, partition).
    ServerSelection,
    /// Authentication failed during a handshake.
    Authentication,
    /// The server answered with an error.
    Server,
    /// DNS resolution failed.
    Dns,
    /// The driver refused the arguments.
    InvalidArgument,
    /// The server is too old or lacks a feature.
    IncompatibleServer,
    /// A change event had no `_id` (the pipeline removed it).
    MissingResumeToken,
    /// The client was shut down.
    Shutdown,
    /// A reply could not be decoded (the driver itself treats this as resumable).
    Other,
}

/// What the classifier looks at, extracted from a driver error (or constructed in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFacts {
    /// The class.
    pub class: ErrorClass,
    /// The server's code, when there is one.
    pub code: Option<i32>,
    /// The error labels (also those of the source error).
    pub labels: Vec<String>,
    /// The message.
    pub message: String,
}

impl ErrorFacts {
    /// The facts of a driver error.
    pub fn of(e: &Error) -> ErrorFacts {
        let (class, code, message) = match e.kind.as_ref() {
            ErrorKind::Command(c) => (ErrorClass::Server, Some(c.code), c.to_string()),
            ErrorKind::Write(WriteFailure::WriteError(w)) => {
                (ErrorClass::Server, Some(w.code), w.message.clone())
            }
            ErrorKind::Write(WriteFailure::WriteConcernError(w)) => {
                (ErrorClass::Server, Some(w.code), w.message.clone())
            }
            ErrorKind::Io(io) => (ErrorClass::Network, None, io.to_string()),
            ErrorKind::ConnectionPoolCleared { message, .. } => {
                (ErrorClass::Network, None, message.clone())
            }
            ErrorKind::ServerSelection { message, .. } => {
                (ErrorClass::ServerSelection, None, message.clone())
            }
            ErrorKind::Authentication { message, .. } => {
                (ErrorClass::Authentication, None, message.clone())
            }
            ErrorKind::DnsResolve { message, .. } => (ErrorClass::Dns, None, message.clone()),
            ErrorKind::InvalidArgument { message, .. } => {
                (ErrorClass::InvalidArgument, None, message.clone())
            }
            ErrorKind::InvalidTlsConfig { message, .. } => {
                (ErrorClass::InvalidArgument, None, message.clone())
            }
            ErrorKind::IncompatibleServer { message, .. } => {
                (ErrorClass::IncompatibleServer, None, message.clone())
            }
            ErrorKind::MissingResumeToken => {
                (ErrorClass::MissingResumeToken, None, e.kind.to_string())
            }
            ErrorKind::Shutdown => (ErrorClass::Shutdown, None, e.kind.to_string()),
            other => (ErrorClass::Other, None, other.to_string()),
        };
        let mut labels: Vec<String> = e.labels().iter().cloned().collect();
        for l in [RESUMABLE_LABEL, NON_RESUMABLE_LABEL] {
            if e.contains_label(l) && !labels.iter().any(|x| x == l) {
                labels.push(l.to_owned());
            }
        }
        labels.sort();
        ErrorFacts {
            class,
            code,
            labels,
            message,
        }
    }

    fn has_label(&self, l: &str) -> bool {
        self.labels.iter().any(|x| x == l)
    }
}

/// The kind of a set of facts. Order matters: lost history first (286 is also labelled
/// non-resumable), then unusable tokens, oversized events, fatal errors, configuration, and
/// the resumable rule.
pub fn classify_facts(f: &ErrorFacts) -> SourceErrorKind {
    use SourceErrorKind as K;
    if f.code.is_some_and(|c| HISTORY_LOST_CODES.contains(&c))
        || f.message.contains(HISTORY_LOST_MESSAGE)
    {
        return K::HistoryLost;
    }
    match f.code {
        Some(260) => return K::InvalidToken,
        Some(10334) => return K::TooLarge,
        Some(280) => return K::Fatal,
        _ => {}
    }
    match f.class {
        ErrorClass::Network
        | ErrorClass::ServerSelection
        | ErrorClass::Authentication
        | ErrorClass::Dns
        | ErrorClass::Other => return K::Resumable,
        ErrorClass::InvalidArgument
        | ErrorClass::IncompatibleServer
        | ErrorClass::MissingResumeToken => return K::Configuration,
        ErrorClass::Shutdown => return K::Fatal,
        ErrorClass::Server => {}
    }
    if f.has_label(NON_RESUMABLE_LABEL) {
        return K::Fatal;
    }
    if f.has_label(RESUMABLE_LABEL)
        || f.code
            .is_some_and(|c| LEGACY_RESUMABLE_CODES.contains(&c) || TRANSIENT_CODES.contains(&c))
    {
        return K::Resumable;
    }
    if let Some(code) = f.code {
        if (code == 9 || code == 2) && f.message.to_ascii_lowercase().contains("token") {
            // A resume token the server cannot parse: let the cascade try the other one.
            return K::InvalidToken;
        }
        if CONFIGURATION_CODES.contains(&code) {
            return K::Configuration;
        }
    }
    if f.message.contains("Unrecognized pipeline stage") || f.message.contains("is not allowed in")
    {
        return K::Configuration;
    }
    K::Fatal
}

/// Classifies a driver error into the engine's error, keeping the server's code and message.
pub fn classify(e: &Error) -> SourceError {
    let facts = ErrorFacts::of(e);
    let kind = classify_facts(&facts);
    let mut message = facts.message.clone();
    if !facts.labels.is_empty() {
        message.push_str(&format!(" [labels: {}]", facts.labels.join(", ")));
    }
    let err = SourceError::new(kind, message);
    match facts.code {
        Some(c) => err.with_code(c),
        None => err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SourceErrorKind as K;

    fn server(code: i32, labels: &[&str], message: &str) -> ErrorFacts {
        ErrorFacts {
            class: ErrorClass::Server,
            code: Some(code),
            labels: labels.iter().map(|s| s.to_string()).collect(),
            message: message.into(),
        }
    }

    fn class(class: ErrorClass) -> ErrorFacts {
        ErrorFacts {
            class,
            code: None,
            labels: vec![],
            message: "x".into(),
        }
    }

    #[test]
    fn history_lost() {
        assert_eq!(
            classify_facts(&server(286, &[NON_RESUMABLE_LABEL], "")),
            K::HistoryLost
        );
        assert_eq!(
            classify_facts(&server(136, &[], "CappedPositionLost")),
            K::HistoryLost
        );
        assert_eq!(
            classify_facts(&server(
                1,
                &[],
                "Resume of change stream was not possible, as the resume point may no longer be in the oplog."
            )),
            K::HistoryLost
        );
    }

    #[test]
    fn tokens_too_large_fatal() {
        assert_eq!(classify_facts(&server(260, &[], "")), K::InvalidToken);
        assert_eq!(
            classify_facts(&server(9, &[], "cannot parse resume token")),
            K::InvalidToken
        );
        assert_eq!(classify_facts(&server(10334, &[], "")), K::TooLarge);
        assert_eq!(
            classify_facts(&server(280, &[NON_RESUMABLE_LABEL], "")),
            K::Fatal
        );
        assert_eq!(
            classify_facts(&server(4321, &[NON_RESUMABLE_LABEL], "")),
            K::Fatal
        );
        assert_eq!(
            classify_facts(&server(4321, &[], "")),
            K::Fatal,
            "unknown server errors"
        );
        assert_eq!(classify_facts(&class(ErrorClass::Shutdown)), K::Fatal);
    }

    #[test]
    fn resumable_by_label_code_and_class() {
        assert_eq!(
            classify_facts(&server(4321, &[RESUMABLE_LABEL], "")),
            K::Resumable
        );
        for code in LEGACY_RESUMABLE_CODES.iter().chain(TRANSIENT_CODES) {
            assert_eq!(
                classify_facts(&server(*code, &[], "")),
                K::Resumable,
                "code {code}"
            );
        }
        for c in [
            ErrorClass::Network,
            ErrorClass::ServerSelection,
            ErrorClass::Authentication,
            ErrorClass::Dns,
            ErrorClass::Other,
        ] {
            assert_eq!(classify_facts(&class(c)), K::Resumable, "{c:?}");
        }
    }

    #[test]
    fn configuration() {
        assert_eq!(
            classify_facts(&server(
                40324,
                &[],
                "Unrecognized pipeline stage name: '$lookup'"
            )),
            K::Configuration
        );
        assert_eq!(classify_facts(&server(40573, &[], "")), K::Configuration);
        assert_eq!(
            classify_facts(&class(ErrorClass::InvalidArgument)),
            K::Configuration
        );
        assert_eq!(
            classify_facts(&class(ErrorClass::MissingResumeToken)),
            K::Configuration
        );
    }

    #[test]
    fn real_driver_errors() {
        let io: Error = ErrorKind::Io(std::sync::Arc::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        )))
        .into();
        assert_eq!(classify(&io).kind, K::Resumable);
        let cmd: mongodb::error::CommandError = bson::from_document(
            bson::doc! {"code": 286, "codeName": "ChangeStreamHistoryLost", "errmsg": "gone"},
        )
        .expect("command error");
        let e: Error = ErrorKind::Command(cmd).into();
        let se = classify(&e);
        assert_eq!(se.kind, K::HistoryLost);
        assert_eq!(se.code, Some(286));
        let e: Error = ErrorKind::MissingResumeToken.into();
        assert_eq!(classify(&e).kind, K::Configuration);
    }
}
