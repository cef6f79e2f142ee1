//! What every case uses: the case context, the failure type, and helpers to read cursors and
//! build checkpoints and dead-letter records.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, DateTime, Document, Timestamp};
use flowwarden::port::{
    ChangeCursor, Checkpoint, CheckpointStore, DeadLetterRecord, DeadLetterStatus, DeadLetterStore,
    Fence, Lease, LeaseStore, SourceItem, StartAt, StoredPosition, WatchSpec,
};
use flowwarden::{Backend, FullDocument, FullDocumentBeforeChange, ResumeToken};

use super::target::{ConformanceTarget, Fresh};

/// Why a case did not pass.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A check failed.
    Failed(String),
    /// The case cannot run on this target.
    NotApplicable(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Failure::Failed(s)
    }
}

/// What a case returns.
pub(crate) type CaseResult = Result<(), Failure>;

/// `Result<T, E: Display>` into a case failure naming the step.
pub(crate) trait Step<T> {
    /// The value, or a failure `"<what>: <error>"`.
    fn step(self, what: &str) -> Result<T, Failure>;
}

impl<T, E: Display> Step<T> for Result<T, E> {
    fn step(self, what: &str) -> Result<T, Failure> {
        self.map_err(|e| Failure::Failed(format!("{what}: {e}")))
    }
}

/// Fails the case with a message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::conformance::support::Failure::Failed(format!($($msg)+)));
        }
    };
}

/// Fails the case unless `left == right`, showing both.
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($msg:tt)+) => {{
        let (l, r) = (&$left, &$right);
        if l != r {
            return Err($crate::conformance::support::Failure::Failed(format!(
                "{}: expected {:?}, found {:?}",
                format!($($msg)+),
                r,
                l
            )));
        }
    }};
}

pub(crate) use {ensure, ensure_eq};

/// A lease TTL short enough to wait out in a case.
pub(crate) const SHORT_TTL: Duration = Duration::from_millis(250);
/// A wait after which a lease taken with [`SHORT_TTL`] has expired by any store's clock.
pub(crate) const PAST_SHORT_TTL: Duration = Duration::from_millis(400);
/// A lease TTL no case outlives.
pub(crate) const LONG_TTL: Duration = Duration::from_secs(30);
/// How long a cursor read may take before the case fails.
const READ_BOUND: Duration = Duration::from_secs(10);
/// The collection the source cases write to.
pub(crate) const COLL: &str = "conformance_events";

/// The context of one case: the target and one fresh instance of it.
pub(crate) struct Cx<'a, T: ConformanceTarget> {
    pub(crate) target: &'a T,
    pub(crate) backend: Backend,
    pub(crate) env: T::Env,
}

impl<'a, T: ConformanceTarget> Cx<'a, T> {
    pub(crate) fn new(target: &'a T, fresh: Fresh<T::Env>) -> Self {
        Self {
            target,
            backend: fresh.backend,
            env: fresh.env,
        }
    }

    /// The checkpoint store.
    pub(crate) fn checkpoints(&self) -> &dyn CheckpointStore {
        &*self.backend.checkpoints
    }

    /// The lease store, or not applicable.
    pub(crate) fn leases(&self) -> Result<Arc<dyn LeaseStore>, Failure> {
        self.backend.leases.clone().ok_or_else(|| {
            Failure::NotApplicable(
                "the backend has no lease store (`Backend::leases` is None)".into(),
            )
        })
    }

    /// The dead-letter store, or not applicable.
    pub(crate) fn dead_letters(&self) -> Result<Arc<dyn DeadLetterStore>, Failure> {
        self.backend.dead_letters.clone().ok_or_else(|| {
            Failure::NotApplicable(
                "the backend has no dead-letter store (`Backend::dead_letters` is None)".into(),
            )
        })
    }

    /// Inserts `{_id: id, n: id}` into [`COLL`] of the default database.
    pub(crate) async fn insert(&self, id: i32) -> CaseResult {
        self.target
            .insert(
                &self.env,
                &self.backend.default_database,
                COLL,
                doc! { "_id": id, "n": id },
            )
            .await
            .step(&format!("target.insert(_id {id})"))
    }

    /// Inserts each id in order.
    pub(crate) async fn insert_all(&self, ids: impl IntoIterator<Item = i32>) -> CaseResult {
        for id in ids {
            self.insert(id).await?;
        }
        Ok(())
    }

