//! The checkpoint and dead-letter stores of the in-memory backend.

use async_trait::async_trait;

use super::MemoryBackend;
use crate::port::codec::{
    encode_checkpoint, encode_checkpoint_into, encoded_len, is_claim_only, CLAIMED_AT,
};
use crate::port::{check_fence, Fence, LeaseStore};
use crate::port::{Checkpoint, CheckpointStore};
use crate::port::{
    DeadLetterQuery, DeadLetterRecord, DeadLetterStatus, DeadLetterStore, PutOutcome,
};
use crate::port::{StoreError, StoreErrorKind};

fn unavailable(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        format!("{what} (injected fault)"),
    )
}

#[async_trait]
impl CheckpointStore for MemoryBackend {
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError> {
        let doc = {
            let mut st = self.lock();
            if st.faults.checkpoint_load_fails() {
                return Err(unavailable("checkpoint load failed"));
            }
            st.checkpoints.get(stream).cloned()
        };
        match doc {
            None => Ok(None),
            Some(d) if is_claim_only(&d) => Ok(None),
            Some(d) => crate::port::codec::decode_checkpoint(&d)
                .map(Some)
                .map_err(|e| StoreError::new(StoreErrorKind::Corrupt, e.to_string())),
        }
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let delay = {
            let mut st = self.lock();
            if st.faults.checkpoint_save_fails() {
                return Err(unavailable("checkpoint write failed"));
            }
            st.faults.checkpoint_save_delay()
        };
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let mut st = self.lock();
        if let Some(epoch) = checkpoint.epoch {
            st.check_checkpoint_epoch(&checkpoint.stream, epoch)?;
            st.check_fence(&checkpoint.stream, checkpoint.owner.as_deref(), Some(epoch))?;
        }
        // Rewritten in place: the stream's document keeps its allocation from one checkpoint
        // to the next.
        match st.checkpoints.get_mut(&checkpoint.stream) {
            Some(stored) => encode_checkpoint_into(checkpoint, stored),
            None => {
                st.checkpoints
                    .insert(checkpoint.stream.clone(), encode_checkpoint(checkpoint));
            }
        }
        Ok(())
    }

    async fn claim(&self, key: &str, fence: &Fence) -> Result<(), StoreError> {
        let now = self.wall_time();
        let mut st = self.lock();
        st.check_checkpoint_epoch(key, fence.epoch)?;
        st.check_fence(key, Some(&fence.owner), Some(fence.epoch))?;
        let d = st
            .checkpoints
            .entry(key.to_owned())
            .or_insert_with(|| bson::doc! { "_id": key });
        d.insert("owner", fence.owner.as_str());
        d.insert("epoch", fence.epoch);
        d.insert(CLAIMED_AT, now);
        Ok(())
    }
}

#[async_trait]
impl DeadLetterStore for MemoryBackend {
    async fn put(&self, record: &DeadLetterRecord) -> Result<PutOutcome, StoreError> {
        let authority = {
            let mut st = self.lock();
            if st.faults.dead_letter_put_fails() {
                return Err(unavailable("dead-letter write failed"));
            }
            st.dead_letter_fence.clone()
        };
        // The same order and merge as the MongoDB store: size first, then the fence; a second
        // put of one id takes the new failure (time, chain, kind) and, when fenced, the new
        // writer's owner and epoch.
        let doc = crate::port::codec::encode_dead_letter(record);
        self.check_dead_letter_size(record, &doc)?;
        let external = match (&authority, record.epoch) {
            (Some(leases), Some(epoch)) => {
                external_fence(&**leases, record, epoch).await?;
                Some((leases, epoch))
            }
            _ => None,
        };
        let outcome = {
            let mut st = self.lock();
            if external.is_none() {
                st.check_fence(&record.stream, record.owner.as_deref(), record.epoch)?;
            }
            st.put_dead_letter(record, doc)?
        };
        if let (Some((leases, epoch)), PutOutcome::Inserted) = (external, outcome) {
            // Deposed while storing: take back what was stored, while it is still ours.
            if let Err(e) = external_fence(&**leases, record, epoch).await {
                let mut st = self.lock();
                let ours = st
                    .dead_letters
                    .get(&record.id)
                    .is_some_and(|d| d.get_i64("epoch").ok() == Some(epoch));
                if ours {
                    st.dead_letters.remove(&record.id);
                }
                return Err(e);
            }
        }
        Ok(outcome)
    }

