//! `flowwarden dlq list|show|discard|replay`.
//!
//! Listing, showing and discarding go through the crate's dead-letter store on `_fw_dlq` (the
//! same reads and the same status change as the service's own discard). Replaying needs the
//! stream's handler, which only the running service has: it goes through the service's admin
//! API (`POST /dead-letters/{id}/replay`), and without `--admin` it is refused.

use flowwarden::port::{DeadLetterQuery, DeadLetterStatus, DeadLetterStore};

use super::admin_http::{self, AdminUrl};
use super::connect::Conn;
use super::error::CliError;
use super::output::{Kind, Report};

/// `flowwarden dlq list`.
pub(crate) async fn list(
    conn: &Conn,
    stream: Option<String>,
    status: Option<DeadLetterStatus>,
    limit: u32,
) -> Result<Report, CliError> {
    let query = DeadLetterQuery {
        stream,
        status,
        limit: Some(usize::try_from(limit).unwrap_or(usize::MAX)),
    };
    let records = conn.backend.list(&query).await.map_err(CliError::store)?;
    Ok(Kind::DeadLetters(records).into())
}

fn unknown(conn: &Conn, id: &str) -> CliError {
    CliError::NotFound(format!(
        "no dead letter with id '{id}' in {}.{}; `flowwarden dlq list` shows the ids",
        conn.database(),
        crate::DEAD_LETTERS
    ))
}

/// `flowwarden dlq show ID`.
pub(crate) async fn show(conn: &Conn, id: &str) -> Result<Report, CliError> {
    let record = conn
        .backend
        .get(id)
        .await
        .map_err(CliError::store)?
        .ok_or_else(|| unknown(conn, id))?;
    Ok(Kind::DeadLetter(Box::new(record)).into())
}

/// `flowwarden dlq discard ID`: status `discarded`, the record kept for audit.
pub(crate) async fn discard(conn: &Conn, id: &str) -> Result<Report, CliError> {
    let record = conn
        .backend
        .get(id)
        .await
        .map_err(CliError::store)?
        .ok_or_else(|| unknown(conn, id))?;
    let found = conn
        .backend
        .set_status(id, DeadLetterStatus::Discarded)
        .await
        .map_err(CliError::store)?;
    if !found {
        return Err(unknown(conn, id));
    }
    tracing::info!(id, stream = %record.stream, "dead letter discarded");
    Ok(Kind::Discarded {
        id: id.to_owned(),
        stream: record.stream,
        previous: record.status,
    }
    .into())
}

/// `flowwarden dlq replay ID --admin URL`.
pub(crate) async fn replay(
    id: &str,
    admin: Option<&str>,
    token: Option<&str>,
) -> Result<Report, CliError> {
    let Some(admin) = admin.map(str::trim).filter(|a| !a.is_empty()) else {
        return Err(CliError::NeedsService(format!(
            "dlq replay needs the running service: only it has the stream's handler code. Pass --admin http://HOST:PORT (its admin API, feature admin, FLOWWARDEN_ADMIN_ADDR; or set {}) and --token or {}. With the service down, the record stays pending until it runs; `flowwarden dlq discard` drops it instead",
            super::ENV_ADMIN_URL,
            super::ENV_ADMIN_TOKEN
        )));
    };
    let url = AdminUrl::parse(admin)?;
    let token = token.map(str::trim).filter(|t| !t.is_empty());
    let path = format!("/dead-letters/{}/replay", admin_http::path_segment(id));
    let answer = admin_http::post(&url, &path, token).await?;
    if answer.status == 200 {
        return Ok(Kind::Replayed {
            id: id.to_owned(),
            admin: url.display(),
        }
        .into());
    }
    // The API's errors are `{"error": "...", "code": "..."}`.
    let parsed: Option<serde_json::Value> = serde_json::from_str(&answer.body).ok();
    let field = |k: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(k))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let message = field("error").unwrap_or_else(|| answer.body.trim().to_owned());
    let code = field("code").unwrap_or_default();
    Err(match (answer.status, code.as_str()) {
        (404, "unknown_dead_letter") => CliError::NotFound(format!(
            "the service at {} knows no dead letter '{id}': {message}",
            url.display()
        )),
        (401, _) | (403, _) => CliError::Admin(format!(
            "the admin API at {} refused the replay (HTTP {}): {message}. Pass the service's admin token with --token or {}",
            url.display(),
            answer.status,
            super::ENV_ADMIN_TOKEN
        )),
        (status, _) => CliError::Admin(format!(
            "the admin API at {} answered HTTP {status}{}: {message}",
            url.display(),
            if code.is_empty() { String::new() } else { format!(" ({code})") }
        )),
    })
}
