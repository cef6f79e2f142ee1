//! Dead letters: list, get, replay, discard. Events are shown as relaxed extended JSON.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::Json;
use bson::{Bson, Document};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::ApiError;
use super::router::AppState;
use super::streams::{date, path_param};
use crate::port::{DeadLetterQuery, DeadLetterRecord, DeadLetterStatus};
use crate::runtime::DeadLetterError;

/// Records listed when `limit` is not given.
pub(crate) const DEFAULT_LIMIT: usize = 100;
/// The largest `limit` accepted.
pub(crate) const MAX_LIMIT: usize = 10_000;

fn extjson(doc: Document) -> Value {
    Bson::Document(doc).into_relaxed_extjson()
}

/// One record as the API shows it.
#[derive(Serialize)]
pub(crate) struct RecordView {
    id: String,
    stream: String,
    status: &'static str,
    operation_type: String,
    document_key: Option<Value>,
    token: Value,
    error_kind: String,
    error_chain: Vec<String>,
    attempts: u32,
    first_failed_at: String,
    last_failed_at: String,
    truncated: bool,
    owner: Option<String>,
    epoch: Option<i64>,
    event: Value,
}

impl From<DeadLetterRecord> for RecordView {
    fn from(r: DeadLetterRecord) -> Self {
        Self {
            id: r.id,
            stream: r.stream,
            status: r.status.as_str(),
            operation_type: r.operation_type,
            document_key: r.document_key.map(extjson),
            token: extjson(r.token.into_document()),
            error_kind: r.error_kind,
            error_chain: r.error_chain,
            attempts: r.attempts,
            first_failed_at: date(r.first_failed_at),
            last_failed_at: date(r.last_failed_at),
            truncated: r.truncated,
            owner: r.owner,
            epoch: r.epoch,
            event: extjson(r.event),
        }
    }
}

/// The query of `GET /dead-letters`, as given (validated by [`parse_query`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListParams {
    stream: Option<String>,
    status: Option<String>,
    limit: Option<String>,
}

/// Validates the listing query: an empty value means "not given"; `status` is `pending`,
/// `replayed` or `discarded`; `limit` is 1 to [`MAX_LIMIT`] (default [`DEFAULT_LIMIT`]).
pub(crate) fn parse_query(p: ListParams) -> Result<DeadLetterQuery, ApiError> {
    let given = |v: Option<String>| v.filter(|s| !s.is_empty());
    let status = match given(p.status) {
        None => None,
        Some(s) => Some(DeadLetterStatus::parse(&s).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "status '{s}' is not one of pending, replayed, discarded"
            ))
        })?),
    };
    let limit = match given(p.limit) {
        None => DEFAULT_LIMIT,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(ApiError::BadRequest(format!(
                    "limit '{l}' is not a whole number from 1 to {MAX_LIMIT}"
                )))
            }
        },
    };
    Ok(DeadLetterQuery {
        stream: given(p.stream),
        status,
        limit: Some(limit),
    })
}

/// `GET /dead-letters?stream=&status=&limit=`: records, oldest first.
pub(crate) async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Vec<RecordView>>, ApiError> {
    let Query(params) =
        query.map_err(|e| ApiError::BadRequest(format!("malformed query: {}", e.body_text())))?;
    let query = parse_query(params)?;
    let records = state.handle.dead_letters().list(&query).await?;
    Ok(Json(records.into_iter().map(RecordView::from).collect()))
}

/// `GET /dead-letters/{id}`.
pub(crate) async fn get_one(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<RecordView>, ApiError> {
    let id = path_param(id)?;
    let record = state
        .handle
        .dead_letters()
        .get(&id)
        .await?
        .ok_or(DeadLetterError::NotFound(id))?;
    Ok(Json(record.into()))
}

/// `POST /dead-letters/{id}/replay`: runs the event through its stream's filter and handler
/// once; 200 and `replayed` on success, 409 `replay_failed` (the record stays pending) if the
/// handler fails again.
pub(crate) async fn replay(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = path_param(id)?;
    state.handle.dead_letters().replay(&id).await?;
    Ok(Json(
        json!({ "id": id, "status": DeadLetterStatus::Replayed.as_str() }),
    ))
}

/// `POST /dead-letters/{id}/discard`: marks the record discarded (kept for audit).
pub(crate) async fn discard(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = path_param(id)?;
    state.handle.dead_letters().discard(&id).await?;
    Ok(Json(
        json!({ "id": id, "status": DeadLetterStatus::Discarded.as_str() }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(stream: &str, status: &str, limit: &str) -> ListParams {
        let s = |v: &str| Some(v.to_owned());
        ListParams {
            stream: s(stream),
            status: s(status),
            limit: s(limit),
        }
    }

    #[test]
    fn queries() {
        let q = parse_query(params("", "", "")).unwrap();
        assert_eq!(
            q,
            DeadLetterQuery {
                stream: None,
                status: None,
                limit: Some(DEFAULT_LIMIT)
            }
        );
        let q = parse_query(params("orders", "pending", "5")).unwrap();
        assert_eq!(q.stream.as_deref(), Some("orders"));
        assert_eq!(q.status, Some(DeadLetterStatus::Pending));
        assert_eq!(q.limit, Some(5));
        for bad in [
            params("", "bogus", ""),
            params("", "", "abc"),
            params("", "", "0"),
            params("", "", "-1"),
            params("", "", "10001"),
        ] {
            assert!(matches!(parse_query(bad), Err(ApiError::BadRequest(_))));
        }
    }
}
