//! Liveness and readiness.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::router::AppState;
use super::streams::state_name;
use crate::engine::lag::STALLED_RUNBOOK;
use crate::status::StreamState;

/// `GET /health/live`: 200 while the process serves requests.
pub(crate) async fn live() -> Json<Value> {
    Json(json!({ "status": "live" }))
}

/// `GET /health/ready`: 200 when every enabled stream is running (and not stalled) or a
/// healthy standby; 503 naming each one that is not, with its state and, when it halted or
/// stalled, the message and runbook.
pub(crate) async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let handle = &state.handle;
    let not_ready: Vec<Value> = handle
        .streams()
        .into_iter()
        .filter(|s| handle.definition(s.name).is_some_and(|d| d.enabled))
        .filter(|s| {
            let stalled = s.lag.as_ref().is_some_and(|l| l.stalled);
            stalled || !matches!(s.state, StreamState::Running | StreamState::Standby)
        })
        .map(|s| {
            let halt = s.halt.as_ref();
            match (halt, s.lag.as_ref().filter(|l| l.stalled)) {
                (None, Some(lag)) => json!({
                    "name": s.name,
                    "state": state_name(s.state),
                    "stalled": true,
                    "halt_reason": null,
                    "message": format!(
                        "stream '{}' is stalled: running, but its position has not moved since {} while its source has newer history (lag {:.0} s)",
                        s.name,
                        lag.behind_since.map(super::streams::date).unwrap_or_else(|| "its start".into()),
                        lag.lag_seconds.unwrap_or_default()
                    ),
                    "runbook": STALLED_RUNBOOK,
                }),
                _ => json!({
                    "name": s.name,
                    "state": state_name(s.state),
                    "stalled": false,
                    "halt_reason": halt.map(|h| format!("{:?}", h.reason)),
                    "message": halt.map(|h| h.message.clone()),
                    "runbook": halt.map(|h| h.runbook),
                }),
            }
        })
        .collect();
    if not_ready.is_empty() {
        (StatusCode::OK, Json(json!({ "status": "ready" })))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "not_ready",
                "error": format!("{} enabled stream(s) are neither running (and progressing) nor standby", not_ready.len()),
                "streams": not_ready,
            })),
        )
    }
}
