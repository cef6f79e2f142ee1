//! The stream tasks of a runtime: one slot per stream, how a stream's task is started in its
//! deployment mode (all instances, checkpoint guard, single leader), stopped, crashed, and
//! when every started stream has halted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{error, info};

use super::ControlError;
use crate::backend::Backend;
use crate::definition::Deployment;
use crate::engine::lag::PositionProbe;
use crate::engine::{
    run_guarded, run_single_leader, AnyStream, EngineOptions, StreamEnv, StreamExit,
};
use crate::runtime::InstanceId;
use crate::status::{Halt, StatusCell, StreamState};

/// One stream of the runtime: its instance, status, stop switch and running task.
pub(super) struct Slot {
    pub(super) stream: AnyStream,
    pub(super) status: Arc<StatusCell>,
    /// The worker's settled position, for the lag sampler.
    pub(super) probe: Arc<PositionProbe>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<StreamExit>>,
}

/// What every handle of one runtime shares.
pub(super) struct Inner {
    slots: Mutex<BTreeMap<&'static str, Slot>>,
    pub(super) backend: Backend,
    pub(super) options: Arc<EngineOptions>,
    pub(super) shutdown: watch::Sender<bool>,
    /// Notified whenever a stream task ends.
    pub(super) exited: Notify,
    instance: InstanceId,
    /// The admin API's bound address and server task (feature `admin`), when it is served.
    #[cfg(feature = "admin")]
    pub(super) admin: Mutex<Option<(std::net::SocketAddr, JoinHandle<()>)>>,
}

impl Inner {
    /// A runtime with these streams, none started yet.
    pub(super) fn new(
        streams: Vec<AnyStream>,
        backend: Backend,
        options: EngineOptions,
        instance: InstanceId,
    ) -> Arc<Self> {
        let slots = streams
            .into_iter()
            .map(|s| {
                let name = s.definition().name;
                let slot = Slot {
                    status: Arc::new(StatusCell::new(name)),
                    probe: Arc::new(PositionProbe::default()),
                    stream: s,
                    stop: watch::channel(false).0,
                    task: None,
                };
                (name, slot)
            })
            .collect();
        Arc::new(Self {
            slots: Mutex::new(slots),
            backend,
            options: Arc::new(options),
            shutdown: watch::channel(false).0,
            exited: Notify::new(),
            instance,
            #[cfg(feature = "admin")]
            admin: Mutex::new(None),
        })
    }

    pub(super) fn lock_slots(&self) -> MutexGuard<'_, BTreeMap<&'static str, Slot>> {
        match self.slots.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Starts a stopped stream's task in its deployment mode (a no-op when it is running).
    pub(super) fn start_stream(self: &Arc<Self>, name: &str) -> Result<(), ControlError> {
        if *self.shutdown.borrow() {
            return Err(ControlError::ShuttingDown);
        }
        let mut slots = self.lock_slots();
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
        let instance = &self.instance;
        let checkpoint_key = match def.deployment {
            Deployment::AllInstances if instance.is_configured() => {
                format!("{}@{}", def.name, instance)
            }
            _ => def.name.to_owned(),
        };
        // A transactional stream keeps its checkpoint where its transactions commit it.
        let transactions = def
            .transactional
            .then(|| self.backend.transactions.clone())
            .flatten();
        let checkpoints = transactions
            .as_ref()
            .map_or_else(|| self.backend.checkpoints.clone(), |t| t.checkpoints());
        let env = StreamEnv {
            source: self.backend.source.clone(),
            checkpoints,
            transactions,
            dead_letters: self.backend.dead_letters.clone(),
            status: slot.status.clone(),
            probe: slot.probe.clone(),
            stop: stop_rx,
            options: self.options.clone(),
            checkpoint_key,
            fence: None,
            instance: instance.to_string(),
        };
        let fut: BoxFuture<'static, StreamExit> = match (def.deployment, &self.backend.leases) {
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
                    self.options.checkpoint_guard,
                ))
            }
            _ => slot.stream.inner.run(env),
        };
        let inner = Arc::downgrade(self);
        slot.task = Some(tokio::spawn(async move {
            let exit = fut.await;
            if let Some(inner) = inner.upgrade() {
                inner.exited.notify_waiters();
            }
            exit
        }));
        Ok(())
    }

    /// Asks a stream to stop gracefully and waits for its task.
    pub(super) async fn stop_stream(&self, name: &str) -> Result<(), ControlError> {
        let task = {
            let mut slots = self.lock_slots();
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

    /// Stops every stream gracefully, aborting one that outlives the shutdown timeout.
    pub(super) async fn shutdown_and_wait(&self) {
        let _ = self.shutdown.send(true);
        let tasks: Vec<(&'static str, JoinHandle<StreamExit>)> = {
            let mut slots = self.lock_slots();
            slots
                .iter_mut()
                .filter_map(|(name, slot)| {
                    let _ = slot.stop.send(true);
                    slot.task.take().map(|t| (*name, t))
                })
                .collect()
        };
        let grace = self.options.shutdown_timeout + Duration::from_secs(5);
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
        #[cfg(feature = "admin")]
        self.stop_admin().await;
        info!("flowwarden shut down");
    }

    /// Aborts every stream task where it stands (a simulated process crash).
    #[cfg(feature = "test-util")]
    pub(super) async fn crash(&self) {
        let _ = self.shutdown.send(true);
        let tasks: Vec<JoinHandle<StreamExit>> = self
            .lock_slots()
            .values_mut()
            .filter_map(|slot| slot.task.take())
            .collect();
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
        #[cfg(feature = "admin")]
        if let Some((_, task)) = self.take_admin() {
            task.abort();
            let _ = task.await;
        }
    }

    #[cfg(feature = "admin")]
    fn take_admin(&self) -> Option<(std::net::SocketAddr, JoinHandle<()>)> {
        match self.admin.lock() {
            Ok(mut g) => g.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        }
    }

    /// Waits for the admin server, which stops on the shutdown signal after answering the
    /// requests in progress; aborts it after a few seconds.
    #[cfg(feature = "admin")]
    async fn stop_admin(&self) {
        if let Some((addr, task)) = self.take_admin() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                error!(%addr, "admin API did not stop within 5 s; aborting it");
                abort.abort();
            }
        }
    }

    /// The halts of every started stream, once every one of them has halted.
    pub(super) fn all_halted(&self) -> Option<Vec<Halt>> {
        let slots = self.lock_slots();
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
}
