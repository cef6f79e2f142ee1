//! [`DeadLetters`]: listing, replaying and discarding a runtime's dead letters.

use std::sync::Arc;

use tracing::info;

use super::{DeadLetterError, RuntimeHandle};
use crate::port::{DeadLetterQuery, DeadLetterRecord, DeadLetterStatus, DeadLetterStore};

/// Listing, replaying and discarding dead letters.
pub struct DeadLetters {
    handle: RuntimeHandle,
}

impl DeadLetters {
    pub(super) fn new(handle: RuntimeHandle) -> Self {
        Self { handle }
    }

    fn store(&self) -> Result<&Arc<dyn DeadLetterStore>, DeadLetterError> {
        self.handle
            .inner
            .backend
            .dead_letters
            .as_ref()
            .ok_or(DeadLetterError::NoStore)
    }

    /// Lists records, oldest first.
    pub async fn list(
        &self,
        query: &DeadLetterQuery,
    ) -> Result<Vec<DeadLetterRecord>, DeadLetterError> {
        Ok(self.store()?.list(query).await?)
    }

    /// One record.
    pub async fn get(&self, id: &str) -> Result<Option<DeadLetterRecord>, DeadLetterError> {
        Ok(self.store()?.get(id).await?)
    }

    /// Runs the record's event through its stream's filter and handler once; on success the
    /// record becomes `Replayed`, on failure it stays `Pending` and the error is returned.
    pub async fn replay(&self, id: &str) -> Result<(), DeadLetterError> {
        let store = self.store()?;
        let record = store
            .get(id)
            .await?
            .ok_or_else(|| DeadLetterError::NotFound(id.into()))?;
        let inner = &self.handle.inner;
        let stream = inner
            .lock_slots()
            .get(record.stream.as_str())
            .map(|s| s.stream.clone())
            .ok_or_else(|| DeadLetterError::UnknownStream {
                id: id.into(),
                stream: record.stream.clone(),
            })?;
        let transactions = stream
            .definition()
            .transactional
            .then(|| inner.backend.transactions.clone())
            .flatten();
        match stream
            .inner
            .replay(record.event.clone(), transactions)
            .await
        {
            Ok(()) => {
                store.set_status(id, DeadLetterStatus::Replayed).await?;
                info!(stream = %record.stream, id, "dead letter replayed");
                Ok(())
            }
            Err(error) => Err(DeadLetterError::ReplayFailed {
                id: id.into(),
                error,
            }),
        }
    }

    /// Marks a record discarded (kept for audit, no longer pending).
    pub async fn discard(&self, id: &str) -> Result<(), DeadLetterError> {
        if self
            .store()?
            .set_status(id, DeadLetterStatus::Discarded)
            .await?
        {
            info!(id, "dead letter discarded");
            Ok(())
        } else {
            Err(DeadLetterError::NotFound(id.into()))
        }
    }
}
