//! The recording wrappers around the in-memory backend's source, checkpoint store, dead-letter
//! store and lease store: every open, delivery, write and lease call feeds the world.
//!
//! By concept: `source` the change source and its cursors (opens, deliveries, scan batches);
//! `stores` the checkpoint and dead-letter stores (every write, accepted or rejected, with the
//! lease at that instant); `leases` the lease store (the exact mirror, partitions, the lease
//! sabotages); `transactions` the transaction store of transactional streams (every commit,
//! recorded as a checkpoint write, and the commit faults' timing). This module holds what they
//! share.

mod leases;
mod source;
mod stores;
mod transactions;

pub(crate) use leases::RecLeases;
pub(crate) use source::RecSource;
pub(crate) use stores::{RecCheckpoints, RecDeadLetters};
pub(crate) use transactions::RecTransactions;

use super::*;

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
