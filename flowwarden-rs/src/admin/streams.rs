//! Streams: status, counters, halt and definition; stop, start and restart.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;

use super::error::ApiError;
use super::router::AppState;
use crate::definition::{Deployment, StreamDefinition};
use crate::port::{Checkpoint, StoredPosition};
use crate::runtime::{ControlError, RuntimeHandle};
use crate::status::{LagStatus, StreamCounters, StreamState, StreamStatus};

/// The JSON spelling of a state.
pub(crate) fn state_name(state: StreamState) -> &'static str {
    match state {
        StreamState::Starting => "starting",
        StreamState::Running => "running",
        StreamState::Resuming => "resuming",
        StreamState::Standby => "standby",
        StreamState::Stopped => "stopped",
        StreamState::HistoryLost => "history_lost",
    }
}

/// A date as RFC 3339 (milliseconds since the epoch if it is out of that format's range).
pub(crate) fn date(d: bson::DateTime) -> String {
    d.try_to_rfc3339_string()
        .unwrap_or_else(|_| d.timestamp_millis().to_string())
}

#[derive(Serialize)]
struct HaltView {
    reason: String,
    message: String,
    runbook: &'static str,
}

#[derive(Serialize)]
struct CountersView {
    received: u64,
    handled: u64,
    filtered: u64,
    unrouted: u64,
    retried: u64,
    dead_lettered: u64,
    skipped: u64,
    redelivered: u64,
    restarts: u64,
    history_lost: u64,
    checkpoints_saved: u64,
    checkpoint_failures: u64,
    transactions_committed: u64,
    transactions_retried: u64,
}

impl From<StreamCounters> for CountersView {
    fn from(c: StreamCounters) -> Self {
        Self {
            received: c.received,
            handled: c.handled,
            filtered: c.filtered,
            unrouted: c.unrouted,
            retried: c.retried,
            dead_lettered: c.dead_lettered,
            skipped: c.skipped,
            redelivered: c.redelivered,
            restarts: c.restarts,
            history_lost: c.history_lost,
            checkpoints_saved: c.checkpoints_saved,
            checkpoint_failures: c.checkpoint_failures,
            transactions_committed: c.transactions_committed,
            transactions_retried: c.transactions_retried,
        }
    }
}

/// Lag against the source's retained history (docs/operations.md, "Lag and the oplog window").
#[derive(Serialize)]
struct LagView {
    known: bool,
    unknown_reason: Option<String>,
    position_time: Option<String>,
    oldest_time: Option<String>,
    newest_time: Option<String>,
    lag_seconds: Option<f64>,
    window_seconds: Option<f64>,
    headroom_seconds: Option<f64>,
    caught_up: bool,
    stalled: bool,
    behind_since: Option<String>,
    sampled_at: String,
}

impl From<LagStatus> for LagView {
    fn from(l: LagStatus) -> Self {
        Self {
            known: l.known,
            unknown_reason: l.unknown_reason,
            position_time: l.position_time.map(date),
            oldest_time: l.oldest_time.map(date),
            newest_time: l.newest_time.map(date),
            lag_seconds: l.lag_seconds,
            window_seconds: l.window_seconds,
            headroom_seconds: l.headroom_seconds,
            caught_up: l.caught_up,
            stalled: l.stalled,
            behind_since: l.behind_since.map(date),
            sampled_at: date(l.sampled_at),
        }
    }
}

/// One stored position: the token as relaxed extended JSON, its times.
#[derive(Serialize)]
struct PositionView {
    token: serde_json::Value,
    cluster_time: Option<String>,
    wall_time: Option<String>,
    start_after: bool,
}

impl From<&StoredPosition> for PositionView {
    fn from(p: &StoredPosition) -> Self {
        Self {
            token: bson::Bson::Document(p.token.as_document().clone()).into_relaxed_extjson(),
            cluster_time: p
                .cluster_time
                .map(|ts| format!("{}.{}", ts.time, ts.increment)),
            wall_time: p.wall_time.map(date),
            start_after: p.start_after,
        }
    }
}

/// The last checkpoint this process stored.
#[derive(Serialize)]
struct CheckpointView {
    last_seen: Option<PositionView>,
    last_processed: Option<PositionView>,
    saved_at: String,
}

