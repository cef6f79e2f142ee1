//! The BSON codecs of the stored models: how a checkpoint and a dead-letter record are written
//! as documents and parsed back strictly. MongoDB stores these documents; the in-memory backend
//! keeps the same ones, so both parse what they stored the same way. A backend that stores
//! something else (a Redis hash, a SQL row) may use them or not: the port's traits take and
//! return the models, never documents.

use bson::{doc, Bson, Document};

use super::checkpoint::{Checkpoint, CheckpointParseError, SnapshotProgress, StoredPosition};
use super::dead_letter::{DeadLetterRecord, DeadLetterStatus};
use super::store_error::{StoreError, StoreErrorKind};
use crate::event::ResumeToken;

/// The largest encoded record a store of BSON documents accepts: MongoDB's 16 MiB document
/// limit less 64 KiB of headroom for the write command around it.
pub const MAX_BSON_RECORD_BYTES: usize = 16 * 1024 * 1024 - 64 * 1024;

const FORMAT_VERSION: i32 = 1;
/// The format of a checkpoint that carries an unfinished initial snapshot: a release that
/// does not know snapshots refuses it loudly (corrupt checkpoint) instead of reading "no
/// position" and starting at "now", which would skip the rest of the scan.
const FORMAT_VERSION_SNAPSHOT: i32 = 2;

/// Field a leader's claim sets on the checkpoint document (see
/// [`crate::port::CheckpointStore::claim`]).
pub const CLAIMED_AT: &str = "claimedAt";

/// Whether a stored checkpoint document records only a leader's claim (`_id`, `owner`,
/// `epoch`, `claimedAt`) and no position yet: such a document loads as no checkpoint.
pub fn is_claim_only(doc: &Document) -> bool {
    doc.contains_key(CLAIMED_AT)
        && doc
            .keys()
            .all(|k| matches!(k.as_str(), "_id" | "owner" | "epoch" | CLAIMED_AT))
}

/// The document stored for a checkpoint (`_fw_checkpoints` on MongoDB; the in-memory
/// backend keeps the same document).
pub fn encode_checkpoint(checkpoint: &Checkpoint) -> Document {
    let mut d = Document::new();
    encode_checkpoint_into(checkpoint, &mut d);
    d
}

/// [`encode_checkpoint`] into `d`, replacing everything `d` held. A store that keeps one
/// document per stream rewrites it in place this way and keeps its allocation: a busy stream
/// then allocates no new top-level table per checkpoint (one larger than 1 KiB makes glibc's
/// allocator consolidate every chunk freed since the last one).
pub fn encode_checkpoint_into(checkpoint: &Checkpoint, d: &mut Document) {
    d.clear();
    let version = if checkpoint.snapshot.is_some() {
        FORMAT_VERSION_SNAPSHOT
    } else {
        FORMAT_VERSION
    };
    d.insert("_id", checkpoint.stream.as_str());
    d.insert("v", version);
    put_position(d, &LAST_PROCESSED, checkpoint.last_processed.as_ref());
    put_position(d, &LAST_SEEN, checkpoint.last_seen.as_ref());
    if let Some(snapshot) = &checkpoint.snapshot {
        put_position(d, &SNAPSHOT_START, Some(&snapshot.start));
        if let Some(id) = &snapshot.last_id {
            d.insert("snapshotLastId", id.clone());
        }
        d.insert(
            "snapshotScanned",
            i64::try_from(snapshot.scanned).unwrap_or(i64::MAX),
        );
        d.insert("snapshotStartedAt", snapshot.started_at);
    }
    if let Some(owner) = &checkpoint.owner {
        d.insert("owner", owner);
    }
    if let Some(epoch) = checkpoint.epoch {
        d.insert("epoch", epoch);
    }
    d.insert("updatedAt", checkpoint.updated_at);
}

