//! What is stored about a stream — its checkpoint, its leases, its dead letters — and whether
//! that shows it running; and `flowwarden streams`, which lists it for every stream.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, Bson, DateTime, Document};
use flowwarden::port::codec::{decode_checkpoint, is_claim_only, CLAIMED_AT};
use flowwarden::port::{Checkpoint, DeadLetterStatus};
use futures::TryStreamExt;

use super::connect::{Conn, ServerClock};
use super::error::CliError;
use super::output::{Kind, Report};
use super::views::{date, CheckpointView};
use super::{GlobalArgs, CLI_OWNER};
use crate::LeaseDocument;

/// The suffix of a stream's checkpoint-guard lease (see `docs/runbooks/shared-checkpoint.md`).
pub(crate) const GUARD_SUFFIX: &str = "#checkpoint";

/// A checkpoint document as found.
#[derive(Debug, Clone)]
pub(crate) enum Stored {
    /// No document.
    Missing,
    /// Only a leader's claim, no position yet: loads as no checkpoint.
    Claimed {
        owner: Option<String>,
        epoch: Option<i64>,
    },
    /// A checkpoint that parses.
    Sound(Box<Checkpoint>),
    /// A document that does not parse (the message names the stream and the field).
    Corrupt(String),
}

/// A stream's checkpoint document, parsed with the runtime's own codec.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointFacts {
    pub(crate) stored: Stored,
    /// The document as stored.
    pub(crate) raw: Option<Document>,
    /// When it was last written (`updatedAt`) or claimed (`claimedAt`), whichever is later,
    /// even in a corrupt document when the field is a date.
    pub(crate) last_write: Option<DateTime>,
    /// Whether this tool wrote it last (a reset is no sign of a running stream).
    pub(crate) by_cli: bool,
}

impl CheckpointFacts {
    /// Parses a stored document (or its absence).
    pub(crate) fn of(raw: Option<Document>) -> CheckpointFacts {
        let Some(d) = raw else {
            return CheckpointFacts {
                stored: Stored::Missing,
                raw: None,
                last_write: None,
                by_cli: false,
            };
        };
        let date = |k: &str| match d.get(k) {
            Some(Bson::DateTime(t)) => Some(*t),
            _ => None,
        };
        let last_write = [date("updatedAt"), date(CLAIMED_AT)]
            .into_iter()
            .flatten()
            .max();
        let by_cli = d.get_str("owner").ok() == Some(CLI_OWNER) && !d.contains_key(CLAIMED_AT);
        let stored = if is_claim_only(&d) {
            Stored::Claimed {
                owner: d.get_str("owner").ok().map(str::to_owned),
                epoch: match d.get("epoch") {
                    Some(Bson::Int64(e)) => Some(*e),
                    Some(Bson::Int32(e)) => Some(i64::from(*e)),
                    _ => None,
                },
            }
        } else {
            match decode_checkpoint(&d) {
                Ok(cp) => Stored::Sound(Box::new(cp)),
                Err(e) => Stored::Corrupt(e.to_string()),
            }
        };
        CheckpointFacts {
            stored,
            raw: Some(d),
            last_write,
            by_cli,
        }
    }
}

/// Which of a stream's leases this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseKind {
    /// The leader lease of a `SingleLeader` stream (`_id` = the stream).
    Leader,
    /// The checkpoint guard of an `AllInstances` stream without instance identity.
    Guard,
}

impl LeaseKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Leader => "leader",
            Self::Guard => "checkpoint guard",
        }
    }
}

/// One lease document, parsed with [`LeaseDocument`], judged by the server's clock.
#[derive(Debug, Clone)]
pub(crate) struct LeaseFacts {
    pub(crate) name: String,
    pub(crate) kind: LeaseKind,
    pub(crate) lease: Result<LeaseDocument, String>,
    /// Held now by the server's clock (never for a corrupt document).
    pub(crate) held: bool,
}

impl LeaseFacts {
    pub(crate) fn of(d: &Document, clock: &ServerClock) -> LeaseFacts {
        let name = id_string(d);
        let kind = if name.ends_with(GUARD_SUFFIX) {
            LeaseKind::Guard
        } else {
            LeaseKind::Leader
        };
        let lease = LeaseDocument::from_document(d).map_err(|e| e.message);
        let held = lease.as_ref().is_ok_and(|l| l.is_held_at(clock.now));
        LeaseFacts {
            name,
            kind,
            lease,
            held,
        }
    }

    /// The stream this lease belongs to.
    pub(crate) fn stream(&self) -> &str {
        self.name
            .strip_suffix(GUARD_SUFFIX)
            .unwrap_or(self.name.as_str())
    }
}

