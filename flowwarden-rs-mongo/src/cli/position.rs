//! The positions `checkpoint reset` writes, in the form the runtime resumes from: a resume token
//! it opens `resumeAfter`.
//!
//! A time (`--to-now`, `--to-time`) becomes a token the way the runtime itself turns an
//! operation time into one (the MongoDB source's `StartAt::OperationTime`): a change stream is
//! opened with `startAtOperationTime` and an empty first batch (`batchSize: 0`), and its
//! post-batch resume token is the position just before that time. The stream is opened on
//! `_fw_checkpoints` (which the tool may read anyway): a post-batch token of an empty batch is
//! a high-water mark, which carries only the cluster time and no collection, so the stream's own
//! collection resumes from it at exactly that time.

use std::cmp::Ordering;
use std::time::Duration;

use bson::{Bson, DateTime, Timestamp};
use flowwarden::port::{ChangeSource, SourceErrorKind, StartAt, StoredPosition, WatchSpec};
use flowwarden::{FullDocument, FullDocumentBeforeChange, ResumeToken};
use serde::Serialize;
use tracing::debug;

use super::connect::Conn;
use super::error::CliError;
use super::views::{date, PositionView, TimeView};

/// The stream name of the tool's own position probes (in logs and errors).
const PROBE: &str = "flowwarden-cli";

/// A position to write, and how it was chosen.
#[derive(Debug, Clone)]
pub(crate) struct NewPosition {
    pub(crate) position: StoredPosition,
    /// `now`, `time` or `token`.
    pub(crate) mode: &'static str,
    /// In words: where the stream resumes.
    pub(crate) describe: String,
    /// Caveats (for example a history bound that could not be checked).
    pub(crate) warnings: Vec<String>,
}

/// Just after everything written so far: the server's newest operation time, per `hello`.
pub(crate) async fn at_now(conn: &Conn) -> Result<NewPosition, CliError> {
    let clock = conn.clock().await?;
    let last = clock.operation_time.ok_or_else(|| {
        CliError::Failed(
            "the server reported no operation time (hello has no operationTime, lastWrite or $clusterTime): is it a replica set? Use --to-token instead".into(),
        )
    })?;
    // The first change after `last`: every change at or before it counts as settled.
    let start = match last.increment.checked_add(1) {
        Some(increment) => Timestamp {
            time: last.time,
            increment,
        },
        None => Timestamp {
            time: last.time.saturating_add(1),
            increment: 0,
        },
    };
    let token = token_at(conn, start).await?;
    Ok(NewPosition {
        position: StoredPosition {
            token,
            cluster_time: Some(last),
            wall_time: Some(seconds(last.time)),
            start_after: false,
        },
        mode: "now",
        describe: format!(
            "after the server's current operation time {}.{} ({}): only changes written from now on are delivered",
            last.time,
            last.increment,
            date(seconds(last.time))
        ),
        warnings: Vec::new(),
    })
}

