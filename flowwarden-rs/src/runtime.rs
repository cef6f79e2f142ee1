//! Starting, supervising and controlling streams: [`run()`], [`builder()`], [`Runtime`],
//! [`RuntimeHandle`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::backend::{Backend, BackendProvider};
use crate::dead_letter::{DeadLetterQuery, DeadLetterRecord, DeadLetterStatus, DeadLetterStore};
use crate::definition::{Deployment, LeaseConfig, OnHistoryLost, StreamDefinition};
use crate::engine::{
    guard_name, run_guarded, run_single_leader, EngineOptions, StreamEnv, StreamExit,
};
use crate::handler::{AnyStream, StreamHandler};
use crate::handler_error::HandlerError;
use crate::lease::InstanceId;
use crate::memory::MemoryBackend;
use crate::registry;
use crate::status::{Halt, StatusCell, StreamState, StreamStatus};
use crate::store_error::StoreError;

/// Builds a runtime: which streams, on which backend, with which settings.
pub fn builder() -> Builder {
    Builder::new()
}

/// Runs every registered stream until Ctrl-C (or SIGTERM), then shuts down gracefully.
///
/// The backend is MongoDB when `FLOWWARDEN_MONGODB_URI` is set and the `flowwarden-rs-mongo`
/// crate is linked, else the embedded in-memory backend (logged). Everything is validated
/// before any stream starts; every problem is reported at once.
pub async fn run() -> Result<(), RunError> {
    builder().start().await?.run_until_signal().await
}

/// Startup validation failed: every problem found, not just the first.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("flowwarden cannot start: {} problem(s):\n{}", problems.len(), problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
pub struct StartupError {
    /// Each problem, with the stream and what to do.
    pub problems: Vec<String>,
}

/// Why [`Runtime::wait`] (or [`run()`]) returned an error.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum RunError {
    /// Validation failed before anything started.
    #[error(transparent)]
    Startup(#[from] StartupError),
    /// Every started stream halted; each halt names its runbook.
    #[error("every stream halted:\n{}", .0.iter().map(|h| format!("  - {h}")).collect::<Vec<_>>().join("\n"))]
    AllHalted(Vec<Halt>),
}

/// A runtime control request that could not be honoured.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ControlError {
    /// No stream has this name.
    #[error("no stream named '{0}'")]
    UnknownStream(String),
    /// The stream is disabled (`enabled = false`).
    #[error("stream '{0}' is disabled (enabled = false)")]
    Disabled(String),
    /// The runtime is shutting down.
    #[error("the runtime is shutting down")]
    ShuttingDown,
}

/// A dead-letter operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// No dead-letter store is configured.
    #[error("no dead-letter store is configured")]
    NoStore,
    /// No record has this id.
    #[error("no dead-letter record '{0}'")]
    NotFound(String),
    /// The record's stream is not part of this runtime.
    #[error(
        "dead-letter record '{id}' belongs to stream '{stream}', which this runtime does not run"
    )]
    UnknownStream {
        /// The record.
        id: String,
        /// Its stream.
        stream: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The handler failed again; the record stays pending.
    #[error("replay of '{id}' failed: {error:#}")]
    ReplayFailed {
        /// The record.
        id: String,
        /// The handler's error.
        error: HandlerError,
    },
}