    /// Sets `n` of document `id`.
    pub(crate) async fn update(&self, id: i32, n: i32) -> CaseResult {
        self.target
            .update(
                &self.env,
                &self.backend.default_database,
                COLL,
                doc! { "_id": id },
                doc! { "$set": { "n": n } },
            )
            .await
            .step(&format!("target.update(_id {id})"))
    }

    /// Deletes document `id`.
    pub(crate) async fn delete(&self, id: i32) -> CaseResult {
        self.target
            .delete(
                &self.env,
                &self.backend.default_database,
                COLL,
                doc! { "_id": id },
            )
            .await
            .step(&format!("target.delete(_id {id})"))
    }

    /// The watch spec of [`COLL`].
    pub(crate) fn spec(&self) -> WatchSpec {
        WatchSpec {
            stream: "conformance",
            database: Some(self.backend.default_database.clone()),
            collection: COLL.to_owned(),
            pipeline: Vec::new(),
            full_document: FullDocument::Default,
            full_document_before_change: FullDocumentBeforeChange::Off,
            batch_size: 100,
            max_await: Duration::from_millis(100),
        }
    }

    /// Opens a cursor on [`COLL`] at `at`.
    pub(crate) async fn open(&self, at: StartAt) -> Result<Box<dyn ChangeCursor>, Failure> {
        let what = format!("open at {at}");
        match tokio::time::timeout(READ_BOUND, self.backend.source.open(&self.spec(), at)).await {
            Ok(r) => r.step(&what),
            Err(_) => Err(Failure::Failed(format!(
                "{what}: no answer within {READ_BOUND:?}"
            ))),
        }
    }
}

/// The next event of `cursor`, skipping idle ticks; fails when the cursor errs, closes, or
/// stays idle for [`READ_BOUND`].
pub(crate) async fn next_event(
    cursor: &mut Box<dyn ChangeCursor>,
    what: &str,
) -> Result<Document, Failure> {
    let deadline = tokio::time::Instant::now() + READ_BOUND;
    loop {
        let read = tokio::time::timeout_at(deadline, cursor.next()).await;
        match read {
            Err(_) => {
                return Err(Failure::Failed(format!(
                    "{what}: no event within {READ_BOUND:?}"
                )))
            }
            Ok(Err(e)) => return Err(Failure::Failed(format!("{what}: read failed: {e}"))),
            Ok(Ok(None)) => {
                return Err(Failure::Failed(format!(
                    "{what}: the cursor closed while an event was expected"
                )))
            }
            Ok(Ok(Some(SourceItem::Idle(_)))) => continue,
            Ok(Ok(Some(item))) => return event_of(item, what),
        }
    }
}

/// The event an item read from a cursor carries, decoded when the source handed it over
/// still encoded; fails on bytes that are not BSON and on an idle tick.
pub(crate) fn event_of(item: SourceItem, what: &str) -> Result<Document, Failure> {
    match item.decode() {
        Ok(SourceItem::Event(e)) => Ok(e),
        Ok(other) => Err(Failure::Failed(format!(
            "{what}: expected an event, read {other:?}"
        ))),
        Err(e) => Err(Failure::Failed(format!(
            "{what}: the source handed over an event that is not valid BSON: {e}"
        ))),
    }
}

/// One event as the source cases compare it: operation type, `documentKey._id`, token.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Seen {
    pub(crate) op: String,
    pub(crate) key: Option<Bson>,
    pub(crate) token: ResumeToken,
}

/// What [`Seen`] an event is; fails when it has no `_id` token.
pub(crate) fn seen(event: &Document) -> Result<Seen, Failure> {
    let token = event
        .get_document("_id")
        .map_err(|_| Failure::Failed(format!("event without an `_id` token: {event}")))?;
    Ok(Seen {
        op: event.get_str("operationType").unwrap_or("").to_owned(),
        key: event
            .get_document("documentKey")
            .ok()
            .and_then(|k| k.get("_id").cloned()),
        token: ResumeToken::from_document(token.clone()),
    })
}

/// Reads `n` events and returns what they are.
pub(crate) async fn read_n(
    cursor: &mut Box<dyn ChangeCursor>,
    n: usize,
    what: &str,
) -> Result<Vec<Seen>, Failure> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let e = next_event(cursor, &format!("{what} (event {} of {n})", i + 1)).await?;
        out.push(seen(&e)?);
    }
    Ok(out)
}

