//! The checkpoint a stream persists (the FlowWarden pair of tokens) and the store it lives in.

use async_trait::async_trait;
use bson::{Bson, DateTime, Timestamp};

use super::lease::Fence;
use super::store_error::StoreError;
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

impl StoredPosition {
    /// The same position with a token that does not keep its event alive (see
    /// [`ResumeToken`]): for a position kept for long.
    pub(crate) fn detached(&self) -> Self {
        Self {
            token: self.token.detached(),
            ..self.clone()
        }
    }
}

/// The progress of an unfinished initial snapshot (`start_position = Snapshot`), stored in the
/// stream's checkpoint until the scan is complete, so a restart continues the scan where it
/// stopped instead of reading the collection again or starting at "now".
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotProgress {
    /// The change-stream position recorded before the scan began: once the scan is complete
    /// the stream resumes after it, so every change made during the scan is delivered.
    pub start: StoredPosition,
    /// The `_id` of the last document the scan settled; `None` before the first.
    pub last_id: Option<Bson>,
    /// Documents the scan has settled so far (handled, filtered out or dead-lettered).
    pub scanned: u64,
    /// When the scan began.
    pub started_at: DateTime,
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
    /// An initial snapshot still in progress; while it is set, the stream continues the scan
    /// before it streams, and the two tokens are not used.
    pub snapshot: Option<SnapshotProgress>,
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

impl Checkpoint {
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

/// Where checkpoints live (`_fw_checkpoints` on MongoDB).
#[async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// The stored checkpoint of `stream`, if any. A stored document that does not parse is a
    /// [`crate::port::StoreErrorKind::Corrupt`] error naming the stream and the field.
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError>;

    /// Writes `checkpoint` (one conditional write on real stores). A checkpoint that carries an
    /// epoch is written only while no newer epoch has claimed or written `checkpoint.stream`;
    /// otherwise the write is a [`crate::port::StoreErrorKind::Fenced`] error.
    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError>;

    /// Claims the checkpoint of `key` for a leader that has just taken the lease with `fence`,
    /// before it loads the checkpoint: from then on, writes carrying an older epoch are
    /// rejected, so a deposed leader that wakes up can never move the checkpoint behind the new
    /// leader's back. One conditional write; [`crate::port::StoreErrorKind::Fenced`] when a newer
    /// epoch has claimed it already. A claim alone is no checkpoint: `load` still returns what
    /// was stored before, or `None`.
    async fn claim(&self, key: &str, fence: &Fence) -> Result<(), StoreError>;
}
