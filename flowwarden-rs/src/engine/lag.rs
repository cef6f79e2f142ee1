//! Lag against the source's retained history (MongoDB's oplog window).
//!
//! Two naive definitions lie: "now minus the last event's time" grows on an idle stream that
//! has nothing to do, and "newest entry minus the last *handled* event" grows on a
//! filter-heavy stream that is caught up. So:
//!
//! - the **position time** is the time of the latest *settled* position, which includes the
//!   post-batch token of an empty or fully filtered batch (its time decoded from the token);
//! - **lag** is the source's newest history time minus the position time, and 0 when the last
//!   read returned an empty batch after that position with nothing unsettled (caught up);
//! - the **window** is newest minus oldest retained history; **headroom** is window minus lag:
//!   how much further the stream may fall behind, or stay down, before a restart can no
//!   longer resume.
//!
//! The worker publishes its settled position into a [`PositionProbe`] (cheaply, at most every
//! [`PUBLISH_EVERY`] while busy); the runtime's sampler reads the probe and the source's
//! history bounds every few seconds and feeds a [`LagMonitor`] per stream, which sets the
//! gauges and the status, warns when headroom runs low and tells when a stream is stalled.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bson::DateTime;
use metrics::{gauge, Gauge};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::event::ResumeToken;
use crate::port::{HistoryBounds, HistoryUnknown};
use crate::status::{LagStatus, StreamState};

/// How often a busy worker publishes its settled position at most.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// The runbook for a stalled stream and for low headroom.
pub(crate) const STALLED_RUNBOOK: &str = "docs/runbooks/stalled.md";

/// How lag is sampled and judged (`Builder::lag_sampling`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LagConfig {
    /// How often the history bounds are read and lag is computed (default 5 s).
    pub interval: Duration,
    /// A Running stream behind its source's newest history whose position has not moved for
    /// this long is stalled (default 5 minutes).
    pub stall_after: Duration,
    /// Warn when headroom falls below this fraction of the window (default 0.2).
    pub headroom_warn_fraction: f64,
}

impl Default for LagConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            stall_after: Duration::from_secs(300),
            headroom_warn_fraction: 0.2,
        }
    }
}

/// What a stream's worker tells the sampler: its latest settled position, and whether the
/// last read after it was an empty batch with nothing unsettled.
#[derive(Debug, Default)]
pub(crate) struct PositionProbe {
    position: Mutex<Option<ResumeToken>>,
    caught_up: AtomicBool,
}

impl PositionProbe {
    /// Records the latest settled position.
    pub(crate) fn publish(&self, position: &ResumeToken) {
        let mut guard = match self.position.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if guard.as_ref() != Some(position) {
            // Kept until the next publish: not holding the event it came from.
            *guard = Some(position.detached());
        }
    }

    /// Records whether the stream is caught up (cheap when nothing changes).
    pub(crate) fn set_caught_up(&self, caught_up: bool) {
        if self.caught_up.load(Ordering::Relaxed) != caught_up {
            self.caught_up.store(caught_up, Ordering::Relaxed);
        }
    }

    /// The latest published position and the caught-up flag.
    pub(crate) fn snapshot(&self) -> (Option<ResumeToken>, bool) {
        let position = match self.position.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        (position, self.caught_up.load(Ordering::Relaxed))
    }
}

/// Lag, window and headroom of one sample, in seconds, or why lag is unknown.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Measure {
    pub(crate) lag: Option<f64>,
    pub(crate) window: Option<f64>,
    pub(crate) headroom: Option<f64>,
    pub(crate) unknown_reason: Option<String>,
}

fn seconds_between(later: DateTime, earlier: DateTime) -> f64 {
    (later.timestamp_millis() - earlier.timestamp_millis()) as f64 / 1000.0
}