/// Configures and starts a [`Runtime`].
pub struct Builder {
    instances: Vec<AnyStream>,
    discover: bool,
    only: Option<Vec<String>>,
    backend: Option<Backend>,
    without_dead_letters: bool,
    instance: Option<InstanceId>,
    options: EngineOptions,
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
            options: EngineOptions {
                shutdown_timeout: Duration::from_secs(30),
                batch_size: 256,
                max_await: Duration::from_millis(1000),
                default_database: "flowwarden".into(),
                seed: std::process::id() as u64 ^ 0x5EED,
                dead_letter_write_attempts: 5,
                checkpoint_on_receipt: false,
                checkpoint_guard: LeaseConfig::DEFAULT,
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

    /// Test-only: reintroduces the classic bug (a position counted as done on receipt) so a
    /// test can prove its checker catches it. Never use this in production.
    #[doc(hidden)]
    pub fn __checkpoint_on_receipt(mut self, on: bool) -> Self {
        self.options.checkpoint_on_receipt = on;
        self
    }

    /// Gathers the streams and checks everything that can be checked before starting.
    fn collect_streams(&self) -> Result<Vec<AnyStream>, StartupError> {
        let mut problems = Vec::new();
        let mut chosen: Vec<AnyStream> = Vec::new();
        let mut supplied = self.instances.clone();
        if self.discover {
            for reg in registry::registered() {
                let def = (reg.definition)();
                if let Some(i) = supplied.iter().position(|s| s.type_id == (reg.type_id)()) {
                    chosen.push(supplied.remove(i));
                } else if let Some(s) = (reg.build_default)() {
                    chosen.push(s);
                } else if self.wanted(def.name) {
                    problems.push(format!(
                        "stream '{}' ({} at {}) has no `Default` impl: pass an instance with `flowwarden::builder().stream({}::new(..))`",
                        def.name, def.type_name, def.source, def.type_name
                    ));
                }
            }
        }
        chosen.extend(supplied);
        chosen.retain(|s| self.wanted(s.definition().name));
        if let Some(only) = &self.only {
            for name in only {
                if !chosen.iter().any(|s| s.definition().name == name) {
                    problems.push(format!(
                        "`only` names stream '{name}', which is not registered"
                    ));
                }
            }
        }
        let mut by_name: BTreeMap<&str, &StreamDefinition> = BTreeMap::new();
        for s in &chosen {
            let def = s.definition();
            if let Some(first) = by_name.insert(def.name, def) {
                problems.push(format!(
                    "two streams are named '{}': {} at {} and {} at {}; give one a different `name`",
                    def.name, first.type_name, first.source, def.type_name, def.source
                ));
            }
            problems.extend(check_definition(def));
        }
        if chosen.is_empty() && problems.is_empty() {
            problems.push(
                "no change stream is registered: annotate an impl with #[change_stream(..)] (if you did, make sure the crate that defines it is linked: reference one of its items from main)".into(),
            );
        }
        if problems.is_empty() {
            Ok(chosen)
        } else {
            Err(StartupError { problems })
        }
    }

    fn wanted(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|n| n == name))
    }

    async fn resolve_backend(&mut self) -> Result<Backend, StartupError> {
        if let Some(b) = self.backend.take() {
            return Ok(b);
        }
        let uri_set = std::env::var_os("FLOWWARDEN_MONGODB_URI").is_some();
        if let Some(provider) = inventory::iter::<BackendProvider>.into_iter().next() {
            if let Some(result) = (provider.from_env)().await {
                return result.map_err(|problems| StartupError { problems });
            }
        } else if uri_set {
            return Err(StartupError {
                problems: vec!["FLOWWARDEN_MONGODB_URI is set but the MongoDB backend is not linked: add the `flowwarden-rs-mongo` crate and reference it (or unset the variable to use the in-memory backend)".into()],
            });
        }
        info!("using the embedded in-memory backend: nothing persists across process restarts (set FLOWWARDEN_MONGODB_URI for MongoDB)");
        Ok(MemoryBackend::new().into())
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
        let leaderless: Vec<String> = streams
            .iter()
            .map(|s| s.definition())
            .filter(|d| {
                matches!(d.deployment, Deployment::SingleLeader(_)) && backend.leases.is_none()
            })
            .map(|d| {
                format!(
                    "stream '{}' is SingleLeader but the backend has no lease store",
                    d.name
                )
            })
            .collect();
        if !leaderless.is_empty() {
            return Err(StartupError {
                problems: leaderless,
            });
        }
        let guard = self.options.checkpoint_guard;
        if guard.renew_secs == 0
            || guard.standby_poll_secs == 0
            || guard.renew_secs * 2 > guard.lease_secs
        {
            return Err(StartupError {
                problems: vec![format!(
                    "checkpoint_guard: renew_secs ({}) and standby_poll_secs ({}) must be at least 1, and renew_secs at most half of lease_secs ({})",
                    guard.renew_secs, guard.standby_poll_secs, guard.lease_secs
                )],
            });
        }
        info!(instance = %instance, configured = instance.is_configured(), "instance identity");
        for s in &streams {
            log_warnings(s.definition(), backend.dead_letters.is_some());
            if s.definition().deployment == Deployment::AllInstances && !instance.is_configured() {
                if backend.leases.is_some() {
                    info!(stream = s.definition().name, guard = %guard_name(s.definition().name), "AllInstances without a configured instance identity: one instance runs this stream under the checkpoint named after it, holding its checkpoint guard; a second instance halts (SharedCheckpoint) instead of sharing it. Give each replica a stable FLOWWARDEN_INSTANCE_ID to run several (docs/deployment.md)");
                } else {
                    warn!(stream = s.definition().name, "AllInstances without a configured instance identity on a backend without a lease store: the checkpoint is kept under the stream name and nothing stops two instances from sharing it (which loses events). Run one instance, give each a stable FLOWWARDEN_INSTANCE_ID, or add a lease store (docs/runbooks/shared-checkpoint.md)");
                }
            }
        }
        let (shutdown, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            slots: Mutex::new(BTreeMap::new()),
            backend,
            options: Arc::new(self.options),
            shutdown,
            exited: Notify::new(),
            instance,
        });
        {
            let mut slots = inner.lock_slots();
            for s in streams {
                let name = s.definition().name;
                slots.insert(
                    name,
                    Slot {
                        status: Arc::new(StatusCell::new(name)),
                        stream: s,
                        stop: watch::channel(false).0,
                        task: None,
                    },
                );
            }
        }
        let handle = RuntimeHandle { inner };
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
        Ok(Runtime { handle })
    }
}