impl From<&Checkpoint> for CheckpointView {
    fn from(c: &Checkpoint) -> Self {
        Self {
            last_seen: c.last_seen.as_ref().map(PositionView::from),
            last_processed: c.last_processed.as_ref().map(PositionView::from),
            saved_at: date(c.updated_at),
        }
    }
}

#[derive(Serialize)]
struct DeploymentView {
    mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    renew_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    standby_poll_secs: Option<u64>,
}

impl From<Deployment> for DeploymentView {
    fn from(d: Deployment) -> Self {
        match d {
            Deployment::AllInstances => Self {
                mode: "all_instances",
                lease_secs: None,
                renew_secs: None,
                standby_poll_secs: None,
            },
            Deployment::SingleLeader(l) => Self {
                mode: "single_leader",
                lease_secs: Some(l.lease_secs),
                renew_secs: Some(l.renew_secs),
                standby_poll_secs: Some(l.standby_poll_secs),
            },
        }
    }
}

/// One stream as the API shows it.
#[derive(Serialize)]
pub(crate) struct StreamView {
    name: &'static str,
    state: &'static str,
    last_event_at: Option<String>,
    halt: Option<HaltView>,
    counters: CountersView,
    /// `null` until the first lag sample.
    lag: Option<LagView>,
    /// `null` until this process stored a checkpoint of the stream.
    checkpoint: Option<CheckpointView>,
    /// `null`: the backend's default database.
    database: Option<&'static str>,
    collection: Option<&'static str>,
    enabled: Option<bool>,
    auto_start: Option<bool>,
    deployment: Option<DeploymentView>,
}

impl StreamView {
    fn new(status: StreamStatus, def: Option<&'static StreamDefinition>) -> Self {
        Self {
            name: status.name,
            state: state_name(status.state),
            last_event_at: status.last_event_at.map(date),
            halt: status.halt.map(|h| HaltView {
                reason: format!("{:?}", h.reason),
                message: h.message,
                runbook: h.runbook,
            }),
            counters: status.counters.into(),
            lag: status.lag.map(LagView::from),
            checkpoint: status.checkpoint.as_ref().map(CheckpointView::from),
            database: def.and_then(|d| d.database),
            collection: def.map(|d| d.collection),
            enabled: def.map(|d| d.enabled),
            auto_start: def.map(|d| d.auto_start),
            deployment: def.map(|d| d.deployment.into()),
        }
    }
}

fn view(handle: &RuntimeHandle, name: &str) -> Result<StreamView, ApiError> {
    let status = handle
        .status(name)
        .ok_or_else(|| ControlError::UnknownStream(name.into()))?;
    Ok(StreamView::new(status, handle.definition(name)))
}

/// The `{name}` of a path, or a 400 saying why it is not one.
pub(crate) fn path_param(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(p)| p)
        .map_err(|e| ApiError::BadRequest(format!("malformed path: {}", e.body_text())))
}

/// `GET /streams`: every stream, by name.
pub(crate) async fn list(State(state): State<AppState>) -> Json<Vec<StreamView>> {
    let handle = &state.handle;
    Json(
        handle
            .streams()
            .into_iter()
            .map(|s| {
                let def = handle.definition(s.name);
                StreamView::new(s, def)
            })
            .collect(),
    )
}

/// `GET /streams/{name}`.
pub(crate) async fn get_one(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<StreamView>, ApiError> {
    Ok(Json(view(&state.handle, &path_param(name)?)?))
}

/// `POST /streams/{name}/stop`: stops gracefully and answers once it has stopped.
pub(crate) async fn stop(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<StreamView>, ApiError> {
    let name = path_param(name)?;
    state.handle.stop(&name).await?;
    Ok(Json(view(&state.handle, &name)?))
}

/// `POST /streams/{name}/start`: starts a stopped stream; answers at once (state `starting`).
pub(crate) async fn start(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<StreamView>, ApiError> {
    let name = path_param(name)?;
    state.handle.start(&name)?;
    Ok(Json(view(&state.handle, &name)?))
}

/// `POST /streams/{name}/restart`: stops gracefully, then starts.
pub(crate) async fn restart(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<StreamView>, ApiError> {
    let name = path_param(name)?;
    state.handle.restart(&name).await?;
    Ok(Json(view(&state.handle, &name)?))
}
