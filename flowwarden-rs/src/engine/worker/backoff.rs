//! The restart backoff after a source failure, and the stop signal it races.

use tracing::warn;

use super::Worker;
use crate::engine::StreamExit;
use crate::handler::StreamHandler;
use crate::port::SourceError;
use crate::status::{Halt, HaltReason, StreamState};

impl<H: StreamHandler> Worker<H> {
    /// Waits out the restart backoff after a source failure; fails past `max_attempts`.
    pub(super) async fn backoff(&mut self, e: &SourceError) -> Result<(), StreamExit> {
        let name = self.def.name;
        self.restart_failures += 1;
        let attempt = self.restart_failures;
        let max = self.def.restart.max_attempts;
        if max > 0 && attempt > max {
            return Err(StreamExit::Halted(Halt::new(
                HaltReason::SourceUnavailable,
                format!(
                    "stream '{name}': the source failed {attempt} times in a row (restart max_attempts = {max}); last error: {e}"
                ),
            )));
        }
        let delay = self.def.restart.delay(attempt);
        self.metrics.restarts.increment(1);
        self.env.status.update(|s| {
            s.state = StreamState::Resuming;
            s.counters.restarts += 1;
        });
        warn!(stream = name, attempt, delay_ms = delay.as_millis() as u64, error = %e, runbook = HaltReason::SourceUnavailable.runbook(), "source error; re-opening from the settled position after a delay");
        let mut stop = self.env.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(delay) => Ok(()),
            _ = stopped(&mut stop) => Err(StreamExit::Stopped),
        }
    }
}

/// Resolves once a stop is requested (or the runtime that could request it is gone).
pub(super) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Whether [`stopped`] would resolve now, without waiting, for a receiver whose last seen value
/// was `false` (the session checks once, with `borrow_and_update`, when it begins; [`stopped`]
/// resolving ends it). Between two events only the version is compared, so the watch's lock
/// is taken only when the value changed.
pub(super) fn stop_requested(stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
    match stop.has_changed() {
        Err(_) => true,
        Ok(false) => false,
        Ok(true) => *stop.borrow_and_update(),
    }
}
