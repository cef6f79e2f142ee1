//! The embedded in-memory backend: collections whose writes append to a bounded oplog, change
//! streams over that oplog with MongoDB's event shapes, checkpoint and dead-letter stores, and
//! fault injection. It is the default for examples and the basis of deterministic tests.
//!
//! It is not MongoDB: see `docs/how-it-works.md` for what it models and what it does not.

mod collection;
mod cursor;
mod faults;
mod leases;
mod oplog;
mod scan;
mod stores;
mod transactions;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bson::Document;
use tokio::sync::Notify;

pub use collection::{MemoryCollection, MemoryError, UpdateOutcome};
#[cfg(feature = "test-util")]
pub use faults::Faults;
use oplog::Entry;
pub use transactions::{MemoryTransaction, MemoryTransactions};

use crate::backend::Backend;

/// The in-memory backend. Cheap to clone: clones share the same data.
#[derive(Clone)]
pub struct MemoryBackend {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    /// Woken on every oplog append.
    appended: Notify,
    epoch: tokio::time::Instant,
}

struct State {
    default_database: String,
    collections: BTreeMap<(String, String), collection::Coll>,
    oplog: VecDeque<Entry>,
    /// Sequence number of the next oplog entry (the first is 1).
    next_seq: u64,
    /// Entries kept; older ones are dropped (their positions answer "history lost").
    retention: usize,
    checkpoints: BTreeMap<String, Document>,
    dead_letters: BTreeMap<String, Document>,
    dead_letter_max_bytes: usize,
    leases: BTreeMap<String, leases::LeaseRecord>,
    /// The lease store that fences dead-letter puts, when it is not this backend's own.
    dead_letter_fence: Option<Arc<dyn crate::port::LeaseStore>>,
    faults: faults::FaultState,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A new, empty backend: default database `flowwarden`, retention of 1,000,000 entries.
    pub fn new() -> Self {
        Self::with_retention(1_000_000)
    }

    /// A new backend keeping at most `entries` oplog entries.
    pub fn with_retention(entries: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    default_database: "flowwarden".into(),
                    collections: BTreeMap::new(),
                    oplog: VecDeque::new(),
                    next_seq: 1,
                    retention: entries.max(1),
                    checkpoints: BTreeMap::new(),
                    dead_letters: BTreeMap::new(),
                    dead_letter_max_bytes: crate::port::codec::MAX_BSON_RECORD_BYTES,
                    leases: BTreeMap::new(),
                    dead_letter_fence: None,
                    faults: Default::default(),
                }),
                appended: Notify::new(),
                epoch: tokio::time::Instant::now(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    /// The database used when a stream or collection names none.
    pub fn default_database(&self) -> String {
        self.lock().default_database.clone()
    }

    /// Sets the default database.
    pub fn set_default_database(&self, db: impl Into<String>) {
        self.lock().default_database = db.into();
    }

    /// A collection of the default database.
    pub fn collection(&self, name: &str) -> MemoryCollection {
        let db = self.default_database();
        self.collection_in(&db, name)
    }

    /// A collection of a named database.
    pub fn collection_in(&self, db: &str, name: &str) -> MemoryCollection {
        MemoryCollection::new(self.clone(), db, name)
    }

    /// Fences this backend's dead-letter puts by the leases of `leases` instead of its own, for
    /// a [`Backend`] whose lease store lives elsewhere (the Redis one, say) while its dead
    /// letters stay in memory: a put carrying an epoch is then checked against `leases`' current
    /// lease of the record's stream, before and after it is stored (a put deposed in between
    /// removes what it stored, as on MongoDB).
    pub fn fence_dead_letters_by(&self, leases: Arc<dyn crate::port::LeaseStore>) {
        self.lock().dead_letter_fence = Some(leases);
    }

    /// Fault injection (feature `test-util`).
    #[cfg(feature = "test-util")]
    pub fn faults(&self) -> Faults {
        Faults::new(self.clone())
    }

    /// Changes how many oplog entries are kept, dropping older ones now if needed.
    pub fn set_retention(&self, entries: usize) {
        let mut st = self.lock();
        st.retention = entries.max(1);
        st.enforce_retention();
    }

    /// Number of oplog entries ever written (the sequence number of the last one).
    pub fn oplog_head(&self) -> u64 {
        self.lock().next_seq - 1
    }

    /// Sequence number of the oldest retained oplog entry (`oplog_head() + 1` when empty).
    pub fn oplog_first_retained(&self) -> u64 {
        self.lock().first_retained()
    }

    /// The stored checkpoint document of a stream, as written.
    pub fn checkpoint_document(&self, stream: &str) -> Option<Document> {
        self.lock().checkpoints.get(stream).cloned()
    }

    /// Stores a raw checkpoint document (feature `test-util`: for tests of corrupt checkpoints).
    #[cfg(feature = "test-util")]
    pub fn put_checkpoint_document(&self, stream: &str, doc: Document) {
        self.lock().checkpoints.insert(stream.to_owned(), doc);
    }

    /// Limits the encoded size of a dead-letter record (default just under 16 MiB).
    pub fn set_dead_letter_max_bytes(&self, bytes: usize) {
        self.lock().dead_letter_max_bytes = bytes;
    }

    pub(crate) fn wall_time(&self) -> bson::DateTime {
        // Virtual under `tokio::time::pause`, so simulations are deterministic.
        bson::DateTime::from_millis(Self::EPOCH_MS + self.shared.epoch.elapsed().as_millis() as i64)
    }

    /// The backend's clock starts at 2026-01-01T00:00:00Z when it is created.
    const EPOCH_MS: i64 = 1_767_225_600_000;

    /// The time the backend was created, on its clock.
    pub(crate) fn epoch_time(&self) -> bson::DateTime {
        bson::DateTime::from_millis(Self::EPOCH_MS)
    }

    pub(crate) fn notify_appended(&self) {
        self.shared.appended.notify_waiters();
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl State {
    fn first_retained(&self) -> u64 {
        self.oplog.front().map(|e| e.seq).unwrap_or(self.next_seq)
    }

    fn enforce_retention(&mut self) {
        while self.oplog.len() > self.retention {
            self.oplog.pop_front();
        }
    }
}

impl From<MemoryBackend> for Backend {
    fn from(m: MemoryBackend) -> Self {
        let m = Arc::new(m);
        Backend {
            default_database: m.default_database(),
            source: m.clone(),
            checkpoints: m.clone(),
            dead_letters: Some(m.clone()),
            transactions: Some(Arc::new(MemoryTransactions::new((*m).clone()))),
            leases: Some(m),
        }
    }
}

/// Default wait of an idle read when the spec asks for none.
pub(crate) const DEFAULT_AWAIT: Duration = Duration::from_millis(1000);