/// The pure rule: lag from the bounds and the position (see the module documentation).
pub(crate) fn measure(
    bounds: &Result<HistoryBounds, HistoryUnknown>,
    position_time: Option<DateTime>,
    caught_up: bool,
) -> Measure {
    let b = match bounds {
        Ok(b) => b,
        Err(why) => {
            return Measure {
                lag: None,
                window: None,
                headroom: None,
                unknown_reason: Some(why.0.clone()),
            }
        }
    };
    let window = seconds_between(b.newest, b.oldest).max(0.0);
    let lag = if caught_up {
        Some(0.0)
    } else {
        position_time.map(|p| seconds_between(b.newest, p).max(0.0))
    };
    Measure {
        lag,
        window: Some(window),
        headroom: lag.map(|l| window - l),
        unknown_reason: lag
            .is_none()
            .then(|| "the stream has not read a position whose time is known yet".to_owned()),
    }
}

/// The gauges of one stream.
struct LagGauges {
    lag: Gauge,
    window: Gauge,
    headroom: Gauge,
    known: Gauge,
}

/// Metric names of lag.
pub(crate) mod names {
    pub(crate) const LAG: &str = "flowwarden.stream.lag_seconds";
    pub(crate) const WINDOW: &str = "flowwarden.oplog.window_seconds";
    pub(crate) const HEADROOM: &str = "flowwarden.stream.headroom_seconds";
    pub(crate) const KNOWN: &str = "flowwarden.stream.lag_known";
}

/// One sample's inputs for one stream.
pub(crate) struct Sample<'a> {
    pub(crate) bounds: &'a Result<HistoryBounds, HistoryUnknown>,
    pub(crate) position: Option<ResumeToken>,
    pub(crate) position_time: Option<DateTime>,
    pub(crate) caught_up: bool,
    pub(crate) state: StreamState,
    pub(crate) now: Instant,
    pub(crate) wall_now: DateTime,
}

/// Judges one stream's samples over time: gauges, the headroom warning, the stall.
pub(crate) struct LagMonitor {
    stream: &'static str,
    gauges: LagGauges,
    last_position: Option<ResumeToken>,
    /// When the position last moved, or the stream was last not behind or not Running.
    progress_at: Instant,
    behind_since: Option<DateTime>,
    stalled: bool,
    headroom_low: bool,
    unknown_logged: bool,
}

impl LagMonitor {
    pub(crate) fn new(stream: &'static str, now: Instant) -> Self {
        Self {
            stream,
            gauges: LagGauges {
                lag: gauge!(names::LAG, "stream" => stream),
                window: gauge!(names::WINDOW, "stream" => stream),
                headroom: gauge!(names::HEADROOM, "stream" => stream),
                known: gauge!(names::KNOWN, "stream" => stream),
            },
            last_position: None,
            progress_at: now,
            behind_since: None,
            stalled: false,
            headroom_low: false,
            unknown_logged: false,
        }
    }

