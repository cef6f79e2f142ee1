//! [`Builder`]: which streams, on which backend, with which settings; and starting them.

use std::time::Duration;

use tracing::info;

use super::discovery::{check_deployments, check_guard_timing, log_warnings};
use super::handle::{Runtime, RuntimeHandle};
use super::supervisor::Inner;
use super::StartupError;
use crate::backend::Backend;
use crate::definition::LeaseConfig;
use crate::engine::{AnyStream, EngineOptions, LagConfig};
use crate::handler::StreamHandler;
use crate::port::BackendDriver;
use crate::runtime::InstanceId;

/// Configures and starts a [`Runtime`].
pub struct Builder {
    pub(super) instances: Vec<AnyStream>,
    pub(super) discover: bool,
    pub(super) only: Option<Vec<String>>,
    pub(super) backend: Option<Backend>,
    pub(super) without_dead_letters: bool,
    pub(super) instance: Option<InstanceId>,
    pub(super) options: EngineOptions,
    /// Drivers consulted first when no backend is given (see [`Builder::driver`]).
    pub(super) drivers: Vec<&'static dyn BackendDriver>,
    /// The admin API's address and token as given to the builder (feature `admin`).
    #[cfg(feature = "admin")]
    pub(super) admin: crate::admin::AdminSettings,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    /// Defaults: discover registered streams, in-memory backend unless configured otherwise.
    pub fn new() -> Self {
        Self {
            instances: Vec::new(),
            discover: true,
            only: None,
            backend: None,
            without_dead_letters: false,
            instance: None,
            drivers: Vec::new(),
            #[cfg(feature = "admin")]
            admin: crate::admin::AdminSettings::default(),
            options: EngineOptions {
                shutdown_timeout: Duration::from_secs(30),
                batch_size: 256,
                max_await: Duration::from_millis(1000),
                default_database: "flowwarden".into(),
                seed: std::process::id() as u64 ^ 0x5EED,
                dead_letter_write_attempts: 5,
                #[cfg(feature = "test-util")]
                checkpoint_on_receipt: false,
                #[cfg(feature = "test-util")]
                checkpoint_highest_completed: false,
                #[cfg(feature = "test-util")]
                unkeyed_concurrency: false,
                #[cfg(feature = "test-util")]
                snapshot_start_after_scan: false,
                #[cfg(feature = "test-util")]
                snapshot_rescan_from_zero: false,
                #[cfg(feature = "test-util")]
                transaction_hook: None,
                #[cfg(feature = "test-util")]
                checkpoint_outside_transaction: false,
                #[cfg(feature = "test-util")]
                no_freeze_after_unknown_outcome: false,
                checkpoint_guard: LeaseConfig::DEFAULT,
                lag: LagConfig::default(),
            },
        }
    }

    /// Supplies a constructed handler instance (instead of `Default`) for its stream.
    pub fn stream<H: StreamHandler>(mut self, handler: H) -> Self {
        self.instances.push(AnyStream::new(handler));
        self
    }

    /// Supplies a type-erased stream instance.
    pub fn any_stream(mut self, stream: AnyStream) -> Self {
        self.instances.push(stream);
        self
    }

    /// Whether streams registered with `#[change_stream]` are started without being named
    /// here (default true). With `false`, only streams given to [`Builder::stream`] run.
    pub fn discover(mut self, discover: bool) -> Self {
        self.discover = discover;
        self
    }

    /// Runs only the streams with these names.
    pub fn only<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.only = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Uses this backend (source and stores).
    pub fn backend(mut self, backend: impl Into<Backend>) -> Self {
        self.backend = Some(backend.into());
        self
    }

    /// Consults `driver` first when no backend is given: the backend is the one it configures
    /// from the environment, if it answers (see [`crate::port::BackendDriver`]).
    pub fn driver(mut self, driver: &'static dyn BackendDriver) -> Self {
        self.drivers.push(driver);
        self
    }

    /// Runs without a dead-letter store: a failure that exhausts its retries halts the stream
    /// (nothing is ever dropped).
    pub fn without_dead_letters(mut self) -> Self {
        self.without_dead_letters = true;
        self
    }