fn check_definition(def: &StreamDefinition) -> Vec<String> {
    let mut p = Vec::new();
    let at = format!(
        "stream '{}' ({} at {})",
        def.name, def.type_name, def.source
    );
    if def.name.trim().is_empty() {
        p.push(format!("{at}: the name is empty"));
    }
    if def.collection.trim().is_empty() {
        p.push(format!("{at}: the collection is empty"));
    }
    if def.checkpoint.save_every_n == 0 {
        p.push(format!("{at}: save_every_n must be at least 1"));
    }
    if def.retry.max_attempts == 0 {
        p.push(format!(
            "{at}: retry max_attempts must be at least 1 (it counts the first try)"
        ));
    }
    if def.restart.initial_delay_ms == 0 {
        p.push(format!("{at}: restart initial_delay_ms must not be 0"));
    }
    p
}

/// Warnings a macro cannot emit on stable Rust, logged at startup.
fn log_warnings(def: &StreamDefinition, has_dead_letters: bool) {
    let c = &def.checkpoint;
    if c.save_interval_secs == 0 && c.save_every_n > 1 {
        warn!(stream = def.name, "save_interval_secs = 0 with save_every_n = {}: no heartbeat writes the settled position, so after a crash up to {} handled events are delivered again and filtered-out or idle progress is not saved until the next handled batch", c.save_every_n, c.save_every_n - 1);
    }
    if c.on_history_lost == OnHistoryLost::ResumeFromNow {
        warn!(stream = def.name, "on_history_lost = ResumeFromNow accepts a gap when history is lost (it is logged and counted, but the changes are not delivered)");
    }
    if !has_dead_letters {
        warn!(
            stream = def.name,
            "no dead-letter store: an event that exhausts its retries halts the stream"
        );
    }
}

/// A started runtime. Dropping it does not stop the streams; call [`Runtime::shutdown`].
pub struct Runtime {
    handle: RuntimeHandle,
}

impl Runtime {
    /// A cloneable handle for status and control.
    pub fn handle(&self) -> RuntimeHandle {
        self.handle.clone()
    }

    /// Waits until shutdown is requested (then shuts down gracefully and returns `Ok`), or
    /// until every started stream has halted (returns [`RunError::AllHalted`]).
    pub async fn wait(self) -> Result<(), RunError> {
        let inner = self.handle.inner.clone();
        let mut shutdown = inner.shutdown.subscribe();
        loop {
            let exited = inner.exited.notified();
            tokio::pin!(exited);
            exited.as_mut().enable();
            if *shutdown.borrow() {
                self.handle.shutdown_and_wait().await;
                return Ok(());
            }
            if let Some(halts) = self.handle.all_halted() {
                return Err(RunError::AllHalted(halts));
            }
            tokio::select! {
                _ = shutdown.changed() => {}
                _ = &mut exited => {}
            }
        }
    }

