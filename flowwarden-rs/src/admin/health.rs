//! Liveness and readiness.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::router::AppState;
use super::streams::state_name;
use crate::status::StreamState;

/// `GET /health/live`: 200 while the process serves requests.
pub(crate) async fn live() -> Json<Value> {
    Json(json!({ "status": "live" }))
}

/// `GET /health/ready`: 200 when every enabled stream is running or a healthy standby; 503
/// naming each one that is not, with its state and, when it halted, the message and runbook.
pub(crate) async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let handle = &state.handle;
    let not_ready: Vec<Value> = handle
        .streams()
        .into_iter()
        .filter(|s| handle.definition(s.name).is_some_and(|d| d.enabled))
        .filter(|s| !matches!(s.state, StreamState::Running | StreamState::Standby))
        .map(|s| {
            let halt = s.halt.as_ref();
            json!({
                "name": s.name,
                "state": state_name(s.state),
                "halt_reason": halt.map(|h| format!("{:?}", h.reason)),
                "message": halt.map(|h| h.message.clone()),
                "runbook": halt.map(|h| h.runbook),
            })
        })
        .collect();
    if not_ready.is_empty() {
        (StatusCode::OK, Json(json!({ "status": "ready" })))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "not_ready",
                "error": format!("{} enabled stream(s) are neither running nor standby", not_ready.len()),
                "streams": not_ready,
            })),
        )
    }
}