/// At the start of the second of `text` (RFC 3339): every change from that second on.
pub(crate) async fn at_time(conn: &Conn, text: &str) -> Result<NewPosition, CliError> {
    let at = DateTime::parse_rfc3339_str(text.trim()).map_err(|e| {
        CliError::Usage(format!(
            "--to-time '{text}' is not an RFC 3339 time ({e}); write for example 2024-05-01T12:00:00Z"
        ))
    })?;
    let secs = at.timestamp_millis().div_euclid(1000);
    let time = u32::try_from(secs).map_err(|_| {
        CliError::Usage(format!(
            "--to-time '{text}' is outside the range of MongoDB cluster times (1970 to 2106)"
        ))
    })?;
    let clock = conn.clock().await?;
    if at > clock.now {
        return Err(CliError::Usage(format!(
            "--to-time {} is in the future (the server's time is {}); use --to-now to skip to the present",
            date(at),
            date(clock.now)
        )));
    }
    let start = Timestamp { time, increment: 0 };
    let mut warnings = Vec::new();
    match oldest_retained(conn).await {
        Ok(oldest) if (oldest.time, oldest.increment) > (start.time, start.increment) => {
            return Err(CliError::HistoryLost(format!(
                "--to-time {} is older than the oldest change the server still keeps ({}): the stream could not resume there. Choose a time at or after it",
                date(seconds(time)),
                date(seconds(oldest.time))
            )));
        }
        Ok(_) => {}
        Err(why) => warnings.push(format!(
            "could not check that {} is within the retained history ({why}); if it is not, the stream halts HistoryLost on start",
            date(seconds(time))
        )),
    }
    let token = token_at(conn, start).await?;
    Ok(NewPosition {
        position: StoredPosition {
            token,
            cluster_time: Some(start),
            wall_time: Some(seconds(time)),
            start_after: false,
        },
        mode: "time",
        describe: format!(
            "at {} (rounded down to the second): every change from that second on is delivered",
            date(seconds(time))
        ),
        warnings,
    })
}

/// Just after the token in `json` (extended JSON of a resume-token document).
pub(crate) fn at_token(json: &str) -> Result<NewPosition, CliError> {
    let bad = |why: String| {
        CliError::Usage(format!(
            "--to-token '{json}' {why}; give the token document as extended JSON, for example '{{\"_data\": \"8263...\"}}' (a change event's _id, a dead letter's token)"
        ))
    };
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| bad(format!("is not JSON ({e})")))?;
    let token = match Bson::try_from(value) {
        Ok(Bson::Document(d)) if !d.is_empty() => ResumeToken::from_document(d),
        Ok(Bson::Document(_)) => return Err(bad("is an empty document".into())),
        Ok(_) => return Err(bad("is not a document".into())),
        Err(e) => return Err(bad(format!("is not valid extended JSON ({e})"))),
    };
    let mut warnings = Vec::new();
    if token.data().is_none() {
        warnings.push(
            "the token has no _data string: it cannot be ordered against the old position, so the direction of the gap is unknown".to_owned(),
        );
    }
    Ok(NewPosition {
        describe: format!("just after the change with token {token}"),
        position: StoredPosition {
            token,
            cluster_time: None,
            wall_time: None,
            start_after: false,
        },
        mode: "token",
        warnings,
    })
}

/// The token of the position just before `start`.
async fn token_at(conn: &Conn, start: Timestamp) -> Result<ResumeToken, CliError> {
    let spec = WatchSpec {
        stream: PROBE,
        database: Some(conn.database().to_owned()),
        collection: crate::CHECKPOINTS.to_owned(),
        pipeline: Vec::new(),
        full_document: FullDocument::Default,
        full_document_before_change: FullDocumentBeforeChange::Off,
        batch_size: 0,
        max_await: Duration::ZERO,
    };
    let cursor = conn
        .backend
        .open(&spec, StartAt::OperationTime(start))
        .await
        .map_err(|e| match e.kind {
            SourceErrorKind::HistoryLost => CliError::HistoryLost(format!(
                "the server no longer keeps the changes at {} ({}): choose a later position",
                date(seconds(start.time)),
                e.message
            )),
            _ => CliError::Failed(format!(
                "could not turn the time {}.{} into a resume token: {} (the tool opens a change stream on {}; it needs a replica set or a sharded cluster and the changeStream privilege, part of read)",
                start.time, start.increment, e.message, crate::CHECKPOINTS
            )),
        })?;
    let token = cursor.initial_position().ok_or_else(|| {
        CliError::Failed(format!(
            "the server reported no start position for a change stream opened at {}.{}; use --to-token instead",
            start.time, start.increment
        ))
    })?;
    debug!(%token, time = start.time, increment = start.increment, "position token");
    Ok(token)
}