/// Parses a stored checkpoint document strictly: any present field of the wrong shape is an error
/// naming the field, never a silent reset.
pub fn decode_checkpoint(doc: &Document) -> Result<Checkpoint, CheckpointParseError> {
    let stream = match doc.get("_id") {
        Some(Bson::String(s)) => s.clone(),
        other => {
            return Err(CheckpointParseError {
                stream: other.map(|b| b.to_string()).unwrap_or_default(),
                field: "_id".into(),
                problem: "is not the stream name (a string)".into(),
            })
        }
    };
    let err = |field: &str, problem: &str| CheckpointParseError {
        stream: stream.clone(),
        field: field.into(),
        problem: problem.into(),
    };
    match doc.get("v") {
        None | Some(Bson::Int32(FORMAT_VERSION | FORMAT_VERSION_SNAPSHOT)) => {}
        Some(_) => {
            return Err(err(
                "v",
                "is not a format version this release reads (1, or 2 during an initial snapshot)",
            ))
        }
    }
    let last_processed = get_position(doc, &LAST_PROCESSED, &err)?;
    let last_seen = get_position(doc, &LAST_SEEN, &err)?;
    let snapshot = get_snapshot(doc, &err)?;
    let owner = match doc.get("owner") {
        None | Some(Bson::Null) => None,
        Some(Bson::String(s)) => Some(s.clone()),
        Some(_) => return Err(err("owner", "is not a string")),
    };
    let epoch = match doc.get("epoch") {
        None | Some(Bson::Null) => None,
        Some(Bson::Int64(e)) => Some(*e),
        Some(Bson::Int32(e)) => Some(i64::from(*e)),
        Some(_) => return Err(err("epoch", "is not an integer")),
    };
    let updated_at = match doc.get("updatedAt") {
        Some(Bson::DateTime(d)) => *d,
        None => return Err(err("updatedAt", "is missing")),
        Some(_) => return Err(err("updatedAt", "is not a date")),
    };
    Ok(Checkpoint {
        stream,
        last_processed,
        last_seen,
        owner,
        epoch,
        updated_at,
        snapshot,
    })
}

fn get_snapshot(
    d: &Document,
    err: &dyn Fn(&str, &str) -> CheckpointParseError,
) -> Result<Option<SnapshotProgress>, CheckpointParseError> {
    let Some(start) = get_position(d, &SNAPSHOT_START, err)? else {
        if d.contains_key("snapshotLastId") || d.contains_key("snapshotScanned") {
            return Err(err(
                SNAPSHOT_START.token,
                "is missing while the snapshot's progress is present",
            ));
        }
        return Ok(None);
    };
    let last_id = match d.get("snapshotLastId") {
        None => None,
        Some(Bson::Array(_)) => return Err(err("snapshotLastId", "is an array (never an _id)")),
        Some(id) => Some(id.clone()),
    };
    let scanned = match d.get("snapshotScanned") {
        Some(Bson::Int64(n)) => {
            u64::try_from(*n).map_err(|_| err("snapshotScanned", "is negative"))?
        }
        Some(Bson::Int32(n)) => {
            u64::try_from(*n).map_err(|_| err("snapshotScanned", "is negative"))?
        }
        None => return Err(err("snapshotScanned", "is missing")),
        Some(_) => return Err(err("snapshotScanned", "is not an integer")),
    };
    let started_at = match d.get("snapshotStartedAt") {
        Some(Bson::DateTime(t)) => *t,
        None => return Err(err("snapshotStartedAt", "is missing")),
        Some(_) => return Err(err("snapshotStartedAt", "is not a date")),
    };
    Ok(Some(SnapshotProgress {
        start,
        last_id,
        scanned,
        started_at,
    }))
}

/// The field names of one stored position (`<prefix>Token`, ...), spelled out so encoding
/// formats nothing.
struct PositionFields {
    token: &'static str,
    cluster_time: &'static str,
    wall_time: &'static str,
    start_after: &'static str,
}

const LAST_PROCESSED: PositionFields = PositionFields {
    token: "lastProcessedToken",
    cluster_time: "lastProcessedClusterTime",
    wall_time: "lastProcessedWallTime",
    start_after: "lastProcessedStartAfter",
};
const LAST_SEEN: PositionFields = PositionFields {
    token: "lastSeenToken",
    cluster_time: "lastSeenClusterTime",
    wall_time: "lastSeenWallTime",
    start_after: "lastSeenStartAfter",
};
const SNAPSHOT_START: PositionFields = PositionFields {
    token: "snapshotStartToken",
    cluster_time: "snapshotStartClusterTime",
    wall_time: "snapshotStartWallTime",
    start_after: "snapshotStartStartAfter",
};

fn put_position(d: &mut Document, fields: &PositionFields, pos: Option<&StoredPosition>) {
    let Some(pos) = pos else { return };
    d.insert(fields.token, pos.token.as_document().clone());
    if let Some(ts) = pos.cluster_time {
        d.insert(fields.cluster_time, ts);
    }
    if let Some(wt) = pos.wall_time {
        d.insert(fields.wall_time, wt);
    }
    if pos.start_after {
        d.insert(fields.start_after, true);
    }
}