    /// This instance's identity (default: `FLOWWARDEN_INSTANCE_ID`, else host name, process
    /// id and a random suffix). Give each replica a stable one: `AllInstances` checkpoints are
    /// kept per instance when it is configured.
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance = Some(InstanceId::configured(id));
        self
    }

    /// Test-only (feature `test-util`): this exact identity, configured or not (see
    /// [`InstanceId::unconfigured`]).
    #[cfg(feature = "test-util")]
    pub fn instance_identity(mut self, id: InstanceId) -> Self {
        self.instance = Some(id);
        self
    }

    /// How long a stop waits for an in-flight handler (default 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.options.shutdown_timeout = timeout;
        self
    }

    /// Events per batch asked from the source (default 256).
    pub fn batch_size(mut self, n: u32) -> Self {
        self.options.batch_size = n.max(1);
        self
    }

    /// How long a read waits on an idle stream before reporting an idle tick (default 1 s).
    pub fn max_await(mut self, d: Duration) -> Self {
        self.options.max_await = d;
        self
    }

    /// Seed of the retry jitter (default: derived from the process id).
    pub fn seed(mut self, seed: u64) -> Self {
        self.options.seed = seed;
        self
    }

    /// Timing of the checkpoint guard that `AllInstances` streams take when this instance's
    /// identity is not configured (default: [`LeaseConfig::DEFAULT`], lease 30 s, renewed every
    /// 10 s, polled every 5 s). After a crash, the next instance waits at most one lease period
    /// plus one poll for the crashed one's guard to expire; a graceful shutdown frees it at once.
    pub fn checkpoint_guard(mut self, timing: LeaseConfig) -> Self {
        self.options.checkpoint_guard = timing;
        self
    }

    /// How many times a dead-letter write is tried before the stream halts (default 5).
    pub fn dead_letter_write_attempts(mut self, n: u32) -> Self {
        self.options.dead_letter_write_attempts = n.max(1);
        self
    }

    /// Test-only (feature `test-util`): reintroduces the classic bug (a position counted as
    /// done on receipt) so a test can prove its checker catches it.
    #[cfg(feature = "test-util")]
    pub fn checkpoint_on_receipt(mut self, on: bool) -> Self {
        self.options.checkpoint_on_receipt = on;
        self
    }

    /// Test-only (feature `test-util`): the bug of concurrent consumers that checkpoint the
    /// highest completed event instead of the contiguous settled prefix, so a test can prove
    /// its checker catches it (only visible with `concurrency > 1`).
    #[cfg(feature = "test-util")]
    pub fn checkpoint_highest_completed(mut self, on: bool) -> Self {
        self.options.checkpoint_highest_completed = on;
        self
    }

    /// Test-only (feature `test-util`): streams with `concurrency > 1` run events without
    /// regard to their keys and barriers, so a test can prove its per-key order checker
    /// catches it.
    #[cfg(feature = "test-util")]
    pub fn unkeyed_concurrency(mut self, on: bool) -> Self {
        self.options.unkeyed_concurrency = on;
        self
    }

    /// Test-only (feature `test-util`): breaks the initial snapshot's rule on purpose, so a
    /// test can prove its checker catches it. A `start_position = Snapshot` stream takes its
    /// start position again *after* the scan and streams from there: the changes made while
    /// the scan ran are silently lost.
    #[cfg(feature = "test-util")]
    pub fn snapshot_start_after_scan(mut self, on: bool) -> Self {
        self.options.snapshot_start_after_scan = on;
        self
    }

    /// Test-only (feature `test-util`): a stream that finds an unfinished initial snapshot
    /// scans the collection again from its first document instead of after the stored last
    /// `_id` (nothing is lost, but everything already read is read again), so a test can prove
    /// its checker catches it.
    #[cfg(feature = "test-util")]
    pub fn snapshot_rescan_from_zero(mut self, on: bool) -> Self {
        self.options.snapshot_rescan_from_zero = on;
        self
    }

    /// Test-only (feature `test-util`): runs `hook` at each step of a transactional attempt
    /// (before the commit is sent, after it returned) and awaits the future it returns, so a
    /// test can crash the process there (or hold the stream there while it crashes the
    /// runtime).
    #[cfg(feature = "test-util")]
    pub fn on_transaction_step(
        mut self,
        hook: impl Fn(crate::TransactionStep) -> futures::future::BoxFuture<'static, ()>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.options.transaction_hook = Some(crate::engine::transaction::TransactionHook(
            std::sync::Arc::new(hook),
        ));
        self
    }

    /// Test-only (feature `test-util`): the non-atomic design a transactional stream must not
    /// have: the handler's writes commit without the checkpoint, which is written afterwards
    /// like any other (every `save_every_n`), so a crash in between applies the writes twice.
    /// For tests that prove their exactly-once checker catches it.
    #[cfg(feature = "test-util")]
    pub fn checkpoint_outside_transaction(mut self, on: bool) -> Self {
        self.options.checkpoint_outside_transaction = on;
        self
    }

    /// Test-only (feature `test-util`): a transactional stream does not freeze its plain
    /// checkpoint writes after a transaction whose outcome it does not know (a commit reported
    /// `CommitUnknown`, or an attempt a stop abandoned): its final flush may then write the
    /// settled prefix *before* an event whose commit did apply, moving the checkpoint back, so
    /// the restart applies that event's writes again. For tests that prove their checkers
    /// catch it.
    #[cfg(feature = "test-util")]
    pub fn no_freeze_after_unknown_outcome(mut self, on: bool) -> Self {
        self.options.no_freeze_after_unknown_outcome = on;
        self
    }

    /// How lag against the source's retained history is sampled and judged: the interval
    /// (default 5 s; zero turns sampling off), how long a Running stream behind its source may
    /// make no progress before it counts as stalled (default 5 minutes; readiness then fails),
    /// and the headroom fraction of the window below which a WARN is logged (default 0.2).
    /// See docs/operations.md, "Lag and the oplog window".
    pub fn lag_sampling(mut self, lag: LagConfig) -> Self {
        self.options.lag = lag;
        self
    }

    /// Serves the HTTP admin API and `/metrics` on `addr` (feature `admin`; see
    /// `docs/operations.md`). Without this, `FLOWWARDEN_ADMIN_ADDR` is read at
    /// [`Builder::start`]; with neither, nothing is served. Port 0 binds a free port
    /// ([`RuntimeHandle::admin_addr`] tells which).
    #[cfg(feature = "admin")]
    pub fn admin(mut self, addr: std::net::SocketAddr) -> Self {
        self.admin.addr = Some(addr);
        self
    }

    /// The bearer token the admin API's mutating endpoints require (feature `admin`; default
    /// `FLOWWARDEN_ADMIN_TOKEN`). Without a token they answer 403.
    #[cfg(feature = "admin")]
    pub fn admin_token(mut self, token: impl Into<String>) -> Self {
        self.admin.token = Some(token.into());
        self
    }

    /// Validates everything and starts the enabled, auto-start streams.
    pub async fn start(mut self) -> Result<Runtime, StartupError> {
        let streams = self.collect_streams()?;
        let mut backend = self.resolve_backend().await?;
        if self.without_dead_letters {
            backend.dead_letters = None;
        }
        self.options.default_database = backend.default_database.clone();
        let instance = self.instance.take().unwrap_or_else(InstanceId::from_env);
        check_deployments(&streams, &backend)?;
        check_guard_timing(self.options.checkpoint_guard)?;
        info!(instance = %instance, configured = instance.is_configured(), "instance identity");
        for s in &streams {
            log_warnings(s.definition(), &backend, &instance);
        }
        let handle = RuntimeHandle::new(Inner::new(streams, backend, self.options, instance));
        super::lag_sampler::spawn(&handle.inner);
        #[cfg(feature = "admin")]
        if let Some(served) = crate::admin::launch(&handle, self.admin)
            .await
            .map_err(|e| StartupError {
                problems: vec![e.to_string()],
            })?
        {
            match handle.inner.admin.lock() {
                Ok(mut g) => *g = Some(served),
                Err(poisoned) => *poisoned.into_inner() = Some(served),
            }
        }
        for status in handle.streams() {
            let def = handle.definition(status.name);
            if def.is_some_and(|d| d.enabled && d.auto_start) {
                let _ = handle.start(status.name);
            } else {
                info!(
                    stream = status.name,
                    "stream registered but not started (enabled = false or auto_start = false)"
                );
            }
        }
        Ok(Runtime::new(handle))
    }
}
