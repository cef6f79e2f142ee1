//! The recording wrappers around the in-memory backend's source, checkpoint store, dead-letter
//! store and lease store: every open, delivery, write and lease call feeds the world.

use flowwarden::port::{HistoryBounds, HistoryUnknown, ScanRequest, SourceErrorKind};

use super::*;

/// The in-memory change source, recording opens and deliveries.
pub(crate) struct RecSource {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
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
        let (oldest_unknown, sabotage) = {
            let w = self.world.lock();
            (w.settings.oldest_unknown, w.sabotage)
        };
        let result = if oldest_unknown && at == StartAt::OldestAvailable {
            if sabotage == Some(Sabotage::OldestBecomesNow) {
                // The old adapter: "cannot read local.oplog.rs" became an open at now.
                ChangeSource::open(&self.memory, spec, StartAt::Now).await
            } else {
                self.world.lock().stats.oldest_unknown_refusals += 1;
                let kind = if sabotage == Some(Sabotage::OldestUnknownAsTransient) {
                    SourceErrorKind::Resumable
                } else {
                    SourceErrorKind::OldestUnknown
                };
                Err(SourceError::new(
                    kind,
                    "the oldest retained position cannot be read (simulated: no access to local.oplog.rs, no serverStatus)",
                ))
            }
        } else {
            ChangeSource::open(&self.memory, spec, at.clone()).await
        };
        let summary = result.as_ref().map(|_| ()).map_err(Clone::clone);
        // Where the cursor starts: a delivery at or before it is the source moving back.
        let start = match &at {
            StartAt::ResumeAfter(t) | StartAt::StartAfter(t) => token_seq(t),
            StartAt::Now => Some(head),
            StartAt::OldestAvailable if oldest_unknown => Some(head),
            StartAt::OldestAvailable => Some(first.saturating_sub(1)),
            _ => None,
        };
        let inc = self.inc;
        // One look at the world: the next one judges a gap this open may have taken.
        let mut w = self.world.lock();
        let tag = w.tag(inc);
        w.on_cursor_open(inc);
        w.on_open(&tag, &at, head, first, &summary);
        w.on_snapshot_open(inc, &at, summary.is_ok());
        match &summary {
            Ok(()) => w.last_open_refused_oldest = false,
            Err(_) if oldest_unknown && at == StartAt::OldestAvailable => {
                w.last_open_refused_oldest = true
            }
            Err(_) => {}
        }
        if let (Ok(_), StartAt::Now | StartAt::OldestAvailable, Some(st)) = (&result, &at, start) {
            let stored = w
                .last_written
                .as_ref()
                .map(|c| c.seen.max(c.processed))
                .unwrap_or_default();
            let delivered = w.max_delivered.get(&inc).copied();
            if stored.max(delivered).is_some_and(|c| st < c) {
                // Only a source that moved back (the rewind fault, past the retained history)
                // makes "now" or "the oldest entry" lie behind what was settled.
                let floor = w.rewound_to.entry(inc).or_insert(st);
                *floor = (*floor).min(st);
            }
        }
        drop(w);
        result.map(|inner| {
            Box::new(RecCursor {
                inner,
                world: self.world.clone(),
                last: start,
                tag,
                inc,
            }) as Box<dyn ChangeCursor>
        })
    }

    fn describe(&self) -> String {
        "simulated in-memory".into()
    }

    async fn history_bounds(&self) -> Result<HistoryBounds, HistoryUnknown> {
        ChangeSource::history_bounds(&self.memory).await
    }

    fn position_time(&self, position: &ResumeToken) -> Option<bson::DateTime> {
        ChangeSource::position_time(&self.memory, position)
    }

    /// A scan batch takes the schedule's scan latency (a `find`'s round trip), then reads
    /// the collection as it is.
    async fn scan(&self, request: &ScanRequest) -> Result<Vec<Document>, SourceError> {
        let latency = self
            .world
            .lock()
            .settings
            .snapshot
            .as_ref()
            .map_or(0, |s| s.scan_latency_ms);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        let result = ChangeSource::scan(&self.memory, request).await;
        let head = self.memory.oplog_head();
        self.world
            .lock()
            .on_scan(self.inc, request.after.as_ref(), &result, head);
        result
    }
}

