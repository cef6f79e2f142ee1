//! [`Runtime`] and [`RuntimeHandle`]: waiting for a runtime, reading every stream's status and
//! starting, stopping and restarting streams.

use std::sync::Arc;

use tracing::info;

use super::supervisor::Inner;
use super::{ControlError, DeadLetters, RunError};
use crate::definition::StreamDefinition;
use crate::status::StreamStatus;

/// A started runtime. Dropping it does not stop the streams; call [`Runtime::shutdown`].
pub struct Runtime {
    handle: RuntimeHandle,
}

impl Runtime {
    pub(super) fn new(handle: RuntimeHandle) -> Self {
        Self { handle }
    }

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
                self.handle.inner.shutdown_and_wait().await;
                return Ok(());
            }
            if let Some(halts) = self.handle.inner.all_halted() {
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
            super::signal::wait_for_signal().await;
            info!("shutdown signal received");
            handle.shutdown();
        });
        self.wait().await
    }

    /// Stops every stream gracefully (in-flight handlers get the shutdown timeout, settled
    /// progress is flushed) and waits for them.
    pub async fn shutdown(self) {
        self.handle.inner.shutdown_and_wait().await;
    }
}

/// Status and control of a running [`Runtime`]; cheap to clone.
#[derive(Clone)]
pub struct RuntimeHandle {
    pub(super) inner: Arc<Inner>,
}

impl RuntimeHandle {
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

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
        self.inner.start_stream(name)
    }

    /// Stops a stream gracefully and waits for it.
    pub async fn stop(&self, name: &str) -> Result<(), ControlError> {
        self.inner.stop_stream(name).await
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

    /// Test-only (feature `test-util`): simulates a process crash. Every stream task is
    /// aborted where it stands: no handler is awaited and no checkpoint is flushed.
    #[cfg(feature = "test-util")]
    pub async fn crash(&self) {
        self.inner.crash().await;
    }

    /// The address the admin API listens on (feature `admin`), or `None` when it is not served
    /// (neither [`crate::Builder::admin`] nor `FLOWWARDEN_ADMIN_ADDR` asked for it). Useful
    /// after binding port 0.
    #[cfg(feature = "admin")]
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        match self.inner.admin.lock() {
            Ok(g) => g.as_ref().map(|(addr, _)| *addr),
            Err(poisoned) => poisoned.into_inner().as_ref().map(|(addr, _)| *addr),
        }
    }

    /// A receiver that turns `true` once shutdown is requested (the admin server stops then).
    #[cfg(feature = "admin")]
    pub(crate) fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.shutdown.subscribe()
    }

    /// The dead-letter operations of this runtime.
    pub fn dead_letters(&self) -> DeadLetters {
        DeadLetters::new(self.clone())
    }
}
