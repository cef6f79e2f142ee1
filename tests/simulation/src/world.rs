//! The ground truth of one run and the recording wrappers that feed it.
//!
//! The harness records every committed change (sequence number, key, whether the pipeline
//! rejects it); the handler records every invocation and success; the wrappers around the
//! in-memory backend's source, checkpoint store and dead-letter store record every open,
//! delivery, checkpoint write and dead letter. Invariants 2, 3 and 4 are checked at the
//! instant the runtime acts; 1 and 5 at the end of the run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bson::{Bson, Document};
use flowwarden::dead_letter::PutOutcome;
use flowwarden::{
    ChangeContext, ChangeCursor, ChangeSource, Checkpoint, CheckpointStore, DeadLetterQuery,
    DeadLetterRecord, DeadLetterStatus, DeadLetterStore, ErrorAction, HandlerError, HandlerFuture,
    MemoryBackend, ResumeToken, RuntimeHandle, SourceError, SourceItem, StartAt, StoreError,
    StreamDefinition, StreamHandler, WatchSpec,
};
use serde::Deserialize;
use tokio::time::Instant;

use crate::rng::mix;
use crate::schedule::{FilterKind, PipelineKind, Settings};
use crate::{Invariant, Stats, Violation};

/// The operation of a committed change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Insert,
    Update,
    Replace,
    Delete,
    Drop,
}

/// One committed change, as the harness wrote it.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) seq: u64,
    pub(crate) key: Option<i32>,
    pub(crate) op: Op,
    pub(crate) status: Option<&'static str>,
    /// The server-side pipeline drops it: it is never delivered.
    pub(crate) pipeline_rejects: bool,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.key {
            Some(k) => match self.status {
                Some(st) => write!(f, "#{} {:?} k{} status={st}", self.seq, self.op, k),
                None => write!(f, "#{} {:?} k{}", self.seq, self.op, k),
            },
            None => write!(f, "#{} {:?}", self.seq, self.op),
        }
    }
}

/// How a change was settled (first settlement only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    Handled,
    DeadLettered,
    Filtered,
    Unrouted,
}

/// The sequence number of an in-memory oplog token (`{_data: "%016X"}`, invalidate `..FF`).
pub(crate) fn token_seq(t: &ResumeToken) -> Option<u64> {
    let d = t.data()?;
    u64::from_str_radix(d.get(..16)?, 16).ok()
}

fn event_seq(raw: &Document) -> Option<u64> {
    let id = raw.get_document("_id").ok()?;
    token_seq(&ResumeToken::from_document(id.clone()))
}

/// Everything recorded during one run.
pub(crate) struct WorldState {
    pub(crate) t0: Instant,
    pub(crate) seed: u64,
    pub(crate) settings: Settings,
    pub(crate) changes: BTreeMap<u64, Change>,
    /// Head of the oplog when the stream first opened: changes after it are checked.
    pub(crate) start_seq: Option<u64>,
    pub(crate) settled: BTreeMap<u64, Settle>,
    /// Changes inside a gap the runtime reported (history lost, accepted by policy).
    pub(crate) gap: BTreeSet<u64>,
    /// Per change: successful invocations.
    pub(crate) successes: BTreeMap<u64, u32>,
    /// Per change: how many times a cursor delivered it (the only source of repeats).
    pub(crate) deliveries: BTreeMap<u64, u32>,
    pub(crate) calls: BTreeMap<u64, u32>,
    pub(crate) handle: Option<RuntimeHandle>,
    /// History-lost counts of finished runtimes, plus how many were turned into gaps.
    pub(crate) history_lost_finished: u64,
    pub(crate) history_lost_accounted: u64,
    pub(crate) trace: Vec<String>,
    pub(crate) violations: Vec<Violation>,
    pub(crate) stats: Stats,
}

/// Shared, lockable run state.
pub(crate) struct World {
    state: Mutex<WorldState>,
}