/// `(operation, key)` pairs of events, for comparing against what was written.
pub(crate) fn ops(events: &[Seen]) -> Vec<(String, Option<Bson>)> {
    events
        .iter()
        .map(|e| (e.op.clone(), e.key.clone()))
        .collect()
}

/// `(operation, Some(Int32(id)))` for each id.
pub(crate) fn expected(op: &str, ids: &[i32]) -> Vec<(String, Option<Bson>)> {
    ids.iter()
        .map(|i| (op.to_owned(), Some(Bson::Int32(*i))))
        .collect()
}

/// A token in the server's shape, distinct per `n`.
pub(crate) fn token(n: u32) -> ResumeToken {
    ResumeToken::from_document(doc! { "_data": format!("82C0FFEE{n:08X}") })
}

/// A checkpoint of `key` whose positions are made from `n`, written by `fence` (or unfenced).
pub(crate) fn checkpoint(key: &str, n: u32, fence: Option<&Lease>) -> Checkpoint {
    Checkpoint {
        stream: key.to_owned(),
        last_processed: Some(StoredPosition {
            token: token(n),
            cluster_time: Some(Timestamp {
                time: 1_700_000_000 + n,
                increment: 1,
            }),
            wall_time: Some(DateTime::from_millis(1_700_000_000_000 + i64::from(n))),
            start_after: false,
        }),
        last_seen: Some(StoredPosition {
            token: token(n + 1),
            cluster_time: None,
            wall_time: None,
            start_after: true,
        }),
        owner: fence.map(|l| l.owner.clone()),
        epoch: fence.map(|l| l.epoch),
        updated_at: DateTime::from_millis(1_700_000_100_000 + i64::from(n)),
        snapshot: None,
    }
}

/// The positions of a checkpoint (what a claim must never change).
pub(crate) fn positions(cp: &Checkpoint) -> (Option<StoredPosition>, Option<StoredPosition>) {
    (cp.last_processed.clone(), cp.last_seen.clone())
}

/// The fence a leader holding `lease` attaches to its writes.
pub(crate) fn fence(lease: &Lease) -> Fence {
    Fence {
        owner: lease.owner.clone(),
        epoch: lease.epoch,
    }
}

/// A pending, unfenced dead-letter record of `stream` for the event with token `n`.
pub(crate) fn dead_letter(stream: &str, n: u32, first_ms: i64) -> DeadLetterRecord {
    let token = token(n);
    DeadLetterRecord {
        id: DeadLetterRecord::id_for(stream, &token),
        stream: stream.to_owned(),
        event: doc! {
            "_id": token.as_document().clone(),
            "operationType": "insert",
            "ns": { "db": "app", "coll": "orders" },
            "documentKey": { "_id": n },
            "fullDocument": { "_id": n, "n": n },
        },
        truncated: false,
        token,
        operation_type: "insert".into(),
        document_key: Some(doc! { "_id": n }),
        error_chain: vec!["handler failed".into(), "caused by: boom".into()],
        error_kind: "Failed".into(),
        attempts: 3,
        first_failed_at: DateTime::from_millis(first_ms),
        last_failed_at: DateTime::from_millis(first_ms + 10),
        status: DeadLetterStatus::Pending,
        owner: None,
        epoch: None,
    }
}

/// Takes the lease of `name` for `owner` or fails the case.
pub(crate) async fn acquire(
    leases: &dyn LeaseStore,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Lease, Failure> {
    match leases.try_acquire(name, owner, ttl).await {
        Ok(Some(l)) => Ok(l),
        Ok(None) => Err(Failure::Failed(format!(
            "try_acquire('{name}', '{owner}') was refused where the lease is free"
        ))),
        Err(e) => Err(Failure::Failed(format!(
            "try_acquire('{name}', '{owner}'): {e}"
        ))),
    }
}

/// Hands the lease of `name` from `old` (taken with [`SHORT_TTL`]) to `new_owner` by letting
/// it expire; fails unless the new epoch is higher.
pub(crate) async fn take_over(
    leases: &dyn LeaseStore,
    old: &Lease,
    new_owner: &str,
) -> Result<Lease, Failure> {
    tokio::time::sleep(PAST_SHORT_TTL).await;
    let new = acquire(leases, &old.stream, new_owner, LONG_TTL).await?;
    ensure!(
        new.epoch > old.epoch,
        "after '{}' (epoch {}) expired, '{new_owner}' acquired epoch {}: not higher",
        old.owner,
        old.epoch,
        new.epoch
    );
    Ok(new)
}