/// The oldest retained history entry, or why it is unknown.
async fn oldest_retained(conn: &Conn) -> Result<Timestamp, String> {
    let oplog = match conn.backend.oldest_oplog_time().await {
        Ok(Some(ts)) => return Ok(ts),
        Ok(None) => "local.oplog.rs returned no entry".to_owned(),
        Err(e) => format!("local.oplog.rs: {}", crate::short_error(&e)),
    };
    match conn.backend.earliest_optime().await {
        Ok(Some(ts)) => Ok(ts),
        Ok(None) => Err(format!("{oplog}; serverStatus has no oplog.earliestOptime")),
        Err(e) => Err(format!("{oplog}; serverStatus: {}", crate::short_error(&e))),
    }
}

fn seconds(time: u32) -> DateTime {
    DateTime::from_millis(i64::from(time) * 1000)
}

/// What resetting from `old` to `new` does to the changes between them.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Gap {
    /// Which stored position this compares (`lastProcessed`, `lastSeen`).
    pub(crate) from: &'static str,
    /// The old position.
    pub(crate) old: PositionView,
    /// `skipped` (the new position is later: the changes in between are never delivered),
    /// `replayed` (earlier: they are delivered again), `none` (the same), or `unknown`.
    pub(crate) direction: &'static str,
    /// In words.
    pub(crate) message: String,
}

/// Compares one stored position with the new one.
pub(crate) fn gap(from: &'static str, old: &StoredPosition, new: &StoredPosition) -> Gap {
    let old_time = old
        .wall_time
        .map(date)
        .or_else(|| old.cluster_time.map(|t| TimeView::of(t).time))
        .map(|t| format!(" ({t})"))
        .unwrap_or_default();
    let (direction, message) = match old.token.position_cmp(&new.token) {
        Some(Ordering::Less) => (
            "skipped",
            format!(
                "changes after the old {from} position{old_time} up to the new one are SKIPPED: never delivered to the handlers (backfill them if they matter)"
            ),
        ),
        Some(Ordering::Greater) => (
            "replayed",
            format!(
                "changes after the new position up to the old {from} position{old_time} are REPLAYED: delivered again (handlers are idempotent)"
            ),
        ),
        Some(Ordering::Equal) => ("none", format!("the old {from} position is the same: no gap")),
        None => (
            "unknown",
            format!(
                "the old {from} token{old_time} cannot be ordered against the new one: changes between them may be skipped or replayed"
            ),
        ),
    };
    Gap {
        from,
        old: PositionView::of(old),
        direction,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn pos(data: &str) -> StoredPosition {
        StoredPosition {
            token: ResumeToken::from_document(doc! {"_data": data}),
            cluster_time: None,
            wall_time: None,
            start_after: false,
        }
    }

    #[test]
    fn gap_directions() {
        assert_eq!(
            gap("lastSeen", &pos("8201"), &pos("8202")).direction,
            "skipped"
        );
        assert_eq!(
            gap("lastSeen", &pos("8203"), &pos("8202")).direction,
            "replayed"
        );
        assert_eq!(
            gap("lastSeen", &pos("8202"), &pos("8202")).direction,
            "none"
        );
        let odd = StoredPosition {
            token: ResumeToken::from_document(doc! {"x": 1}),
            ..pos("")
        };
        assert_eq!(gap("lastSeen", &odd, &pos("8202")).direction, "unknown");
    }

    #[test]
    fn tokens_are_parsed_as_extended_json() {
        let p = at_token(r#"{"_data": "82AB"}"#).expect("parses");
        assert_eq!(p.position.token.data(), Some("82AB"));
        assert!(p.warnings.is_empty());
        for bad in ["", "nope", "[1]", "{}", r#"{"$date": "x"}"#] {
            assert!(matches!(at_token(bad), Err(CliError::Usage(_))), "{bad}");
        }
        assert_eq!(at_token(r#"{"a": 1}"#).expect("parses").warnings.len(), 1);
    }
}