impl World {
    pub(crate) fn new(seed: u64, settings: Settings) -> Arc<World> {
        Arc::new(World {
            state: Mutex::new(WorldState {
                t0: Instant::now(),
                seed,
                settings,
                changes: BTreeMap::new(),
                start_seq: None,
                settled: BTreeMap::new(),
                gap: BTreeSet::new(),
                successes: BTreeMap::new(),
                deliveries: BTreeMap::new(),
                calls: BTreeMap::new(),
                handle: None,
                history_lost_finished: 0,
                history_lost_accounted: 0,
                trace: Vec::new(),
                violations: Vec::new(),
                stats: Stats::default(),
            }),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, WorldState> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

impl WorldState {
    /// Appends a line to the trace, stamped with virtual time.
    pub(crate) fn log(&mut self, msg: impl AsRef<str>) {
        let ms = self.t0.elapsed().as_millis();
        self.trace.push(format!("{ms:>8}ms  {}", msg.as_ref()));
    }

    pub(crate) fn violate(&mut self, invariant: Invariant, message: String) {
        self.log(format!("!! VIOLATION {invariant}: {message}"));
        let at = self.trace.len() - 1;
        if self.violations.len() < 20 {
            self.violations.push(Violation {
                invariant,
                seed: self.seed,
                message,
                trace_index: at,
            });
        }
    }

    /// Whether a change is settled, or excused by a reported gap, or never delivered.
    pub(crate) fn accounted(&self, c: &Change) -> bool {
        c.pipeline_rejects || self.settled.contains_key(&c.seq) || self.gap.contains(&c.seq)
    }

    /// Checked changes (after the start position) in `..=upto`.
    pub(crate) fn checked_changes(&self, upto: u64) -> impl Iterator<Item = &Change> {
        let lo = self.start_seq.map(|s| s + 1).unwrap_or(u64::MAX);
        self.changes
            .range(lo..)
            .take_while(move |(s, _)| **s <= upto)
            .map(|(_, c)| c)
    }

    fn settle(&mut self, seq: u64, how: Settle) {
        self.settled.entry(seq).or_insert(how);
    }

    /// Records a committed change.
    pub(crate) fn commit(
        &mut self,
        seq: u64,
        key: Option<i32>,
        op: Op,
        status: Option<&'static str>,
    ) {
        let pipeline_rejects = match self.settings.pipeline {
            PipelineKind::None => false,
            PipelineKind::NoDeletes => op == Op::Delete,
            PipelineKind::NotKey(k) => key == Some(k),
            PipelineKind::NotHidden => {
                matches!(op, Op::Insert | Op::Replace) && status == Some("hidden")
            }
        };
        let c = Change {
            seq,
            key,
            op,
            status,
            pipeline_rejects,
        };
        self.log(format!(
            "commit {c}{}",
            if pipeline_rejects {
                " (pipeline rejects)"
            } else {
                ""
            }
        ));
        self.stats.changes += 1;
        self.changes.insert(seq, c);
    }

    /// Invariant 2, at the instant a checkpoint is written.
    fn check_checkpoint(&mut self, cp: &Checkpoint) {
        for (label, pos) in [
            ("lastSeen", &cp.last_seen),
            ("lastProcessed", &cp.last_processed),
        ] {
            let Some(seq) = pos.as_ref().and_then(|p| token_seq(&p.token)) else {
                continue;
            };
            let bad = self
                .checked_changes(seq)
                .find(|c| !self.accounted(c))
                .map(|c| c.to_string());
            if let Some(c) = bad {
                self.violate(
                    Invariant::CheckpointPassesUnsettled,
                    format!("checkpoint written with {label} = #{seq}, which passes change {c}: not settled at the time of writing"),
                );
            }
        }
    }

    /// Invariants 3 and 4, at the instant a handler succeeds.
    fn on_success(&mut self, seq: u64, key: Option<i32>) {
        self.stats.successes += 1;
        let before = self.successes.get(&seq).copied().unwrap_or(0);
        let delivered = self.deliveries.get(&seq).copied().unwrap_or(0);
        if before > 0 {
            self.stats.duplicate_successes += 1;
        }
        if before + 1 > delivered {
            self.violate(
                Invariant::DuplicateWithoutFault,
                format!("change #{seq} handled successfully {} time(s) but delivered by the source only {delivered} time(s)", before + 1),
            );
        }
        if before == 0 {
            if let Some(k) = key {
                let earlier = self
                    .checked_changes(seq.saturating_sub(1))
                    .find(|c| c.key == Some(k) && c.seq < seq && !self.accounted(c))
                    .map(|c| c.to_string());
                if let Some(c) = earlier {
                    self.violate(
                        Invariant::PerKeyOrder,
                        format!("change #{seq} of k{k} handled before the earlier change {c} of the same key was settled"),
                    );
                }
            }
        }
        *self.successes.entry(seq).or_default() += 1;
        self.settle(seq, Settle::Handled);
    }

    /// A cursor was opened at `at`; a loud history-lost restart (counter risen) turns
    /// the unsettled changes it skips into a reported gap.
    fn on_open(&mut self, at: &StartAt, head: u64, first: u64, result: &Result<(), SourceError>) {
        self.stats.opens += 1;
        let lost_now = self.history_lost_finished
            + self
                .handle
                .as_ref()
                .and_then(|h| h.status(crate::STREAM))
                .map(|s| s.counters.history_lost)
                .unwrap_or(0);
        match result {
            Err(e) => self.log(format!("open {at} -> error {:?}: {}", e.kind, e.message)),
            Ok(()) => {
                self.log(format!("open {at} (oplog #{first}..=#{head})"));
                let upper = match at {
                    StartAt::Now => head,
                    StartAt::OldestAvailable => first.saturating_sub(1),
                    _ => return,
                };
                if self.start_seq.is_none() {
                    self.start_seq = Some(head);
                    self.log(format!("stream start position: after #{head}"));
                    return;
                }
                let skipped: Vec<u64> = self
                    .checked_changes(upper)
                    .filter(|c| !self.accounted(c))
                    .map(|c| c.seq)
                    .collect();
                if lost_now > self.history_lost_accounted {
                    self.history_lost_accounted = lost_now;
                    self.stats.gaps += 1;
                    self.log(format!(
                        "reported gap (history lost, counted): {} change(s) skipped: {skipped:?}",
                        skipped.len()
                    ));
                    self.gap.extend(skipped);
                } else if !skipped.is_empty() {
                    self.violate(
                        Invariant::NoSilentLoss,
                        format!("the stream re-opened at `{at}` without reporting lost history; unsettled changes {skipped:?} are skipped silently"),
                    );
                }
            }
        }
    }
}

/// The document type of the simulated stream (a document with `n` of another type does not
/// decode).
#[derive(Debug, Clone, Deserialize)]
pub struct Item {
    /// A number.
    pub n: i64,
    /// A status.
    #[serde(default)]
    pub status: String,
}

thread_local! {
    static PIPELINE: std::cell::RefCell<Vec<Document>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(crate) fn set_pipeline(kind: PipelineKind) {
    let stages = match kind {
        PipelineKind::None => vec![],
        PipelineKind::NoDeletes => {
            vec![bson::doc! {"$match": {"operationType": {"$nin": ["delete"]}}}]
        }
        PipelineKind::NotKey(k) => vec![bson::doc! {"$match": {"documentKey._id": {"$ne": k}}}],
        PipelineKind::NotHidden => {
            vec![bson::doc! {"$match": {"fullDocument.status": {"$ne": "hidden"}}}]
        }
    };
    PIPELINE.with(|p| *p.borrow_mut() = stages);
}

pub(crate) static DEFAULT_DEF: StreamDefinition = StreamDefinition {
    name: crate::STREAM,
    type_name: "SimHandler",
    database: None,
    collection: crate::COLLECTION,
    full_document: flowwarden::FullDocument::Default,
    full_document_before_change: flowwarden::FullDocumentBeforeChange::Off,
    enabled: true,
    auto_start: true,
    checkpoint: flowwarden::CheckpointConfig::DEFAULT,
    retry: flowwarden::RetryConfig::DEFAULT,
    restart: flowwarden::RestartConfig::DEFAULT,
    deployment: flowwarden::Deployment::AllInstances,
    source: flowwarden::definition::SourceLocation {
        file: file!(),
        line: line!(),
    },
};

/// The panic message of injected panics (the harness's panic hook keeps them quiet).
pub(crate) const PANIC_MARK: &str = "flowwarden-simulation: injected handler panic";

/// The simulated handler: behaviour from the schedule, every call recorded.
#[derive(Clone)]
pub(crate) struct SimHandler {
    pub(crate) world: Arc<World>,
}

enum Outcome {
    Ok,
    Fail(&'static str),
    Panic,
    DeadLetterRequest,
}

fn key_of<T>(ctx: &ChangeContext<T>) -> Option<i32> {
    match ctx.document_key()?.get("_id")? {
        Bson::Int32(k) => Some(*k),
        Bson::Int64(k) => Some(*k as i32),
        _ => None,
    }
}

impl StreamHandler for SimHandler {
    type Document = Item;

    fn definition() -> &'static StreamDefinition {
        &DEFAULT_DEF
    }

    fn pipeline() -> Vec<Document> {
        PIPELINE.with(|p| p.borrow().clone())
    }

    fn filter(&self, ctx: &ChangeContext<Item>) -> bool {
        let mut w = self.world.lock();
        let key = key_of(ctx);
        let keep = match w.settings.filter {
            FilterKind::None => true,
            FilterKind::NoUpdatesOf(k) => {
                !(key == Some(k) && ctx.operation_type().as_str() == "update")
            }
            FilterKind::NotQuiet => ctx.document().is_none_or(|d| d.status != "quiet"),
        };
        if !keep {
            if let Some(seq) = token_seq(ctx.resume_token()) {
                w.log(format!("filter rejects #{seq}"));
                w.settle(seq, Settle::Filtered);
            }
        }
        keep
    }

    fn handle(self: Arc<Self>, ctx: Arc<ChangeContext<Item>>) -> Option<HandlerFuture> {
        let seq = token_seq(ctx.resume_token())?;
        let op = ctx.operation_type().as_str().to_owned();
        let key = key_of(&ctx);
        let mut w = self.world.lock();
        if op == "drop" || op == "invalidate" {
            w.log(format!("unrouted #{seq} {op}"));
            w.settle(seq, Settle::Unrouted);
            return None;
        }
        let call = {
            let c = w.calls.entry(seq).or_insert(0);
            *c += 1;
            *c - 1
        };
        let b = &w.settings.behaviour;
        let h = mix(w.seed
            ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(call).wrapping_mul(0xC2B2_AE3D_27D4_EB4F));
        let latency = if b.max_latency_ms == 0 {
            0
        } else {
            h % (b.max_latency_ms + 1)
        };
        let outcome = if key.is_some_and(|k| b.permanent_keys.contains(&k)) {
            Outcome::Fail("permanent failure")
        } else if call < b.transient_calls && (h >> 20) % 100 < b.transient_pct {
            Outcome::Fail("transient failure")
        } else if call < 2 && (h >> 30) % 100 < b.panic_pct {
            Outcome::Panic
        } else if (h >> 40) % 100 < b.dead_letter_request_pct {
            Outcome::DeadLetterRequest
        } else {
            Outcome::Ok
        };
        w.stats.invocations += 1;
        w.log(format!(
            "invoke #{seq} {op} k{} attempt {} (call {call}, {latency}ms)",
            key.unwrap_or(-1),
            ctx.attempt()
        ));
        drop(w);
        let world = self.world.clone();
        Some(Box::pin(async move {
            if latency > 0 {
                tokio::time::sleep(Duration::from_millis(latency)).await;
            }
            let mut w = world.lock();
            match outcome {
                Outcome::Ok => {
                    w.log(format!("success #{seq}"));
                    w.on_success(seq, key);
                    Ok(())
                }
                Outcome::Fail(why) => {
                    w.log(format!("fail #{seq}: {why}"));
                    Err(HandlerError::msg(format!("{why} of #{seq}")))
                }
                Outcome::DeadLetterRequest => {
                    w.log(format!("#{seq}: handler asks to dead-letter"));
                    ctx.dead_letter("the simulated handler asked for it");
                    Ok(())
                }
                Outcome::Panic => {
                    w.log(format!("panic #{seq}"));
                    drop(w);
                    panic!("{PANIC_MARK} #{seq}");
                }
            }
        }))
    }

    fn on_error(&self, error: &HandlerError, _ctx: &ChangeContext<Item>) -> Option<ErrorAction> {
        let w = self.world.lock();
        (w.settings.behaviour.dead_letter_permanent_at_once
            && error.to_string().starts_with("permanent"))
        .then_some(ErrorAction::DeadLetter)
    }
}

/// The in-memory change source, recording opens and deliveries.
pub(crate) struct RecSource {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
}

#[async_trait]
impl ChangeSource for RecSource {
    async fn open(
        &self,
        spec: &WatchSpec,
        at: StartAt,
    ) -> Result<Box<dyn ChangeCursor>, SourceError> {
        let head = self.memory.oplog_head();
        let first = self.memory.oplog_first_retained();
        let result = ChangeSource::open(&self.memory, spec, at.clone()).await;
        let summary = result.as_ref().map(|_| ()).map_err(Clone::clone);
        self.world.lock().on_open(&at, head, first, &summary);
        result.map(|inner| {
            Box::new(RecCursor {
                inner,
                world: self.world.clone(),
                last: None,
            }) as Box<dyn ChangeCursor>
        })
    }

    fn describe(&self) -> String {
        "simulated in-memory".into()
    }
}

struct RecCursor {
    inner: Box<dyn ChangeCursor>,
    world: Arc<World>,
    last: Option<u64>,
}

#[async_trait]
impl ChangeCursor for RecCursor {
    async fn next(&mut self) -> Result<Option<SourceItem>, SourceError> {
        let item = self.inner.next().await;
        let mut w = self.world.lock();
        match &item {
            Ok(Some(SourceItem::Event(raw))) => {
                if let Some(seq) = event_seq(raw) {
                    let invalidate = raw.get_str("operationType") == Ok("invalidate");
                    if !invalidate {
                        *w.deliveries.entry(seq).or_default() += 1;
                    }
                    if !invalidate && self.last.is_some_and(|l| seq <= l) {
                        w.log(format!(
                            "source moved back: #{seq} after #{}",
                            self.last.unwrap_or(0)
                        ));
                    }
                    if !invalidate {
                        self.last = Some(seq);
                    }
                    w.log(format!(
                        "deliver #{seq}{}",
                        if invalidate { " invalidate" } else { "" }
                    ));
                }
            }
            Ok(Some(SourceItem::Idle(_))) | Ok(None) => {}
            Err(e) => w.log(format!("read error {:?}: {}", e.kind, e.message)),
        }
        item
    }

    fn initial_position(&self) -> Option<ResumeToken> {
        self.inner.initial_position()
    }
}

/// The in-memory checkpoint store; checks invariant 2 at every write.
pub(crate) struct RecCheckpoints {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
}

fn pos_label(p: &Option<flowwarden::StoredPosition>) -> String {
    match p.as_ref().and_then(|p| token_seq(&p.token)) {
        Some(s) => format!("#{s}"),
        None => "-".into(),
    }
}

#[async_trait]
impl CheckpointStore for RecCheckpoints {
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError> {
        let r = CheckpointStore::load(&self.memory, stream).await;
        let mut w = self.world.lock();
        match &r {
            Ok(Some(c)) => w.log(format!(
                "checkpoint load: seen {} processed {}",
                pos_label(&c.last_seen),
                pos_label(&c.last_processed)
            )),
            Ok(None) => w.log("checkpoint load: none"),
            Err(e) => w.log(format!("checkpoint load failed: {e}")),
        }
        r
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        {
            let mut w = self.world.lock();
            w.log(format!(
                "checkpoint save: seen {} processed {}",
                pos_label(&checkpoint.last_seen),
                pos_label(&checkpoint.last_processed)
            ));
            w.check_checkpoint(checkpoint);
        }
        let r = CheckpointStore::save(&self.memory, checkpoint).await;
        let mut w = self.world.lock();
        match &r {
            Ok(()) => w.stats.checkpoints_saved += 1,
            Err(e) => w.log(format!("checkpoint save failed: {e}")),
        }
        r
    }

    async fn claim(&self, key: &str, fence: &flowwarden::Fence) -> Result<(), StoreError> {
        CheckpointStore::claim(&self.memory, key, fence).await
    }
}

/// The in-memory dead-letter store, recording what was set aside.
pub(crate) struct RecDeadLetters {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
}

#[async_trait]
impl DeadLetterStore for RecDeadLetters {
    async fn put(&self, record: &DeadLetterRecord) -> Result<PutOutcome, StoreError> {
        let r = DeadLetterStore::put(&self.memory, record).await;
        let mut w = self.world.lock();
        let seq = token_seq(&record.token);
        match &r {
            Ok(_) => {
                w.log(format!(
                    "dead-lettered #{} ({}): {}",
                    seq.unwrap_or(0),
                    record.error_kind,
                    record.error_chain.join(": ")
                ));
                w.stats.dead_letters += 1;
                if let Some(seq) = seq {
                    w.settle(seq, Settle::DeadLettered);
                }
            }
            Err(e) => w.log(format!(
                "dead-letter put failed for #{}: {e}",
                seq.unwrap_or(0)
            )),
        }
        r
    }

    async fn list(&self, query: &DeadLetterQuery) -> Result<Vec<DeadLetterRecord>, StoreError> {
        DeadLetterStore::list(&self.memory, query).await
    }

    async fn get(&self, id: &str) -> Result<Option<DeadLetterRecord>, StoreError> {
        DeadLetterStore::get(&self.memory, id).await
    }

    async fn set_status(&self, id: &str, status: DeadLetterStatus) -> Result<bool, StoreError> {
        DeadLetterStore::set_status(&self.memory, id, status).await
    }

    fn max_record_bytes(&self) -> usize {
        DeadLetterStore::max_record_bytes(&self.memory)
    }
}
