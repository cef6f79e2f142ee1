//! The recording checkpoint and dead-letter stores: every write, accepted or rejected, judged
//! with the lease the store held at that instant (invariants 2, 6, 7, 8).

use super::*;

/// The in-memory checkpoint store of one runtime; checks invariant 2 at every write, and 6, 7
/// and 8 at every write the store accepts.
pub(crate) struct RecCheckpoints {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
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
