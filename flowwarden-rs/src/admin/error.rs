//! What the admin API fails with: [`AdminError`] when it cannot be served, and `ApiError`, the
//! JSON error answer of one request (`{"error": "...", "code": "..."}`, never a panic).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tracing::warn;

use crate::runtime::{ControlError, DeadLetterError};

/// The admin API could not be served; [`crate::Builder::start`] reports it as a startup problem
/// and starts nothing.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The configured address is not one.
    #[error("admin API: {source_name} = '{value}' is not an address ({reason}); give a port (9090), ':port', 'ip:port' or 'host:port'")]
    InvalidAddress {
        /// Where the value came from (`FLOWWARDEN_ADMIN_ADDR`).
        source_name: &'static str,
        /// The value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The address could not be bound.
    #[error("admin API: cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

/// The error answer of one admin request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// The request's path or query is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// No route has this path.
    #[error("no route {method} {path}; the routes are listed at GET /openapi.json")]
    NoRoute { method: String, path: String },
    /// The route exists with another method.
    #[error("method {method} is not allowed on {path}; see GET /openapi.json")]
    MethodNotAllowed { method: String, path: String },
    /// No bearer token, or the wrong one.
    #[error("this endpoint requires 'Authorization: Bearer <token>' with the admin token")]
    Unauthorized,
    /// Mutating endpoints are off: no token is configured.
    #[error("mutating admin endpoints are disabled: no admin token is configured; set FLOWWARDEN_ADMIN_TOKEN (or Builder::admin_token) and send 'Authorization: Bearer <token>'")]
    TokenNotConfigured,
    /// A stream control request failed.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// A dead-letter operation failed.
    #[error(transparent)]
    DeadLetter(#[from] DeadLetterError),
    /// `/metrics` cannot render: the process installed another global recorder first.
    #[error("another global metrics recorder is installed in this process, so flowwarden cannot expose /metrics; expose metrics through that recorder, or do not install one before Builder::start")]
    MetricsUnavailable,
}

impl ApiError {
    /// The HTTP status and the machine-readable code.
    pub(crate) fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::NoRoute { .. } => (StatusCode::NOT_FOUND, "no_route"),
            Self::MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::TokenNotConfigured => (StatusCode::FORBIDDEN, "token_not_configured"),
            Self::Control(ControlError::UnknownStream(_)) => {
                (StatusCode::NOT_FOUND, "unknown_stream")
            }
            Self::Control(ControlError::Disabled(_)) => (StatusCode::CONFLICT, "stream_disabled"),
            Self::Control(ControlError::ShuttingDown) => {
                (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
            }
            Self::DeadLetter(e) => match e {
                DeadLetterError::NoStore => (StatusCode::NOT_IMPLEMENTED, "no_dead_letter_store"),
                DeadLetterError::NotFound(_) => (StatusCode::NOT_FOUND, "unknown_dead_letter"),
                DeadLetterError::UnknownStream { .. } => {
                    (StatusCode::CONFLICT, "stream_not_in_this_runtime")
                }
                DeadLetterError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
                DeadLetterError::ReplayFailed { .. } => (StatusCode::CONFLICT, "replay_failed"),
            },
            Self::MetricsUnavailable => (StatusCode::NOT_IMPLEMENTED, "recorder_not_installed"),
        }
    }

    /// The JSON body: `error` (a sentence saying what to do), `code`, and what identifies the
    /// subject.
    pub(crate) fn body(&self) -> Value {
        let (_, code) = self.status_and_code();
        let mut body = json!({ "error": self.to_string(), "code": code });
        let extra = match self {
            Self::Control(ControlError::UnknownStream(name) | ControlError::Disabled(name)) => {
                Some(("stream", name.clone()))
            }
            Self::DeadLetter(
                DeadLetterError::NotFound(id)
                | DeadLetterError::UnknownStream { id, .. }
                | DeadLetterError::ReplayFailed { id, .. },
            ) => Some(("id", id.clone())),
            _ => None,
        };
        if let (Some((key, value)), Some(map)) = (extra, body.as_object_mut()) {
            map.insert(key.into(), Value::String(value));
        }
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if status.is_server_error() {
            warn!(code, error = %self, "admin request failed");
        }
        let mut response = (status, Json(self.body())).into_response();
        if matches!(self, Self::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_name_the_subject_and_the_code() {
        let e = ApiError::Control(ControlError::UnknownStream("orders".into()));
        assert_eq!(e.status_and_code().0, StatusCode::NOT_FOUND);
        let body = e.body();
        assert_eq!(body["code"], "unknown_stream");
        assert_eq!(body["stream"], "orders");
        assert!(body["error"].as_str().is_some_and(|m| m.contains("orders")));
    }

    #[test]
    fn a_foreign_recorder_is_501() {
        let e = ApiError::MetricsUnavailable;
        assert_eq!(e.status_and_code().0, StatusCode::NOT_IMPLEMENTED);
        assert!(e.body()["error"]
            .as_str()
            .is_some_and(|m| m.contains("another global metrics recorder")));
    }
}