    /// Like [`Runtime::wait`], and also shuts down on Ctrl-C or SIGTERM.
    pub async fn run_until_signal(self) -> Result<(), RunError> {
        let handle = self.handle.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            info!("shutdown signal received");
            handle.shutdown();
        });
        self.wait().await
    }

    /// Stops every stream gracefully (in-flight handlers get the shutdown timeout, settled
    /// progress is flushed) and waits for them.
    pub async fn shutdown(self) {
        self.handle.shutdown_and_wait().await;
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

struct Slot {
    stream: AnyStream,
    status: Arc<StatusCell>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<StreamExit>>,
}

struct Inner {
    slots: Mutex<BTreeMap<&'static str, Slot>>,
    backend: Backend,
    options: Arc<EngineOptions>,
    shutdown: watch::Sender<bool>,
    exited: Notify,
    instance: InstanceId,
}

impl Inner {
    fn lock_slots(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Slot>> {
        match self.slots.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// Status and control of a running [`Runtime`]; cheap to clone.
#[derive(Clone)]
pub struct RuntimeHandle {
    inner: Arc<Inner>,
}

impl RuntimeHandle {
    /// Every stream's status, by name.
    pub fn streams(&self) -> Vec<StreamStatus> {
        self.inner
            .lock_slots()
            .values()
            .map(|s| s.status.snapshot())
            .collect()
    }

    /// One stream's status.
    pub fn status(&self, name: &str) -> Option<StreamStatus> {
        self.inner
            .lock_slots()
            .get(name)
            .map(|s| s.status.snapshot())
    }

    /// One stream's definition.
    pub fn definition(&self, name: &str) -> Option<&'static StreamDefinition> {
        self.inner
            .lock_slots()
            .get(name)
            .map(|s| s.stream.definition())
    }

    /// Waits until `name`'s status satisfies `pred` (wrap in a timeout in tests).
    pub async fn wait_for(
        &self,
        name: &str,
        pred: impl Fn(&StreamStatus) -> bool,
    ) -> Result<StreamStatus, ControlError> {
        let cell = self
            .inner
            .lock_slots()
            .get(name)
            .map(|s| s.status.clone())
            .ok_or_else(|| ControlError::UnknownStream(name.into()))?;
        Ok(cell.wait_until(pred).await)
    }

    /// Starts a stopped stream (a no-op when it is running).
    pub fn start(&self, name: &str) -> Result<(), ControlError> {
        if *self.inner.shutdown.borrow() {
            return Err(ControlError::ShuttingDown);
        }
        let mut slots = self.inner.lock_slots();
        let slot = slots
            .get_mut(name)
            .ok_or_else(|| ControlError::UnknownStream(name.into()))?;
        if !slot.stream.definition().enabled {
            return Err(ControlError::Disabled(name.into()));
        }
        if slot.task.as_ref().is_some_and(|t| !t.is_finished()) {
            return Ok(());
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        slot.stop = stop_tx;
        slot.status.set_state(StreamState::Starting);
        let def = slot.stream.definition();
        let instance = &self.inner.instance;
        let checkpoint_key = match def.deployment {
            Deployment::AllInstances if instance.is_configured() => {
                format!("{}@{}", def.name, instance)
            }
            _ => def.name.to_owned(),
        };
        let env = StreamEnv {
            source: self.inner.backend.source.clone(),
            checkpoints: self.inner.backend.checkpoints.clone(),
            dead_letters: self.inner.backend.dead_letters.clone(),
            status: slot.status.clone(),
            stop: stop_rx,
            options: self.inner.options.clone(),
            checkpoint_key,
            fence: None,
            instance: instance.to_string(),
        };
        let fut: futures::future::BoxFuture<'static, StreamExit> =
            match (def.deployment, &self.inner.backend.leases) {
                (Deployment::SingleLeader(cfg), Some(leases)) => Box::pin(run_single_leader(
                    slot.stream.inner.clone(),
                    env,
                    leases.clone(),
                    instance.to_string(),
                    cfg,
                )),
                (Deployment::AllInstances, Some(leases)) if !instance.is_configured() => {
                    Box::pin(run_guarded(
                        slot.stream.inner.clone(),
                        env,
                        leases.clone(),
                        self.inner.options.checkpoint_guard,
                    ))
                }
                _ => slot.stream.inner.run(env),
            };
        let inner = Arc::downgrade(&self.inner);
        slot.task = Some(tokio::spawn(async move {
            let exit = fut.await;
            if let Some(inner) = inner.upgrade() {
                inner.exited.notify_waiters();
            }
            exit
        }));
        Ok(())
    }

    /// Stops a stream gracefully and waits for it.
    pub async fn stop(&self, name: &str) -> Result<(), ControlError> {
        let task = {
            let mut slots = self.inner.lock_slots();
            let slot = slots
                .get_mut(name)
                .ok_or_else(|| ControlError::UnknownStream(name.into()))?;
            let _ = slot.stop.send(true);
            slot.task.take()
        };
        if let Some(task) = task {
            let _ = task.await;
        }
        Ok(())
    }

    /// Stops, then starts a stream.
    pub async fn restart(&self, name: &str) -> Result<(), ControlError> {
        self.stop(name).await?;
        self.start(name)
    }

    /// Asks every stream to stop; [`Runtime::wait`] then returns.
    pub fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
    }

    async fn shutdown_and_wait(&self) {
        let _ = self.inner.shutdown.send(true);
        let tasks: Vec<(&'static str, JoinHandle<StreamExit>)> = {
            let mut slots = self.inner.lock_slots();
            slots
                .iter_mut()
                .filter_map(|(name, slot)| {
                    let _ = slot.stop.send(true);
                    slot.task.take().map(|t| (*name, t))
                })
                .collect()
        };
        let grace = self.inner.options.shutdown_timeout + Duration::from_secs(5);
        for (name, task) in tasks {
            let abort = task.abort_handle();
            match tokio::time::timeout(grace, task).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => error!(stream = name, error = %e, "stream task failed"),
                Err(_) => {
                    error!(stream = name, "stream did not stop within the shutdown timeout; aborting it (unsettled events will be delivered again)");
                    abort.abort();
                }
            }
        }
        info!("flowwarden shut down");
    }

    /// Test-only: simulates a process crash. Every stream task is aborted where it stands:
    /// no handler is awaited and no checkpoint is flushed.
    #[doc(hidden)]
    pub async fn __crash(&self) {
        let _ = self.inner.shutdown.send(true);
        let tasks: Vec<JoinHandle<StreamExit>> = self
            .inner
            .lock_slots()
            .values_mut()
            .filter_map(|slot| slot.task.take())
            .collect();
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
    }

    fn all_halted(&self) -> Option<Vec<Halt>> {
        let slots = self.inner.lock_slots();
        let started: Vec<&Slot> = slots.values().filter(|s| s.task.is_some()).collect();
        if started.is_empty()
            || started
                .iter()
                .any(|s| s.task.as_ref().is_some_and(|t| !t.is_finished()))
        {
            return None;
        }
        let halts: Vec<Halt> = started
            .iter()
            .filter_map(|s| s.status.snapshot().halt)
            .collect();
        (halts.len() == started.len()).then_some(halts)
    }

    /// The dead-letter operations of this runtime.
    pub fn dead_letters(&self) -> DeadLetters {
        DeadLetters {
            handle: self.clone(),
        }
    }
}

/// Listing, replaying and discarding dead letters.
pub struct DeadLetters {
    handle: RuntimeHandle,
}

impl DeadLetters {
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
        let stream = self
            .handle
            .inner
            .lock_slots()
            .get(record.stream.as_str())
            .map(|s| s.stream.clone())
            .ok_or_else(|| DeadLetterError::UnknownStream {
                id: id.into(),
                stream: record.stream.clone(),
            })?;
        match stream.inner.replay(record.event.clone()).await {
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