struct RecCursor {
    inner: Box<dyn ChangeCursor>,
    world: Arc<World>,
    /// The last position delivered (at first, where the cursor was opened).
    last: Option<u64>,
    tag: String,
    inc: u32,
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
                            "{}source moved back: #{seq} after #{}",
                            self.tag,
                            self.last.unwrap_or(0)
                        ));
                        let floor = w.rewound_to.entry(self.inc).or_insert(seq);
                        *floor = (*floor).min(seq);
                    }
                    if !invalidate {
                        self.last = Some(seq);
                        let max = w.max_delivered.entry(self.inc).or_insert(seq);
                        *max = (*max).max(seq);
                    }
                    w.on_delivered(self.inc, seq);
                    w.log(format!(
                        "{}deliver #{seq}{}",
                        self.tag,
                        if invalidate { " invalidate" } else { "" }
                    ));
                }
            }
            Ok(Some(SourceItem::Idle(Some(t)))) => {
                if let Some(seq) = token_seq(t) {
                    if self.last.is_some_and(|l| seq < l) {
                        w.log(format!(
                            "{}source moved back: idle at #{seq} after #{}",
                            self.tag,
                            self.last.unwrap_or(0)
                        ));
                        let floor = w.rewound_to.entry(self.inc).or_insert(seq);
                        *floor = (*floor).min(seq);
                    }
                    self.last = Some(seq);
                }
            }
            Ok(Some(SourceItem::Idle(None))) | Ok(None) => {}
            Err(e) => w.log(format!(
                "{}read error {:?}: {}",
                self.tag, e.kind, e.message
            )),
        }
        item
    }

    fn initial_position(&self) -> Option<ResumeToken> {
        self.inner.initial_position()
    }
}

/// The in-memory checkpoint store of one runtime; checks invariant 2 at every write, and 6, 7
/// and 8 at every write the store accepts.
pub(crate) struct RecCheckpoints {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
}

pub(crate) fn pos_seq(s: Option<u64>) -> String {
    s.map(|s| format!("#{s}")).unwrap_or_else(|| "-".into())
}

pub(crate) fn pos_label(p: &Option<flowwarden::port::StoredPosition>) -> String {
    match p.as_ref().and_then(|p| token_seq(&p.token)) {
        Some(s) => format!("#{s}"),
        None => "-".into(),
    }
}

pub(crate) fn is_fenced<T>(r: &Result<T, StoreError>) -> bool {
    matches!(r, Err(e) if e.kind == StoreErrorKind::Fenced)
}

/// The lease the store holds now (the in-memory store answers at once, without yielding, so
/// it is the lease at the instant the preceding write was accepted or rejected).
async fn current_lease(memory: &MemoryBackend) -> Option<Lease> {
    LeaseStore::current(memory, crate::STREAM)
        .await
        .ok()
        .flatten()
}

#[async_trait]
impl CheckpointStore for RecCheckpoints {
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError> {
        let r = CheckpointStore::load(&self.memory, stream).await;
        let mut w = self.world.lock();
        let tag = w.tag(self.inc);
        match &r {
            Ok(Some(c)) => w.log(format!(
                "{tag}checkpoint load: seen {} processed {}",
                pos_label(&c.last_seen),
                pos_label(&c.last_processed)
            )),
            Ok(None) => w.log(format!("{tag}checkpoint load: none")),
            Err(e) => w.log(format!("{tag}checkpoint load failed: {e}")),
        }
        r
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let sabotage = {
            let mut w = self.world.lock();
            let tag = w.tag(self.inc);
            let epoch = checkpoint
                .epoch
                .map(|e| format!(" (epoch {e})"))
                .unwrap_or_default();
            w.log(format!(
                "{tag}checkpoint save: seen {} processed {}{epoch}",
                pos_label(&checkpoint.last_seen),
                pos_label(&checkpoint.last_processed)
            ));
            w.check_checkpoint(checkpoint);
            w.sabotage
        };
        let mut written = checkpoint.clone();
        if sabotage == Some(Sabotage::ForgetInvalidate) {
            // Keep what was stored in place of an invalidate's position.
            let stored = CheckpointStore::load(&self.memory, &checkpoint.stream)
                .await
                .ok()
                .flatten();
            if written.last_seen.as_ref().is_some_and(|p| p.start_after) {
                written.last_seen = stored.as_ref().and_then(|c| c.last_seen.clone());
            }
            if written
                .last_processed
                .as_ref()
                .is_some_and(|p| p.start_after)
            {
                written.last_processed = stored.as_ref().and_then(|c| c.last_processed.clone());
            }
        }
        if sabotage == Some(Sabotage::UnfencedWrites) {
            written.owner = None;
            written.epoch = None;
        }
        let mut r = CheckpointStore::save(&self.memory, &written).await;
        if sabotage == Some(Sabotage::ForgedEpoch) && is_fenced(&r) {
            if let Some(l) = current_lease(&self.memory).await {
                written.owner = Some(l.owner);
                written.epoch = Some(l.epoch);
                r = CheckpointStore::save(&self.memory, &written).await;
            }
        }
        if sabotage == Some(Sabotage::UnfencedWrites) {
            // Judged as the runtime sent it: the store just did not check the fence.
            written.owner.clone_from(&checkpoint.owner);
            written.epoch = checkpoint.epoch;
        }
        let current = current_lease(&self.memory).await;
        let mut w = self.world.lock();
        match &r {
            Ok(()) => {
                w.on_checkpoint_accepted(self.inc, &written, current.as_ref());
                w.on_snapshot_checkpoint(self.inc, &written);
            }
            Err(e) if e.kind == StoreErrorKind::Fenced => {
                w.stats.fenced_checkpoint_writes += 1;
                w.on_fenced(self.inc, "checkpoint save", e);
            }
            Err(e) => {
                let tag = w.tag(self.inc);
                w.log(format!("{tag}checkpoint save failed: {e}"));
            }
        }
        r
    }