/// Dead letters of a stream, by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DlqCounts {
    pub(crate) pending: u64,
    pub(crate) replayed: u64,
    pub(crate) discarded: u64,
}

/// Everything stored about one stream.
#[derive(Debug, Clone)]
pub(crate) struct StreamFacts {
    pub(crate) name: String,
    pub(crate) checkpoint: CheckpointFacts,
    pub(crate) leases: Vec<LeaseFacts>,
    pub(crate) dead_letters: DlqCounts,
    pub(crate) clock: ServerClock,
    pub(crate) stale_after: Duration,
}

impl StreamFacts {
    /// What shows the stream running: each held lease, and a checkpoint saved (or claimed)
    /// less than `stale_after` ago by the server's clock. Empty when it looks stopped.
    pub(crate) fn running_evidence(&self) -> Vec<String> {
        let mut why = Vec::new();
        for l in &self.leases {
            if let (true, Ok(lease)) = (l.held, &l.lease) {
                why.push(format!(
                    "its {} lease '{}' is held by '{}' (epoch {}) until {} ({} s from now by the server's clock)",
                    l.kind.as_str(),
                    l.name,
                    lease.owner,
                    lease.epoch,
                    date(lease.expires_at),
                    secs_between(self.clock.now, lease.expires_at)
                ));
            }
        }
        if let Some(at) = self
            .checkpoint
            .last_write
            .filter(|_| !self.checkpoint.by_cli)
        {
            let age = secs_between(at, self.clock.now);
            if age < i64::try_from(self.stale_after.as_secs()).unwrap_or(i64::MAX) {
                why.push(format!(
                    "its checkpoint was saved {age} s ago ({}), less than --stale-after {} s",
                    date(at),
                    self.stale_after.as_secs()
                ));
            }
        }
        why
    }
}

/// Whole seconds from `a` to `b` (negative when `b` is earlier).
pub(crate) fn secs_between(a: DateTime, b: DateTime) -> i64 {
    (b.timestamp_millis() - a.timestamp_millis()).div_euclid(1000)
}

/// `_id` as a name (a non-string `_id` in its extended-JSON form).
pub(crate) fn id_string(d: &Document) -> String {
    match d.get("_id") {
        Some(Bson::String(s)) => s.clone(),
        Some(other) => other.clone().into_relaxed_extjson().to_string(),
        None => String::new(),
    }
}

/// Dead-letter counts by stream (of one stream when `stream` is given).
pub(crate) async fn dlq_counts(
    conn: &Conn,
    stream: Option<&str>,
) -> Result<BTreeMap<String, DlqCounts>, CliError> {
    let mut counts: BTreeMap<String, DlqCounts> = BTreeMap::new();
    for status in [
        DeadLetterStatus::Pending,
        DeadLetterStatus::Replayed,
        DeadLetterStatus::Discarded,
    ] {
        let mut filter = doc! { "status": status.as_str() };
        if let Some(s) = stream {
            filter.insert("stream", s);
        }
        let pipeline = [
            doc! { "$match": filter },
            doc! { "$group": { "_id": "$stream", "n": { "$sum": 1 } } },
        ];
        let groups: Vec<Document> = conn
            .dead_letters()
            .aggregate(pipeline)
            .await
            .map_err(|e| CliError::driver("counting dead letters", &e))?
            .try_collect()
            .await
            .map_err(|e| CliError::driver("counting dead letters", &e))?;
        for g in groups {
            let Some(Bson::String(name)) = g.get("_id") else {
                continue;
            };
            let n = match g.get("n") {
                Some(Bson::Int32(n)) => u64::try_from(*n).unwrap_or(0),
                Some(Bson::Int64(n)) => u64::try_from(*n).unwrap_or(0),
                _ => 0,
            };
            let c = counts.entry(name.clone()).or_default();
            match status {
                DeadLetterStatus::Pending => c.pending = n,
                DeadLetterStatus::Replayed => c.replayed = n,
                DeadLetterStatus::Discarded => c.discarded = n,
            }
        }
    }
    Ok(counts)
}

async fn all(conn: &Conn, coll: &str, filter: Document) -> Result<Vec<Document>, CliError> {
    let what = format!("reading {}.{coll}", conn.database());
    conn.db
        .collection::<Document>(coll)
        .find(filter)
        .sort(doc! { "_id": 1 })
        .await
        .map_err(|e| CliError::driver(&what, &e))?
        .try_collect()
        .await
        .map_err(|e| CliError::driver(&what, &e))
}