    /// Takes one sample: sets the gauges, logs transitions, returns the status to show.
    pub(crate) fn observe(&mut self, sample: Sample<'_>, cfg: &LagConfig) -> LagStatus {
        let m = measure(sample.bounds, sample.position_time, sample.caught_up);
        let name = self.stream;
        if let Err(why) = sample.bounds {
            if !self.unknown_logged {
                self.unknown_logged = true;
                warn!(stream = name, reason = %why, "lag against the oplog window is unknown (flowwarden_stream_lag_known = 0); the stream itself is not affected");
            }
        }
        self.gauges
            .known
            .set(if m.lag.is_some() { 1.0 } else { 0.0 });
        if let Some(lag) = m.lag {
            self.gauges.lag.set(lag);
        }
        if let Some(window) = m.window {
            self.gauges.window.set(window);
        }
        if let Some(headroom) = m.headroom {
            self.gauges.headroom.set(headroom);
        }

        // Progress: the position moved, or there is nothing to be behind on.
        let moved = sample.position.is_some() && sample.position != self.last_position;
        if moved {
            self.last_position = sample.position.clone();
        }
        let behind = m.lag.is_some_and(|l| l > 0.0);
        if moved || !behind || sample.state != StreamState::Running {
            self.progress_at = sample.now;
            self.behind_since = None;
        } else if self.behind_since.is_none() {
            self.behind_since = Some(sample.wall_now);
        }
        let stalled = sample.state == StreamState::Running
            && behind
            && sample.now.duration_since(self.progress_at) >= cfg.stall_after;
        if stalled != self.stalled {
            self.stalled = stalled;
            if stalled {
                warn!(
                    stream = name,
                    lag_seconds = m.lag.unwrap_or_default(),
                    runbook = STALLED_RUNBOOK,
                    "stream '{name}' is stalled: running, yet its position has not moved for {} s while its source has newer history; readiness now fails (runbook: {STALLED_RUNBOOK})",
                    cfg.stall_after.as_secs()
                );
            } else {
                info!(stream = name, "stream '{name}' is no longer stalled");
            }
        }

        if let (Some(headroom), Some(window)) = (m.headroom, m.window) {
            let low = window > 0.0 && headroom < cfg.headroom_warn_fraction * window;
            if low && !self.headroom_low {
                warn!(
                    stream = name,
                    headroom_seconds = headroom,
                    window_seconds = window,
                    runbook = STALLED_RUNBOOK,
                    "stream '{name}': headroom {headroom:.0} s is below {:.0}% of the oplog window ({window:.0} s): its position leaves the retained history in about {headroom:.0} s unless it catches up; after that a restart cannot resume (runbook: {STALLED_RUNBOOK})",
                    cfg.headroom_warn_fraction * 100.0
                );
            } else if !low && self.headroom_low {
                info!(
                    stream = name,
                    headroom_seconds = headroom,
                    "stream '{name}': headroom is back above {:.0}% of the oplog window",
                    cfg.headroom_warn_fraction * 100.0
                );
            }
            self.headroom_low = low;
        }

        let bounds = sample.bounds.as_ref().ok();
        LagStatus {
            known: m.lag.is_some(),
            unknown_reason: m.unknown_reason,
            position_time: sample.position_time,
            oldest_time: bounds.map(|b| b.oldest),
            newest_time: bounds.map(|b| b.newest),
            lag_seconds: m.lag,
            window_seconds: m.window,
            headroom_seconds: m.headroom,
            caught_up: sample.caught_up,
            stalled,
            behind_since: self.behind_since,
            sampled_at: sample.wall_now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime {
        DateTime::from_millis(secs * 1000)
    }

    fn bounds(oldest: i64, newest: i64) -> Result<HistoryBounds, HistoryUnknown> {
        Ok(HistoryBounds {
            oldest: at(oldest),
            newest: at(newest),
        })
    }

    #[test]
    fn lag_is_newest_minus_the_settled_position_and_headroom_the_rest_of_the_window() {
        let m = measure(&bounds(1_000, 4_600), Some(at(4_000)), false);
        assert_eq!(m.lag, Some(600.0));
        assert_eq!(m.window, Some(3_600.0));
        assert_eq!(m.headroom, Some(3_000.0));
        assert_eq!(m.unknown_reason, None);
    }

    #[test]
    fn a_caught_up_stream_has_no_lag_whatever_its_position_time() {
        // An idle or fully filtered stream: its post-batch position may be older than the
        // newest entry written since, but the empty batch says there is nothing behind.
        let m = measure(&bounds(1_000, 4_600), Some(at(1_500)), true);
        assert_eq!(m.lag, Some(0.0));
        assert_eq!(m.headroom, Some(3_600.0));
    }

    #[test]
    fn unknown_bounds_or_position_make_lag_unknown_never_zero() {
        let denied = Err(HistoryUnknown("no privilege".into()));
        let m = measure(&denied, Some(at(10)), true);
        assert_eq!((m.lag, m.window, m.headroom), (None, None, None));
        assert_eq!(m.unknown_reason.as_deref(), Some("no privilege"));
        let m = measure(&bounds(0, 100), None, false);
        assert_eq!(m.lag, None);
        assert_eq!(m.window, Some(100.0));
        assert!(m.unknown_reason.is_some());
    }

    #[test]
    fn a_position_newer_than_the_sampled_head_is_not_negative_lag() {
        let m = measure(&bounds(0, 100), Some(at(103)), false);
        assert_eq!(m.lag, Some(0.0));
    }

    fn sample<'a>(
        b: &'a Result<HistoryBounds, HistoryUnknown>,
        token: &str,
        position_secs: i64,
        state: StreamState,
        now: Instant,
    ) -> Sample<'a> {
        Sample {
            bounds: b,
            position: Some(ResumeToken::from_document(bson::doc! {"_data": token})),
            position_time: Some(at(position_secs)),
            caught_up: false,
            state,
            now,
            wall_now: at(0),
        }
    }

