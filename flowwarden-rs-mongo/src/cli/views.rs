//! The serializable views of what the commands found: the `--json` output, and what the text
//! output is rendered from. Times are RFC 3339; BSON values (tokens, events, raw documents) are
//! relaxed extended JSON.

use bson::{Bson, DateTime, Document, Timestamp};
use flowwarden::port::{Checkpoint, DeadLetterRecord, StoredPosition};
use serde::Serialize;
use serde_json::Value;

use super::connect::ServerClock;
use super::facts::{secs_between, LeaseFacts, Stored, StreamFacts};
use super::position::Gap;

/// A date as RFC 3339 (milliseconds since the epoch when out of range).
pub(crate) fn date(d: DateTime) -> String {
    d.try_to_rfc3339_string()
        .unwrap_or_else(|_| d.timestamp_millis().to_string())
}

/// A document as relaxed extended JSON.
pub(crate) fn extjson(d: Document) -> Value {
    Bson::Document(d).into_relaxed_extjson()
}

/// A cluster time: its two parts and its second as a date.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TimeView {
    pub(crate) t: u32,
    pub(crate) i: u32,
    pub(crate) time: String,
}

impl TimeView {
    pub(crate) fn of(ts: Timestamp) -> TimeView {
        TimeView {
            t: ts.time,
            i: ts.increment,
            time: date(DateTime::from_millis(i64::from(ts.time) * 1000)),
        }
    }
}

/// A stored position.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PositionView {
    pub(crate) token: Value,
    pub(crate) cluster_time: Option<TimeView>,
    pub(crate) wall_time: Option<String>,
    pub(crate) start_after: bool,
}

impl PositionView {
    pub(crate) fn of(p: &StoredPosition) -> PositionView {
        PositionView {
            token: extjson(p.token.as_document().clone()),
            cluster_time: p.cluster_time.map(TimeView::of),
            wall_time: p.wall_time.map(date),
            start_after: p.start_after,
        }
    }
}

/// A checkpoint's two positions.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PositionsView {
    pub(crate) last_processed: Option<PositionView>,
    pub(crate) last_seen: Option<PositionView>,
}

/// A stream's checkpoint as found.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckpointState {
    /// `sound`, `claimed` (a leader's claim, no position yet), `missing` or `corrupt`.
    pub(crate) state: &'static str,
    /// Why it does not parse, and the runbook.
    pub(crate) error: Option<String>,
    pub(crate) last_processed: Option<PositionView>,
    pub(crate) last_seen: Option<PositionView>,
    pub(crate) owner: Option<String>,
    pub(crate) epoch: Option<i64>,
    /// When it was last written or claimed.
    pub(crate) saved_at: Option<String>,
    /// How long ago, by the server's clock.
    pub(crate) saved_secs_ago: Option<i64>,
}

/// A lease as found.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LeaseView {
    pub(crate) name: String,
    /// `leader` or `checkpoint guard`.
    pub(crate) kind: &'static str,
    pub(crate) owner: Option<String>,
    pub(crate) epoch: Option<i64>,
    pub(crate) expires_at: Option<String>,
    /// Held now, by the server's clock.
    pub(crate) held: bool,
    /// Seconds until it expires (negative: since it expired).
    pub(crate) expires_in_secs: Option<i64>,
    /// Why the document does not parse.
    pub(crate) error: Option<String>,
}

impl LeaseView {
    pub(crate) fn of(l: &LeaseFacts, clock: &ServerClock) -> LeaseView {
        let ok = l.lease.as_ref().ok();
        LeaseView {
            name: l.name.clone(),
            kind: l.kind.as_str(),
            owner: ok.map(|l| l.owner.clone()),
            epoch: ok.map(|l| l.epoch),
            expires_at: ok.map(|l| date(l.expires_at)),
            held: l.held,
            expires_in_secs: ok.map(|l| secs_between(clock.now, l.expires_at)),
            error: l.lease.as_ref().err().cloned(),
        }
    }
}

/// Dead-letter counts.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CountsView {
    pub(crate) pending: u64,
    pub(crate) replayed: u64,
    pub(crate) discarded: u64,
}

/// Everything about one stream (`streams` entries, `checkpoint show`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckpointView {
    pub(crate) name: String,
    pub(crate) checkpoint: CheckpointState,
    pub(crate) leases: Vec<LeaseView>,
    pub(crate) dead_letters: CountsView,
    /// Whether a held lease or a recent save shows it running.
    pub(crate) running: bool,
    pub(crate) running_evidence: Vec<String>,
    pub(crate) server_time: String,
}

