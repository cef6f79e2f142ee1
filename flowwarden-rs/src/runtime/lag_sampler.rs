//! The runtime's lag sampler: every [`LagConfig::interval`] it reads the source's history
//! bounds once, then each stream's published position, and updates every stream's lag
//! (gauges, status, the headroom warning, the stall). See `engine::lag` for the rules.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::MissedTickBehavior;

use super::supervisor::Inner;
use crate::engine::lag::{LagMonitor, PositionProbe, Sample};
use crate::engine::LagConfig;
use crate::port::HistoryUnknown;
use crate::status::StatusCell;

/// Starts the sampler of a runtime; it ends with the runtime's shutdown (or when the runtime
/// is dropped). Not started when the interval is zero.
pub(super) fn spawn(inner: &Arc<Inner>) {
    let cfg = inner.options.lag;
    if cfg.interval.is_zero() {
        return;
    }
    let shutdown = inner.shutdown.subscribe();
    tokio::spawn(run(Arc::downgrade(inner), shutdown, cfg));
}

async fn run(inner: Weak<Inner>, mut shutdown: tokio::sync::watch::Receiver<bool>, cfg: LagConfig) {
    let mut monitors: HashMap<&'static str, LagMonitor> = HashMap::new();
    let mut ticks = tokio::time::interval(cfg.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|down| *down) => return,
            _ = ticks.tick() => {}
        }
        let (source, streams) = {
            let Some(inner) = inner.upgrade() else { return };
            let streams: Vec<(&'static str, Arc<StatusCell>, Arc<PositionProbe>)> = inner
                .lock_slots()
                .iter()
                .map(|(name, slot)| (*name, slot.status.clone(), slot.probe.clone()))
                .collect();
            (inner.backend.source.clone(), streams)
        };
        // A slow or hung server must not stall the sampler: the read gets one interval.
        let limit = cfg.interval.max(Duration::from_secs(1));
        let bounds = match tokio::time::timeout(limit, source.history_bounds()).await {
            Ok(bounds) => bounds,
            Err(_) => Err(HistoryUnknown(format!(
                "reading the source's history bounds took longer than {} ms",
                limit.as_millis()
            ))),
        };
        let now = tokio::time::Instant::now();
        let wall_now = bson::DateTime::now();
        for (name, status, probe) in streams {
            let (position, caught_up) = probe.snapshot();
            let position_time = position.as_ref().and_then(|p| source.position_time(p));
            let state = status.snapshot().state;
            let monitor = monitors
                .entry(name)
                .or_insert_with(|| LagMonitor::new(name, now));
            let lag = monitor.observe(
                Sample {
                    bounds: &bounds,
                    position,
                    position_time,
                    caught_up,
                    state,
                    now,
                    wall_now,
                },
                &cfg,
            );
            status.update(|s| s.lag = Some(lag));
        }
    }
}