fn get_position(
    d: &Document,
    fields: &PositionFields,
    err: &dyn Fn(&str, &str) -> CheckpointParseError,
) -> Result<Option<StoredPosition>, CheckpointParseError> {
    let token = match d.get(fields.token) {
        None | Some(Bson::Null) => return Ok(None),
        Some(Bson::Document(t)) if !t.is_empty() => ResumeToken::from_document(t.clone()),
        Some(Bson::Document(_)) => return Err(err(fields.token, "is an empty document")),
        Some(_) => return Err(err(fields.token, "is not a resume-token document")),
    };
    let cluster_time = match d.get(fields.cluster_time) {
        None | Some(Bson::Null) => None,
        Some(Bson::Timestamp(ts)) => Some(*ts),
        Some(_) => return Err(err(fields.cluster_time, "is not a timestamp")),
    };
    let wall_time = match d.get(fields.wall_time) {
        None | Some(Bson::Null) => None,
        Some(Bson::DateTime(t)) => Some(*t),
        Some(_) => return Err(err(fields.wall_time, "is not a date")),
    };
    let start_after = match d.get(fields.start_after) {
        None | Some(Bson::Null) => false,
        Some(Bson::Boolean(b)) => *b,
        Some(_) => return Err(err(fields.start_after, "is not a boolean")),
    };
    Ok(Some(StoredPosition {
        token,
        cluster_time,
        wall_time,
        start_after,
    }))
}

/// The document stored for a dead-letter record (`_fw_dlq` on MongoDB).
pub fn encode_dead_letter(record: &DeadLetterRecord) -> Document {
    let mut d = doc! {
        "_id": &record.id,
        "stream": &record.stream,
        "event": record.event.clone(),
        "truncated": record.truncated,
        "token": record.token.as_document().clone(),
        "operationType": &record.operation_type,
        "documentKey": record.document_key.clone().map(Bson::Document).unwrap_or(Bson::Null),
        "errorChain": record.error_chain.clone(),
        "errorKind": &record.error_kind,
        "attempts": i64::from(record.attempts),
        "firstFailedAt": record.first_failed_at,
        "lastFailedAt": record.last_failed_at,
        "status": record.status.as_str(),
    };
    if let Some(owner) = &record.owner {
        d.insert("owner", owner);
    }
    if let Some(epoch) = record.epoch {
        d.insert("epoch", epoch);
    }
    d
}

/// Parses a stored dead-letter document; a malformed field is a
/// [`StoreErrorKind::Corrupt`] error naming the record and the field.
pub fn decode_dead_letter(d: &Document) -> Result<DeadLetterRecord, StoreError> {
    let id = d
        .get_str("_id")
        .map_err(|_| corrupt("?", "_id"))?
        .to_owned();
    let field = |name: &str| corrupt(&id, name);
    Ok(DeadLetterRecord {
        stream: d.get_str("stream").map_err(|_| field("stream"))?.to_owned(),
        event: d.get_document("event").map_err(|_| field("event"))?.clone(),
        truncated: d.get_bool("truncated").unwrap_or(false),
        token: ResumeToken::from_document(
            d.get_document("token").map_err(|_| field("token"))?.clone(),
        ),
        operation_type: d
            .get_str("operationType")
            .map_err(|_| field("operationType"))?
            .to_owned(),
        document_key: d.get_document("documentKey").ok().cloned(),
        error_chain: d
            .get_array("errorChain")
            .map_err(|_| field("errorChain"))?
            .iter()
            .map(|b| b.as_str().unwrap_or_default().to_owned())
            .collect(),
        error_kind: d.get_str("errorKind").unwrap_or("Failed").to_owned(),
        attempts: match d.get("attempts") {
            Some(Bson::Int64(n)) => u32::try_from(*n).unwrap_or(u32::MAX),
            Some(Bson::Int32(n)) => u32::try_from(*n).unwrap_or(0),
            _ => return Err(field("attempts")),
        },
        first_failed_at: *d
            .get_datetime("firstFailedAt")
            .map_err(|_| field("firstFailedAt"))?,
        last_failed_at: *d
            .get_datetime("lastFailedAt")
            .map_err(|_| field("lastFailedAt"))?,
        status: d
            .get_str("status")
            .ok()
            .and_then(DeadLetterStatus::parse)
            .ok_or_else(|| field("status"))?,
        owner: d.get_str("owner").ok().map(str::to_owned),
        epoch: d.get_i64("epoch").ok(),
        id,
    })
}

fn corrupt(id: &str, field: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        format!("dead-letter record '{id}': field `{field}` is missing or malformed"),
    )
}