    async fn claim(&self, key: &str, fence: &flowwarden::port::Fence) -> Result<(), StoreError> {
        let r = CheckpointStore::claim(&self.memory, key, fence).await;
        let current = current_lease(&self.memory).await;
        let mut w = self.world.lock();
        match &r {
            Ok(()) => w.on_claim_accepted(self.inc, fence, current.as_ref()),
            Err(e) if e.kind == StoreErrorKind::Fenced => {
                w.stats.fenced_claims += 1;
                w.on_fenced(self.inc, "checkpoint claim", e);
            }
            Err(e) => {
                let tag = w.tag(self.inc);
                w.log(format!("{tag}checkpoint claim failed: {e}"));
            }
        }
        r
    }
}

/// The in-memory dead-letter store, recording what was set aside.
pub(crate) struct RecDeadLetters {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
}

#[async_trait]
impl DeadLetterStore for RecDeadLetters {
    async fn put(&self, record: &DeadLetterRecord) -> Result<PutOutcome, StoreError> {
        let sabotage = self.world.lock().sabotage;
        let mut written = record.clone();
        if sabotage == Some(Sabotage::UnfencedWrites) {
            written.owner = None;
            written.epoch = None;
        }
        let mut r = DeadLetterStore::put(&self.memory, &written).await;
        if sabotage == Some(Sabotage::ForgedEpoch) && is_fenced(&r) {
            if let Some(l) = current_lease(&self.memory).await {
                written.owner = Some(l.owner);
                written.epoch = Some(l.epoch);
                r = DeadLetterStore::put(&self.memory, &written).await;
            }
        }
        if sabotage == Some(Sabotage::UnfencedWrites) {
            written.owner.clone_from(&record.owner);
            written.epoch = record.epoch;
        }
        let current = current_lease(&self.memory).await;
        let mut w = self.world.lock();
        let tag = w.tag(self.inc);
        let seq = token_seq(&record.token);
        match &r {
            Ok(_) => {
                w.on_dead_letter_accepted(self.inc, &written, current.as_ref());
                w.log(format!(
                    "{tag}dead-lettered #{} ({}): {}",
                    seq.unwrap_or(0),
                    record.error_kind,
                    record.error_chain.join(": ")
                ));
                w.stats.dead_letters += 1;
                if let Some(seq) = seq {
                    w.settle(seq, Settle::DeadLettered);
                }
                if record.event.get_bool("snapshot") == Ok(true) {
                    let key = record.document_key.as_ref().and_then(|k| k.get("_id"));
                    if let Some(k) = key.and_then(int_key) {
                        w.log(format!("{tag}dead-lettered the snapshot read of k{k}"));
                        w.settle_snapshot_read(k, Settle::DeadLettered);
                    }
                }
            }
            Err(e) if e.kind == StoreErrorKind::Fenced => {
                w.stats.fenced_dead_letter_writes += 1;
                w.on_fenced(
                    self.inc,
                    &format!("dead letter for #{}", seq.unwrap_or(0)),
                    e,
                );
            }
            Err(e) => w.log(format!(
                "{tag}dead-letter put failed for #{}: {e}",
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

/// The in-memory lease store of one runtime: keeps the harness's lease mirror exact, cuts off
/// identities (acquisitions fail too, as across a partition), and applies the lease sabotages.
pub(crate) struct RecLeases {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
}

pub(crate) fn unreachable_lease_store() -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        "lease store unreachable (simulated partition)",
    )
}

impl RecLeases {
    /// An injected slow call of `owner`: waits, then tells whether the call fails (a partition)
    /// instead of reaching the store.
    async fn slow(&self, owner: &str, what: &str) -> bool {
        let slow = self.world.lock().slow_lease.get(owner).copied();
        let Some((d, fail)) = slow else { return false };
        if fail {
            self.world
                .lock()
                .busy_until
                .insert(self.inc, Instant::now() + d);
            tokio::time::sleep(d).await;
            let mut w = self.world.lock();
            let tag = w.tag(self.inc);
            w.log(format!(
                "{tag}lease {what}: no answer for {}ms, then an error",
                d.as_millis()
            ));
        }
        fail
    }

    /// An injected slow answer (the store acted at once; the answer arrives `d` later).
    async fn late_answer(&self, owner: &str) {
        let slow = self.world.lock().slow_lease.get(owner).copied();
        if let Some((d, false)) = slow {
            self.world
                .lock()
                .busy_until
                .insert(self.inc, Instant::now() + d);
            tokio::time::sleep(d).await;
        }
    }
}

/// The guard a sabotaged store grants without looking: every instance "holds" it.
fn fake_guard(stream: &str, owner: &str, ttl: Duration) -> Lease {
    Lease {
        stream: stream.to_owned(),
        owner: owner.to_owned(),
        epoch: 1,
        expires_at: bson::DateTime::from_millis(
            bson::DateTime::now().timestamp_millis() + ttl.as_millis() as i64,
        ),
    }
}

#[async_trait]
impl LeaseStore for RecLeases {
    async fn try_acquire(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        if self.slow(owner, "acquisition").await {
            return Err(unreachable_lease_store());
        }
        {
            let w = self.world.lock();
            if w.cut_off.contains(owner) {
                return Err(unreachable_lease_store());
            }
            if w.sabotage == Some(Sabotage::NoTakeover)
                && w.lease.as_ref().is_some_and(|l| l.owner != owner)
            {
                return Ok(None);
            }
            if w.sabotage == Some(Sabotage::GuardForEveryone) && stream.ends_with("#checkpoint") {
                return Ok(Some(fake_guard(stream, owner, ttl)));
            }
        }
        let r = LeaseStore::try_acquire(&self.memory, stream, owner, ttl).await;
        if let Ok(Some(l)) = &r {
            self.world.lock().on_acquire(self.inc, owner, l.epoch, ttl);
        }
        self.late_answer(owner).await;
        r
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        if self.slow(&lease.owner, "renewal").await {
            return Err(unreachable_lease_store());
        }
        {
            let w = self.world.lock();
            if w.cut_off.contains(&lease.owner) {
                return Err(unreachable_lease_store());
            }
            if w.sabotage == Some(Sabotage::GuardForEveryone)
                && lease.stream.ends_with("#checkpoint")
            {
                return Ok(Some(fake_guard(&lease.stream, &lease.owner, ttl)));
            }
            if w.sabotage == Some(Sabotage::LyingRenewals) && w.frozen.contains(&lease.owner) {
                // A broken store: the renewal "succeeds" but the lease is not extended.
                let mut fake = lease.clone();
                fake.expires_at = bson::DateTime::from_millis(
                    lease.expires_at.timestamp_millis() + ttl.as_millis() as i64,
                );
                return Ok(Some(fake));
            }
        }
        let r = LeaseStore::renew(&self.memory, lease, ttl).await;
        {
            let mut w = self.world.lock();
            let tag = w.tag(self.inc);
            match &r {
                Ok(Some(l)) => {
                    let now = Instant::now();
                    let renewed = w
                        .lease
                        .as_mut()
                        .filter(|m| m.epoch == l.epoch && m.owner == l.owner)
                        .map(|m| m.expires = now + ttl)
                        .is_some();
                    if renewed {
                        w.on_renewed(self.inc);
                    }
                }
                Ok(None) => w.log(format!("{tag}lease renewal: lost (epoch {})", lease.epoch)),
                Err(e) => w.log(format!(
                    "{tag}lease renewal failed (epoch {}): {}",
                    lease.epoch, e.message
                )),
            }
        }
        self.late_answer(&lease.owner).await;
        r
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let r = LeaseStore::release(&self.memory, lease).await;
        let mut w = self.world.lock();
        let tag = w.tag(self.inc);
        if r.is_ok() {
            let now = Instant::now();
            if let Some(m) = w.lease.as_mut() {
                if m.epoch == lease.epoch && m.owner == lease.owner && m.expires > now {
                    m.expires = now;
                }
            }
            w.log(format!("{tag}releases the lease (epoch {})", lease.epoch));
        }
        r
    }

    async fn current(&self, stream: &str) -> Result<Option<Lease>, StoreError> {
        LeaseStore::current(&self.memory, stream).await
    }
}
