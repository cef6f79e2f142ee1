//! The port: everything a backend implements, and the models it stores.
//!
//! A backend is a [`crate::Backend`]: a [`ChangeSource`] (where events come from), a
//! [`CheckpointStore`], and optionally a [`DeadLetterStore`], a [`LeaseStore`] and a
//! [`TransactionStore`] (for `transactional = true` streams). Each
//! store speaks in the models of this module ([`Checkpoint`], [`DeadLetterRecord`],
//! [`Lease`]) and fails with a [`StoreError`] whose [`StoreErrorKind`] tells the engine what
//! to do. The BSON form of the models is in [`codec`], for backends that store documents.
//!
//! The contract of every trait is pinned by the conformance suite in `tests/testkit`
//! (`flowwarden_testkit::conformance`): a backend runs it with one call. How to write and
//! plug in a backend: `docs/implementing-a-backend.md`. To be picked from the environment by
//! [`crate::run()`], a backend also provides a [`BackendDriver`].

mod checkpoint;
pub mod codec;
mod dead_letter;
mod driver;
mod lease;
mod scan;
mod source;
mod store_error;
mod transaction;

pub use checkpoint::{
    Checkpoint, CheckpointParseError, CheckpointStore, SnapshotProgress, StoredPosition,
};
pub use dead_letter::{
    DeadLetterQuery, DeadLetterRecord, DeadLetterStatus, DeadLetterStore, PutOutcome,
};
pub(crate) use driver::drivers;
pub use driver::{
    install_driver, BackendDriver, DriverRegistration, ProvidedBackend, MONGODB_URI_VAR,
};
pub use lease::{check_fence, Fence, Lease, LeaseStore};
pub use scan::{ids_after, ScanRequest};
pub use source::{
    timestamp_time, ChangeCursor, ChangeSource, HistoryBounds, HistoryUnknown, ReadMode,
    SourceError, SourceErrorKind, SourceItem, StartAt, WatchSpec,
};
pub use store_error::{StoreError, StoreErrorKind};
pub use transaction::{
    HandleType, StreamTransaction, TransactionError, TransactionErrorKind, TransactionHandle,
    TransactionHandleType, TransactionStore, DEFAULT_TRANSACTION_LIFETIME,
};