    async fn list(&self, query: &DeadLetterQuery) -> Result<Vec<DeadLetterRecord>, StoreError> {
        let st = self.lock();
        let mut out = Vec::new();
        for d in st.dead_letters.values() {
            let r = crate::port::codec::decode_dead_letter(d)?;
            if query.stream.as_ref().is_some_and(|s| *s != r.stream) {
                continue;
            }
            if query.status.is_some_and(|s| s != r.status) {
                continue;
            }
            out.push(r);
        }
        out.sort_by(|a, b| (a.first_failed_at, &a.id).cmp(&(b.first_failed_at, &b.id)));
        if let Some(limit) = query.limit {
            out.truncate(limit);
        }
        Ok(out)
    }

    async fn get(&self, id: &str) -> Result<Option<DeadLetterRecord>, StoreError> {
        let st = self.lock();
        st.dead_letters
            .get(id)
            .map(crate::port::codec::decode_dead_letter)
            .transpose()
    }

    async fn set_status(&self, id: &str, status: DeadLetterStatus) -> Result<bool, StoreError> {
        let mut st = self.lock();
        let Some(d) = st.dead_letters.get_mut(id) else {
            return Ok(false);
        };
        d.insert("status", status.as_str());
        Ok(true)
    }

    fn max_record_bytes(&self) -> usize {
        self.lock().dead_letter_max_bytes
    }
}

/// The fence of a dead-letter put against a lease store that is not the backend's own.
async fn external_fence(
    leases: &dyn LeaseStore,
    record: &DeadLetterRecord,
    epoch: i64,
) -> Result<(), StoreError> {
    let current = leases.current(&record.stream).await?;
    check_fence(
        &record.stream,
        current.as_ref().map(|l| (l.owner.as_str(), l.epoch)),
        record.owner.as_deref(),
        epoch,
    )
}

impl MemoryBackend {
    fn check_dead_letter_size(
        &self,
        record: &DeadLetterRecord,
        doc: &bson::Document,
    ) -> Result<(), StoreError> {
        let max = self.lock().dead_letter_max_bytes;
        if encoded_len(doc) > max {
            return Err(StoreError::new(
                StoreErrorKind::TooLarge,
                format!("dead-letter record '{}' exceeds {max} bytes", record.id),
            ));
        }
        Ok(())
    }
}

impl super::State {
    /// Stores `record` (encoded as `doc`), merging into an existing record of the same id.
    fn put_dead_letter(
        &mut self,
        record: &DeadLetterRecord,
        doc: bson::Document,
    ) -> Result<PutOutcome, StoreError> {
        if let Some(existing) = self.dead_letters.get_mut(&record.id) {
            let mut merged = crate::port::codec::decode_dead_letter(existing)?;
            merged.attempts = merged.attempts.saturating_add(record.attempts);
            merged.last_failed_at = record.last_failed_at;
            merged.error_chain = record.error_chain.clone();
            merged.error_kind = record.error_kind.clone();
            if record.epoch.is_some() {
                merged.epoch = record.epoch;
                merged.owner = record.owner.clone();
            }
            merged.status = DeadLetterStatus::Pending;
            *existing = crate::port::codec::encode_dead_letter(&merged);
            return Ok(PutOutcome::AlreadyPresent);
        }
        self.dead_letters.insert(record.id.clone(), doc);
        Ok(PutOutcome::Inserted)
    }
}