    #[test]
    fn a_running_stream_behind_whose_position_does_not_move_stalls_after_the_limit() {
        let cfg = LagConfig {
            stall_after: Duration::from_secs(60),
            ..LagConfig::default()
        };
        let t0 = Instant::now();
        let b = bounds(0, 1_000);
        let mut m = LagMonitor::new("s", t0);
        let s = |secs: u64, token: &'static str| {
            sample(
                &b,
                token,
                500,
                StreamState::Running,
                t0 + Duration::from_secs(secs),
            )
        };
        assert!(!m.observe(s(0, "01"), &cfg).stalled);
        assert!(!m.observe(s(59, "01"), &cfg).stalled);
        assert!(m.observe(s(60, "01"), &cfg).stalled);
        // Progress ends the stall and restarts the clock.
        assert!(!m.observe(s(61, "02"), &cfg).stalled);
        assert!(!m.observe(s(120, "02"), &cfg).stalled);
        assert!(m.observe(s(121, "02"), &cfg).stalled);
    }

    #[test]
    fn headroom_below_the_fraction_of_the_window_is_flagged_once_per_crossing() {
        let cfg = LagConfig::default();
        let t0 = Instant::now();
        // A 1,000 s window; 20% of it is 200 s of headroom.
        let b = bounds(0, 1_000);
        let mut m = LagMonitor::new("s", t0);
        let observe = |m: &mut LagMonitor, token: &str, position: i64| {
            let s = sample(&b, token, position, StreamState::Running, t0);
            m.observe(s, &cfg).headroom_seconds
        };
        assert_eq!(observe(&mut m, "01", 700), Some(700.0));
        assert!(!m.headroom_low);
        assert_eq!(observe(&mut m, "02", 201), Some(201.0));
        assert!(!m.headroom_low, "201 s is not below 200 s");
        assert_eq!(observe(&mut m, "03", 150), Some(150.0));
        assert!(m.headroom_low);
        observe(&mut m, "04", 100);
        assert!(
            m.headroom_low,
            "still low: no second warning, the flag stays"
        );
        observe(&mut m, "05", 900);
        assert!(!m.headroom_low, "back above: re-armed");
    }

    #[test]
    fn a_stream_that_is_not_behind_or_not_running_never_stalls() {
        let cfg = LagConfig {
            stall_after: Duration::from_secs(60),
            ..LagConfig::default()
        };
        let t0 = Instant::now();
        let level = bounds(0, 500);
        let mut m = LagMonitor::new("s", t0);
        for secs in [0, 100, 200] {
            let s = sample(
                &level,
                "01",
                500,
                StreamState::Running,
                t0 + Duration::from_secs(secs),
            );
            assert!(!m.observe(s, &cfg).stalled, "nothing newer to read");
        }
        let ahead = bounds(0, 1_000);
        let mut m = LagMonitor::new("s", t0);
        for secs in [0, 100, 200] {
            let s = sample(
                &ahead,
                "01",
                500,
                StreamState::Resuming,
                t0 + Duration::from_secs(secs),
            );
            assert!(
                !m.observe(s, &cfg).stalled,
                "resuming is reported by its state"
            );
        }
        let mut caught_up = sample(
            &ahead,
            "01",
            500,
            StreamState::Running,
            t0 + Duration::from_secs(300),
        );
        caught_up.caught_up = true;
        assert!(!m.observe(caught_up, &cfg).stalled);
    }
}
