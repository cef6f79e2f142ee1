//! Static stream definitions: what `#[change_stream]` and its companion attributes declare.
//!
//! Every type here is `const`-constructible so the macros can emit a `static` definition.
//! The defaults are FlowWarden's (see `docs/attributes.md`).

use std::time::Duration;

/// Everything declared about one stream, emitted by `#[change_stream]` as a `static`.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamDefinition {
    /// Unique stream name: the checkpoint key, the metrics label, the log field.
    pub name: &'static str,
    /// The Rust type that carries the handlers (for error messages).
    pub type_name: &'static str,
    /// Database to watch; `None` takes the client's default database.
    pub database: Option<&'static str>,
    /// Collection to watch.
    pub collection: &'static str,
    /// What the server puts in `fullDocument` for updates.
    pub full_document: FullDocument,
    /// What the server puts in `fullDocumentBeforeChange`.
    pub full_document_before_change: FullDocumentBeforeChange,
    /// A disabled stream is registered but never started.
    pub enabled: bool,
    /// When false the stream is registered and validated but waits for an explicit `start`.
    pub auto_start: bool,
    /// Checkpoint cadence and resume behaviour.
    pub checkpoint: CheckpointConfig,
    /// Handler retry policy.
    pub retry: RetryConfig,
    /// Backoff for re-opening a stream whose cursor died.
    pub restart: RestartConfig,
    /// How the stream runs when several instances of the service run.
    pub deployment: Deployment,
    /// How many events of the stream may be handled at once (keyed concurrency).
    pub concurrency: ConcurrencyConfig,
    /// Whether each handled event's writes (through the transaction handle its handler
    /// receives) and the stream's checkpoint commit in one transaction of the backend:
    /// exactly-once effects for writes into the same database. Requires `concurrency = 1` and a
    /// backend with a [`crate::port::TransactionStore`]; see `docs/exactly-once.md`.
    pub transactional: bool,
    /// Where the definition was written, for startup reports.
    pub source: SourceLocation,
}

/// A place in the user's source code, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceLocation {
    /// File, as `file!()` gives it.
    pub file: &'static str,
    /// Line, as `line!()` gives it.
    pub line: u32,
}

impl std::fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// The `fullDocument` option of the change stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FullDocument {
    /// Server default: the document is present for inserts and replaces only.
    #[default]
    Default,
    /// Updates carry the document as it is when the event is read (may be null if deleted).
    UpdateLookup,
    /// Updates carry the post-image when the collection stores it, else nothing.
    WhenAvailable,
    /// Updates carry the post-image; the server fails the stream when it is missing.
    Required,
}

impl FullDocument {
    /// The option's value on the wire, `None` for the server default.
    pub fn as_server_value(self) -> Option<&'static str> {
        match self {
            FullDocument::Default => None,
            FullDocument::UpdateLookup => Some("updateLookup"),
            FullDocument::WhenAvailable => Some("whenAvailable"),
            FullDocument::Required => Some("required"),
        }
    }
}

/// The `fullDocumentBeforeChange` option of the change stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FullDocumentBeforeChange {
    /// No pre-image (server default).
    #[default]
    Off,
    /// The pre-image when the collection stores it.
    WhenAvailable,
    /// The pre-image; the server fails the stream when it is missing.
    Required,
}

impl FullDocumentBeforeChange {
    /// The option's value on the wire, `None` when off.
    pub fn as_server_value(self) -> Option<&'static str> {
        match self {
            FullDocumentBeforeChange::Off => None,
            FullDocumentBeforeChange::WhenAvailable => Some("whenAvailable"),
            FullDocumentBeforeChange::Required => Some("required"),
        }
    }
}

/// Where a stream starts when it has no usable checkpoint, or always (`Latest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartPosition {
    /// Resume from the stored checkpoint (cascade); start at "now" only when none is stored.
    #[default]
    Resume,
    /// Ignore stored checkpoints and start at the current head.
    Latest,
    /// On the first start (no checkpoint stored), read the collection's existing documents
    /// first, then stream from a position recorded before that scan, so nothing committed
    /// before or during the scan is missed (`docs/checkpoint-resume.md`, "Initial snapshot").
    /// Later starts resume from the checkpoint as with `Resume`; a start that finds an
    /// unfinished scan continues it.
    Snapshot,
}

/// What to do when every stored token points before the oldest retained history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnHistoryLost {
    /// Halt the stream (state `HistoryLost`) and name the runbook. Nothing is skipped silently.
    #[default]
    Fail,
    /// Start again from the oldest retained oplog entry (replays what is still there).
    ResumeFromOplogStart,
    /// Start from now, accepting the gap; raises the history-lost metric and logs an error.
    ResumeFromNow,
}

/// Which stored token a resume tries first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResumeStrategy {
    /// The last processed (handled) token first, then the seen token.
    #[default]
    ProcessedFirst,
    /// The last seen (settled, including filtered and idle) token first, then the processed one.
    SeenFirst,
}

/// `#[checkpoint(..)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// Write the checkpoint after this many handled events (at least 1).
    pub save_every_n: u32,
    /// Heartbeat: write the latest settled position this often; 0 disables the heartbeat.
    pub save_interval_secs: u64,
    /// Where to start.
    pub start_position: StartPosition,
    /// What to do when history is lost.
    pub on_history_lost: OnHistoryLost,
    /// Which token the resume cascade tries first.
    pub resume_strategy: ResumeStrategy,
}

