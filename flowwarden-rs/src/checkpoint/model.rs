//! The checkpoint document and its strict parser.

use bson::{doc, Bson, DateTime, Document, Timestamp};

use crate::event::ResumeToken;

/// A settled position as persisted: the token and what is known of its time.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredPosition {
    /// The resume token.
    pub token: ResumeToken,
    /// The event's cluster time, when known (idle post-batch tokens have none).
    pub cluster_time: Option<Timestamp>,
    /// The event's wall time, when known.
    pub wall_time: Option<DateTime>,
    /// Resume with `startAfter` (the token is an invalidate's).
    pub start_after: bool,
}

/// The persisted progress of one stream: the FlowWarden pair of tokens.
///
/// `last_processed` advances after handled events (written every `save_every_n`);
/// `last_seen` is the latest *settled* position of any kind (handled, dead-lettered,
/// filtered out, or an idle post-batch token), written by the heartbeat. Both only ever
/// point at settled positions.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The stream's name (`_id`).
    pub stream: String,
    /// The last handled event.
    pub last_processed: Option<StoredPosition>,
    /// The latest settled position.
    pub last_seen: Option<StoredPosition>,
    /// The instance that wrote it.
    pub owner: Option<String>,
    /// The writer's fencing epoch.
    pub epoch: Option<i64>,
    /// When it was written.
    pub updated_at: DateTime,
}

/// A stored checkpoint that does not parse: names the stream and the field.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("checkpoint of stream '{stream}' is corrupt: field `{field}` {problem}")]
pub struct CheckpointParseError {
    /// The stream.
    pub stream: String,
    /// The offending field.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

const FORMAT_VERSION: i32 = 1;

/// Field a leader's claim sets on the checkpoint document (see
/// [`crate::CheckpointStore::claim`]).
pub const CLAIMED_AT: &str = "claimedAt";

/// Whether a stored checkpoint document records only a leader's claim (`_id`, `owner`,
/// `epoch`, `claimedAt`) and no position yet: such a document loads as no checkpoint.
pub fn is_claim_only(doc: &Document) -> bool {
    doc.contains_key(CLAIMED_AT)
        && doc
            .keys()
            .all(|k| matches!(k.as_str(), "_id" | "owner" | "epoch" | CLAIMED_AT))
}

impl Checkpoint {
    /// The document stored for this checkpoint.
    pub fn to_document(&self) -> Document {
        let mut d = doc! { "_id": &self.stream, "v": FORMAT_VERSION };
        put_position(&mut d, "lastProcessed", self.last_processed.as_ref());
        put_position(&mut d, "lastSeen", self.last_seen.as_ref());
        if let Some(owner) = &self.owner {
            d.insert("owner", owner);
        }
        if let Some(epoch) = self.epoch {
            d.insert("epoch", epoch);
        }
        d.insert("updatedAt", self.updated_at);
        d
    }

    /// Parses a stored document strictly: any present field of the wrong shape is an error
    /// naming the field, never a silent reset.
    pub fn from_document(doc: &Document) -> Result<Self, CheckpointParseError> {
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
            None | Some(Bson::Int32(FORMAT_VERSION)) => {}
            Some(_) => return Err(err("v", "is not a format version this release reads (1)")),
        }
        let last_processed = get_position(doc, "lastProcessed", &err)?;
        let last_seen = get_position(doc, "lastSeen", &err)?;
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
        Ok(Self {
            stream,
            last_processed,
            last_seen,
            owner,
            epoch,
            updated_at,
        })
    }

    /// The time of the most recent stored position, for operator messages.
    pub fn describe_time(&self) -> String {
        let pos = [self.last_seen.as_ref(), self.last_processed.as_ref()]
            .into_iter()
            .flatten()
            .find_map(|p| p.wall_time);
        match pos {
            Some(t) => format!("{} (written {})", t, self.updated_at),
            None => format!("written {}", self.updated_at),
        }
    }
}

fn put_position(d: &mut Document, prefix: &str, pos: Option<&StoredPosition>) {
    let Some(pos) = pos else { return };
    d.insert(format!("{prefix}Token"), pos.token.as_document().clone());
    if let Some(ts) = pos.cluster_time {
        d.insert(format!("{prefix}ClusterTime"), ts);
    }
    if let Some(wt) = pos.wall_time {
        d.insert(format!("{prefix}WallTime"), wt);
    }
    if pos.start_after {
        d.insert(format!("{prefix}StartAfter"), true);
    }
}

fn get_position(
    d: &Document,
    prefix: &str,
    err: &dyn Fn(&str, &str) -> CheckpointParseError,
) -> Result<Option<StoredPosition>, CheckpointParseError> {
    let token_field = format!("{prefix}Token");
    let token = match d.get(&token_field) {
        None | Some(Bson::Null) => return Ok(None),
        Some(Bson::Document(t)) if !t.is_empty() => ResumeToken::from_document(t.clone()),
        Some(Bson::Document(_)) => return Err(err(&token_field, "is an empty document")),
        Some(_) => return Err(err(&token_field, "is not a resume-token document")),
    };
    let ct_field = format!("{prefix}ClusterTime");
    let cluster_time = match d.get(&ct_field) {
        None | Some(Bson::Null) => None,
        Some(Bson::Timestamp(ts)) => Some(*ts),
        Some(_) => return Err(err(&ct_field, "is not a timestamp")),
    };
    let wt_field = format!("{prefix}WallTime");
    let wall_time = match d.get(&wt_field) {
        None | Some(Bson::Null) => None,
        Some(Bson::DateTime(t)) => Some(*t),
        Some(_) => return Err(err(&wt_field, "is not a date")),
    };
    let sa_field = format!("{prefix}StartAfter");
    let start_after = match d.get(&sa_field) {
        None | Some(Bson::Null) => false,
        Some(Bson::Boolean(b)) => *b,
        Some(_) => return Err(err(&sa_field, "is not a boolean")),
    };
    Ok(Some(StoredPosition {
        token,
        cluster_time,
        wall_time,
        start_after,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    #[test]
    fn round_trips() {
        let cp = sample();
        assert_eq!(Checkpoint::from_document(&cp.to_document()), Ok(cp));
    }

    #[test]
    fn corrupt_token_names_stream_and_field() {
        let mut d = sample().to_document();
        d.insert("lastSeenToken", "garbage");
        let e = Checkpoint::from_document(&d).unwrap_err();
        assert_eq!(e.stream, "orders");
        assert_eq!(e.field, "lastSeenToken");
        assert!(e.to_string().contains("orders"));
    }

    #[test]
    fn missing_updated_at_is_corrupt() {
        let mut d = sample().to_document();
        d.remove("updatedAt");
        assert_eq!(
            Checkpoint::from_document(&d).unwrap_err().field,
            "updatedAt"
        );
    }

    #[test]
    fn unknown_version_is_refused() {
        let mut d = sample().to_document();
        d.insert("v", 99);
        assert_eq!(Checkpoint::from_document(&d).unwrap_err().field, "v");
    }
}