/// The encoded size of a document in bytes.
pub fn encoded_len(d: &Document) -> usize {
    let mut buf = Vec::new();
    match d.to_writer(&mut buf) {
        Ok(()) => buf.len(),
        Err(_) => usize::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{DateTime, Timestamp};

    fn sample() -> Checkpoint {
        Checkpoint {
            stream: "orders".into(),
            last_processed: Some(StoredPosition {
                token: ResumeToken::from_document(doc! {"_data": "0A"}),
                cluster_time: Some(Timestamp {
                    time: 1,
                    increment: 2,
                }),
                wall_time: Some(DateTime::from_millis(1000)),
                start_after: false,
            }),
            last_seen: Some(StoredPosition {
                token: ResumeToken::from_document(doc! {"_data": "0B"}),
                cluster_time: None,
                wall_time: None,
                start_after: true,
            }),
            owner: Some("host-1".into()),
            epoch: Some(3),
            updated_at: DateTime::from_millis(5000),
            snapshot: None,
        }
    }

    fn mid_snapshot() -> Checkpoint {
        Checkpoint {
            last_processed: None,
            last_seen: None,
            snapshot: Some(SnapshotProgress {
                start: StoredPosition {
                    token: ResumeToken::from_document(doc! {"_data": "0C"}),
                    cluster_time: None,
                    wall_time: None,
                    start_after: false,
                },
                last_id: Some(Bson::String("order-41".into())),
                scanned: 41,
                started_at: DateTime::from_millis(4000),
            }),
            ..sample()
        }
    }

    #[test]
    fn an_unfinished_snapshot_round_trips_under_its_own_version() {
        let cp = mid_snapshot();
        let d = encode_checkpoint(&cp);
        assert_eq!(d.get_i32("v"), Ok(2));
        assert_eq!(decode_checkpoint(&d), Ok(cp));
        // Before the first document: no last `_id`.
        let mut first = mid_snapshot();
        if let Some(s) = first.snapshot.as_mut() {
            s.last_id = None;
            s.scanned = 0;
        }
        assert_eq!(decode_checkpoint(&encode_checkpoint(&first)), Ok(first));
        assert_eq!(encode_checkpoint(&sample()).get_i32("v"), Ok(1));
    }

    #[test]
    fn a_damaged_snapshot_progress_is_corrupt() {
        let mut d = encode_checkpoint(&mid_snapshot());
        d.remove("snapshotStartToken");
        assert_eq!(
            decode_checkpoint(&d).unwrap_err().field,
            "snapshotStartToken"
        );
        let mut d = encode_checkpoint(&mid_snapshot());
        d.insert("snapshotScanned", "many");
        assert_eq!(decode_checkpoint(&d).unwrap_err().field, "snapshotScanned");
        let mut d = encode_checkpoint(&mid_snapshot());
        d.insert("snapshotLastId", vec![Bson::Int32(1)]);
        assert_eq!(decode_checkpoint(&d).unwrap_err().field, "snapshotLastId");
    }

    #[test]
    fn encoding_in_place_replaces_every_field_and_keeps_the_allocation() {
        // A claimed document that had a snapshot in progress, rewritten with a plain
        // checkpoint: nothing of the old content may survive, and the field order is the
        // one a fresh encoding has.
        let mut stored = encode_checkpoint(&mid_snapshot());
        stored.insert(CLAIMED_AT, bson::DateTime::from_millis(1));
        stored.insert("stale", 1);
        let table = stored.iter().next().map(|(k, _)| k as *const String);
        let cp = sample();
        encode_checkpoint_into(&cp, &mut stored);
        assert_eq!(stored, encode_checkpoint(&cp));
        assert_eq!(
            stored.keys().collect::<Vec<_>>(),
            encode_checkpoint(&cp).keys().collect::<Vec<_>>()
        );
        assert_eq!(decode_checkpoint(&stored), Ok(cp));
        // The entries live where they lived (the table was cleared, not replaced).
        assert_eq!(stored.iter().next().map(|(k, _)| k as *const String), table);
    }

    #[test]
    fn round_trips() {
        let cp = sample();
        assert_eq!(decode_checkpoint(&encode_checkpoint(&cp)), Ok(cp));
    }

    #[test]
    fn corrupt_token_names_stream_and_field() {
        let mut d = encode_checkpoint(&sample());
        d.insert("lastSeenToken", "garbage");
        let e = decode_checkpoint(&d).unwrap_err();
        assert_eq!(e.stream, "orders");
        assert_eq!(e.field, "lastSeenToken");
        assert!(e.to_string().contains("orders"));
    }

    #[test]
    fn missing_updated_at_is_corrupt() {
        let mut d = encode_checkpoint(&sample());
        d.remove("updatedAt");
        assert_eq!(decode_checkpoint(&d).unwrap_err().field, "updatedAt");
    }

    #[test]
    fn unknown_version_is_refused() {
        let mut d = encode_checkpoint(&sample());
        d.insert("v", 99);
        assert_eq!(decode_checkpoint(&d).unwrap_err().field, "v");
    }
}