impl CheckpointConfig {
    /// FlowWarden's defaults.
    pub const DEFAULT: CheckpointConfig = CheckpointConfig {
        save_every_n: 1,
        save_interval_secs: 5,
        start_position: StartPosition::Resume,
        on_history_lost: OnHistoryLost::Fail,
        resume_strategy: ResumeStrategy::ProcessedFirst,
    };
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// `#[retry(..)]`: how a failing handler is retried before its event is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryConfig {
    /// Attempts in all, the first try included (at least 1).
    pub max_attempts: u32,
    /// Delay before the second attempt.
    pub initial_delay_ms: u64,
    /// Growth factor of the delay between attempts (at least 1.0).
    pub multiplier: f64,
    /// Upper bound of one delay.
    pub max_delay_ms: u64,
    /// Randomise each delay between half and all of its value.
    pub jitter: bool,
}

impl RetryConfig {
    /// FlowWarden's defaults.
    pub const DEFAULT: RetryConfig = RetryConfig {
        max_attempts: 3,
        initial_delay_ms: 500,
        multiplier: 2.0,
        max_delay_ms: 30_000,
        jitter: true,
    };

    /// The delay after failed attempt number `attempt` (1-based), before jitter.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        exponential_delay(
            self.initial_delay_ms,
            self.multiplier,
            self.max_delay_ms,
            attempt,
        )
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// `#[restart(..)]`: backoff for re-opening a stream whose cursor died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartConfig {
    /// Consecutive failed re-opens before the stream halts; 0 means unlimited.
    pub max_attempts: u32,
    /// First delay (never zero).
    pub initial_delay_ms: u64,
    /// Upper bound of one delay.
    pub max_delay_ms: u64,
}

impl RestartConfig {
    /// Defaults: unlimited attempts, 1 s doubling to 60 s.
    pub const DEFAULT: RestartConfig = RestartConfig {
        max_attempts: 0,
        initial_delay_ms: 1_000,
        max_delay_ms: 60_000,
    };

    /// The delay before re-open attempt number `attempt` (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        exponential_delay(self.initial_delay_ms, 2.0, self.max_delay_ms, attempt)
    }
}

impl Default for RestartConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How a stream runs across several instances of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Deployment {
    /// Every instance consumes every event, with its own checkpoint (FlowWarden's default).
    #[default]
    AllInstances,
    /// One instance at a time consumes the stream, holding a lease; the others stand by.
    /// Every checkpoint and dead-letter write carries the lease's fencing epoch.
    SingleLeader(LeaseConfig),
}

/// Lease timing of a `SingleLeader` stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long a lease lasts without renewal (judged by the lease store's clock).
    pub lease_secs: u64,
    /// How often the leader renews (well below `lease_secs`).
    pub renew_secs: u64,
    /// How often a standby tries to take the lease.
    pub standby_poll_secs: u64,
}

impl LeaseConfig {
    /// Defaults: lease 30 s, renew every 10 s, standby poll every 5 s.
    pub const DEFAULT: LeaseConfig = LeaseConfig {
        lease_secs: 30,
        renew_secs: 10,
        standby_poll_secs: 5,
    };

    /// The lease duration.
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_secs)
    }

    /// The renewal period.
    pub fn renew(&self) -> Duration {
        Duration::from_secs(self.renew_secs)
    }

    /// The standby poll period.
    pub fn standby_poll(&self) -> Duration {
        Duration::from_secs(self.standby_poll_secs)
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

fn exponential_delay(initial_ms: u64, multiplier: f64, max_ms: u64, attempt: u32) -> Duration {
    let exponent = attempt.saturating_sub(1).min(64) as i32;
    let factor = multiplier.max(1.0).powi(exponent);
    let ms = (initial_ms as f64 * factor).min(max_ms as f64);
    Duration::from_millis(ms.max(0.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_grows_and_is_capped() {
        let r = RetryConfig::DEFAULT;
        assert_eq!(r.base_delay(1), Duration::from_millis(500));
        assert_eq!(r.base_delay(2), Duration::from_millis(1000));
        assert_eq!(r.base_delay(3), Duration::from_millis(2000));
        assert_eq!(r.base_delay(30), Duration::from_millis(30_000));
    }

    #[test]
    fn restart_delay_doubles_to_cap() {
        let r = RestartConfig::DEFAULT;
        assert_eq!(r.delay(1), Duration::from_secs(1));
        assert_eq!(r.delay(2), Duration::from_secs(2));
        assert_eq!(r.delay(100), Duration::from_secs(60));
    }
}

/// Keyed concurrency inside one stream: `#[change_stream(concurrency = N, max_in_flight = M)]`.
///
/// With `concurrency = 1` (the default) events are handled one at a time, in stream order. With
/// `N > 1` up to `N` handlers run at once; events with the same key (the whole `documentKey`)
/// run one at a time in stream order, and an event without a document key (`drop`, `rename`,
/// `dropDatabase`, `invalidate`, unknown types) is a barrier: everything before it settles
/// first, nothing after it starts before it settles. At most `max_in_flight` events are received
/// and not yet settled; the reader waits beyond that. See `docs/how-it-works.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencyConfig {
    /// Handlers running at once, at least 1.
    pub concurrency: u32,
    /// Events received but not settled, at most; 0 means the default, 4 x `concurrency`.
    pub max_in_flight: u32,
}

impl ConcurrencyConfig {
    /// One event at a time (FlowWarden's behaviour).
    pub const DEFAULT: ConcurrencyConfig = ConcurrencyConfig {
        concurrency: 1,
        max_in_flight: 0,
    };

    /// Handlers running at once (at least 1).
    pub fn concurrency(&self) -> usize {
        self.concurrency.max(1) as usize
    }

    /// The bound on received but unsettled events (at least `concurrency`).
    pub fn max_in_flight(&self) -> usize {
        let n = self.concurrency();
        match self.max_in_flight {
            0 => n.saturating_mul(4),
            m => (m as usize).max(n),
        }
    }
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}