/// Everything stored about the stream (or checkpoint) `name`: its checkpoint, its leases
/// `name` and `name#checkpoint`, its dead letters.
pub(crate) async fn stream_facts(
    conn: &Conn,
    g: &GlobalArgs,
    name: &str,
) -> Result<StreamFacts, CliError> {
    let clock = conn.clock().await?;
    let raw = conn
        .checkpoints()
        .find_one(doc! { "_id": name })
        .await
        .map_err(|e| CliError::driver(&format!("reading the checkpoint of '{name}'"), &e))?;
    let guard = format!("{name}{GUARD_SUFFIX}");
    let leases = all(
        conn,
        crate::LOCKS,
        doc! { "_id": { "$in": [name, guard.as_str()] } },
    )
    .await?
    .iter()
    .map(|d| LeaseFacts::of(d, &clock))
    .collect();
    let dead_letters = dlq_counts(conn, Some(name))
        .await?
        .remove(name)
        .unwrap_or_default();
    Ok(StreamFacts {
        name: name.to_owned(),
        checkpoint: CheckpointFacts::of(raw),
        leases,
        dead_letters,
        clock,
        stale_after: g.stale_after(),
    })
}

/// `flowwarden streams`.
pub(crate) async fn streams(conn: &Conn, g: &GlobalArgs) -> Result<Report, CliError> {
    let clock = conn.clock().await?;
    let mut by_name: BTreeMap<String, StreamFacts> = BTreeMap::new();
    let blank = |name: &str| StreamFacts {
        name: name.to_owned(),
        checkpoint: CheckpointFacts::of(None),
        leases: Vec::new(),
        dead_letters: DlqCounts::default(),
        clock,
        stale_after: g.stale_after(),
    };
    for d in all(conn, crate::CHECKPOINTS, doc! {}).await? {
        let name = id_string(&d);
        by_name
            .entry(name.clone())
            .or_insert_with(|| blank(&name))
            .checkpoint = CheckpointFacts::of(Some(d));
    }
    for d in all(conn, crate::LOCKS, doc! {}).await? {
        let lease = LeaseFacts::of(&d, &clock);
        let stream = lease.stream().to_owned();
        by_name
            .entry(stream.clone())
            .or_insert_with(|| blank(&stream))
            .leases
            .push(lease);
    }
    for (stream, counts) in dlq_counts(conn, None).await? {
        by_name
            .entry(stream.clone())
            .or_insert_with(|| blank(&stream))
            .dead_letters = counts;
    }
    Ok(Kind::Streams {
        database: conn.database().to_owned(),
        server_time: date(clock.now),
        streams: by_name.values().map(CheckpointView::of).collect(),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(ms: i64) -> ServerClock {
        ServerClock {
            now: DateTime::from_millis(ms),
            operation_time: None,
        }
    }

    #[test]
    fn evidence_of_running() {
        let lease = LeaseDocument {
            stream: "s#checkpoint".into(),
            owner: "host-1".into(),
            epoch: 2,
            expires_at: DateTime::from_millis(100_000),
        };
        let mut f = StreamFacts {
            name: "s".into(),
            checkpoint: CheckpointFacts::of(Some(doc! {
                "_id": "s", "v": 1, "updatedAt": DateTime::from_millis(50_000)
            })),
            leases: vec![LeaseFacts::of(&lease.to_document(), &clock(90_000))],
            dead_letters: DlqCounts::default(),
            clock: clock(90_000),
            stale_after: Duration::from_secs(60),
        };
        assert_eq!(f.leases[0].stream(), "s");
        assert_eq!(f.leases[0].kind, LeaseKind::Guard);
        let why = f.running_evidence();
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(why[0].contains("host-1") && why[0].contains("10 s from now"));
        assert!(why[1].contains("40 s ago"));
        // Expired lease, old save: stopped.
        f.clock = clock(200_000);
        f.leases = vec![LeaseFacts::of(&lease.to_document(), &f.clock)];
        assert!(f.running_evidence().is_empty());
    }

    #[test]
    fn a_reset_by_the_tool_is_not_a_sign_of_running() {
        let f = CheckpointFacts::of(Some(doc! {
            "_id": "s", "v": 1, "owner": CLI_OWNER, "updatedAt": DateTime::from_millis(1)
        }));
        assert!(f.by_cli);
        assert!(matches!(f.stored, Stored::Sound(_)));
        let claimed = CheckpointFacts::of(Some(doc! {
            "_id": "s", "owner": "h", "epoch": 3_i64, CLAIMED_AT: DateTime::from_millis(7)
        }));
        assert!(matches!(
            claimed.stored,
            Stored::Claimed { epoch: Some(3), .. }
        ));
        assert_eq!(claimed.last_write, Some(DateTime::from_millis(7)));
        let corrupt = CheckpointFacts::of(Some(doc! {"_id": "s", "lastSeenToken": "x"}));
        assert!(matches!(corrupt.stored, Stored::Corrupt(m) if m.contains("lastSeenToken")));
    }
}
