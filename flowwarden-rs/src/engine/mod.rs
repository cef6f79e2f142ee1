//! The stream engine: reading, routing, retrying, dead-lettering and checkpointing one stream.

mod alongside;
mod checkpoint_guard;
mod keyed;
pub(crate) mod lag;
mod leader;
mod metrics;
mod process;
mod reader;
mod resume;
mod rng;
pub(crate) mod snapshot;
mod stream;
pub(crate) mod tracker;
pub(crate) mod transaction;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::definition::LeaseConfig;
use crate::port::ChangeSource;
use crate::port::CheckpointStore;
use crate::port::DeadLetterStore;
use crate::port::Fence;
use crate::port::TransactionStore;
use crate::status::{Halt, StatusCell};

pub(crate) use checkpoint_guard::{guard_name, run_guarded};
pub use lag::LagConfig;
pub(crate) use leader::run_single_leader;
pub(crate) use rng::Rng;
pub use stream::AnyStream;
pub(crate) use stream::ErasedStream;
#[cfg(feature = "test-util")]
pub use transaction::TransactionStep;

/// Engine settings shared by every stream of a runtime.
#[derive(Debug, Clone)]
pub(crate) struct EngineOptions {
    pub(crate) shutdown_timeout: Duration,
    pub(crate) batch_size: u32,
    pub(crate) max_await: Duration,
    pub(crate) default_database: String,
    pub(crate) seed: u64,
    pub(crate) dead_letter_write_attempts: u32,
    /// Test-only: the classic bug switch (see `Builder::checkpoint_on_receipt`).
    #[cfg(feature = "test-util")]
    pub(crate) checkpoint_on_receipt: bool,
    /// Test-only: the highest-completed bug switch (see `Builder::checkpoint_highest_completed`).
    #[cfg(feature = "test-util")]
    pub(crate) checkpoint_highest_completed: bool,
    /// Test-only: the unkeyed-concurrency switch (see `Builder::unkeyed_concurrency`).
    #[cfg(feature = "test-util")]
    pub(crate) unkeyed_concurrency: bool,
    /// Test-only: the snapshot-start sabotage (see `Builder::snapshot_start_after_scan`).
    #[cfg(feature = "test-util")]
    pub(crate) snapshot_start_after_scan: bool,
    /// Test-only: the rescan sabotage (see `Builder::snapshot_rescan_from_zero`).
    #[cfg(feature = "test-util")]
    pub(crate) snapshot_rescan_from_zero: bool,
    /// Test-only: called at each step of a transactional attempt (see
    /// `Builder::on_transaction_step`).
    #[cfg(feature = "test-util")]
    pub(crate) transaction_hook: Option<transaction::TransactionHook>,
    /// Test-only: the non-atomic design (see `Builder::checkpoint_outside_transaction`).
    #[cfg(feature = "test-util")]
    pub(crate) checkpoint_outside_transaction: bool,
    /// Test-only: plain checkpoint writes go on after a transaction whose outcome is unknown
    /// (see `Builder::no_freeze_after_unknown_outcome`).
    #[cfg(feature = "test-util")]
    pub(crate) no_freeze_after_unknown_outcome: bool,
    /// Timing of the checkpoint guard of `AllInstances` streams without a configured identity.
    pub(crate) checkpoint_guard: LeaseConfig,
    /// How lag against the source's history is sampled and judged.
    pub(crate) lag: LagConfig,
}

/// Everything one stream task needs from the runtime.
pub(crate) struct StreamEnv {
    pub(crate) source: Arc<dyn ChangeSource>,
    pub(crate) checkpoints: Arc<dyn CheckpointStore>,
    pub(crate) dead_letters: Option<Arc<dyn DeadLetterStore>>,
    pub(crate) status: Arc<StatusCell>,
    /// Where the worker publishes its settled position for the lag sampler.
    pub(crate) probe: Arc<lag::PositionProbe>,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) options: Arc<EngineOptions>,
    /// The `_id` of this stream's checkpoint (the stream name, or `name@instance`).
    pub(crate) checkpoint_key: String,
    /// The leader's fence (`SingleLeader` streams while they hold the lease).
    pub(crate) fence: Option<Fence>,
    /// This instance's identity, stamped as the owner of every checkpoint it writes.
    pub(crate) instance: String,
    /// The backend's transactions, for `transactional = true` streams (whose `checkpoints`
    /// is then the store the commits write to).
    pub(crate) transactions: Option<Arc<dyn TransactionStore>>,
}

/// How a stream task ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StreamExit {
    /// Stopped on request, progress flushed.
    Stopped,
    /// Halted; the status names the runbook.
    Halted(Halt),
}

/// Aborts a helper task when its owner ends or is dropped (a crash included): the reader of
/// a session, a leader's renewal loop, a checkpoint write running behind the stream; so a
/// dead stream never keeps reading, renewing or writing.
pub(crate) struct AbortOnDrop<T = ()>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