impl CheckpointView {
    pub(crate) fn of(f: &StreamFacts) -> CheckpointView {
        let none = CheckpointState {
            state: "missing",
            error: None,
            last_processed: None,
            last_seen: None,
            owner: None,
            epoch: None,
            saved_at: f.checkpoint.last_write.map(date),
            saved_secs_ago: f
                .checkpoint
                .last_write
                .map(|t| secs_between(t, f.clock.now)),
        };
        let checkpoint = match &f.checkpoint.stored {
            Stored::Missing => none,
            Stored::Claimed { owner, epoch } => CheckpointState {
                state: "claimed",
                owner: owner.clone(),
                epoch: *epoch,
                ..none
            },
            Stored::Sound(cp) => {
                let p = CheckpointView::positions(cp);
                CheckpointState {
                    state: "sound",
                    last_processed: p.last_processed,
                    last_seen: p.last_seen,
                    owner: cp.owner.clone(),
                    epoch: cp.epoch,
                    ..none
                }
            }
            Stored::Corrupt(m) => CheckpointState {
                state: "corrupt",
                error: Some(format!(
                    "{m}; see {}",
                    super::error::CORRUPT_CHECKPOINT_RUNBOOK
                )),
                ..none
            },
        };
        let running_evidence = f.running_evidence();
        CheckpointView {
            name: f.name.clone(),
            checkpoint,
            leases: f
                .leases
                .iter()
                .map(|l| LeaseView::of(l, &f.clock))
                .collect(),
            dead_letters: CountsView {
                pending: f.dead_letters.pending,
                replayed: f.dead_letters.replayed,
                discarded: f.dead_letters.discarded,
            },
            running: !running_evidence.is_empty(),
            running_evidence,
            server_time: date(f.clock.now),
        }
    }

    pub(crate) fn positions(cp: &Checkpoint) -> PositionsView {
        PositionsView {
            last_processed: cp.last_processed.as_ref().map(PositionView::of),
            last_seen: cp.last_seen.as_ref().map(PositionView::of),
        }
    }
}

/// What `checkpoint reset` did.
#[derive(Debug, Clone)]
pub(crate) struct ResetReport {
    pub(crate) stream: String,
    /// The document before (as stored).
    pub(crate) old: Option<Document>,
    /// Its positions, when it parsed.
    pub(crate) old_view: Option<PositionsView>,
    /// `now`, `time` or `token`.
    pub(crate) mode: &'static str,
    pub(crate) new: StoredPosition,
    /// Where the stream resumes, in words.
    pub(crate) resumes: String,
    pub(crate) gaps: Vec<Gap>,
    pub(crate) notes: Vec<String>,
    pub(crate) forced: bool,
}

impl ResetReport {
    pub(crate) fn to_json(&self) -> Value {
        serde_json::json!({
            "stream": self.stream,
            "mode": self.mode,
            "forced": self.forced,
            "old": self.old.clone().map(extjson),
            "old_positions": self.old_view,
            "new": PositionView::of(&self.new),
            "resumes": self.resumes,
            "gaps": self.gaps,
            "notes": self.notes,
        })
    }
}

/// A dead-letter record.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RecordView {
    pub(crate) id: String,
    pub(crate) stream: String,
    pub(crate) status: &'static str,
    pub(crate) operation_type: String,
    pub(crate) document_key: Option<Value>,
    pub(crate) token: Value,
    pub(crate) error_kind: String,
    pub(crate) error_chain: Vec<String>,
    pub(crate) attempts: u32,
    pub(crate) first_failed_at: String,
    pub(crate) last_failed_at: String,
    pub(crate) truncated: bool,
    pub(crate) owner: Option<String>,
    pub(crate) epoch: Option<i64>,
    pub(crate) event: Value,
}

impl RecordView {
    pub(crate) fn of(r: &DeadLetterRecord) -> RecordView {
        RecordView {
            id: r.id.clone(),
            stream: r.stream.clone(),
            status: r.status.as_str(),
            operation_type: r.operation_type.clone(),
            document_key: r.document_key.clone().map(extjson),
            token: extjson(r.token.as_document().clone()),
            error_kind: r.error_kind.clone(),
            error_chain: r.error_chain.clone(),
            attempts: r.attempts,
            first_failed_at: date(r.first_failed_at),
            last_failed_at: date(r.last_failed_at),
            truncated: r.truncated,
            owner: r.owner.clone(),
            epoch: r.epoch,
            event: extjson(r.event.clone()),
        }
    }
}
