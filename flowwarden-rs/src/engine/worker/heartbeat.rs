//! The heartbeat of a read session: every `save_interval_secs`, the settled position is
//! written if it moved.
//!
//! It ticks like a Tokio `Interval` with `MissedTickBehavior::Delay` (the first tick one period
//! after the start; a tick taken late is followed by the next a full period later, none are
//! made up), and can also be asked whether a tick is due without waiting
//! ([`Heartbeat::try_tick`]): the session asks that between two events that are already at
//! hand, instead of polling a timer inside a select for every event.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// How late a tick may be taken and still be followed by the next on the regular schedule
/// (Tokio's `Interval` uses the same grace).
const LATE_AFTER: Duration = Duration::from_millis(5);

/// A periodic tick for one session.
pub(super) struct Heartbeat {
    sleep: Pin<Box<Sleep>>,
    period: Duration,
}

impl Heartbeat {
    /// The first tick one `period` from now.
    pub(super) fn new(period: Duration) -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep_until(Instant::now() + period)),
            period,
        }
    }

    /// Takes the tick if one is due at `now`, a clock reading the caller took just before (it
    /// may reuse one it has); never waits.
    pub(super) fn try_tick(&mut self, now: Instant) -> bool {
        if now < self.sleep.deadline() {
            return false;
        }
        self.schedule_after(now);
        true
    }

    /// Waits for the next tick and takes it. Cancel-safe: a tick is taken only in the poll that
    /// returns it.
    pub(super) async fn tick(&mut self) {
        poll_fn(|cx| {
            if self.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.schedule_after(Instant::now());
            Poll::Ready(())
        })
        .await;
    }

    fn schedule_after(&mut self, now: Instant) {
        let due = self.sleep.deadline();
        let next = if now > due + LATE_AFTER {
            now + self.period
        } else {
            due + self.period
        };
        self.sleep.as_mut().reset(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ticks_every_period_and_does_not_make_up_missed_ticks() {
        let start = Instant::now();
        let mut hb = Heartbeat::new(Duration::from_secs(5));
        assert!(!hb.try_tick(Instant::now()), "nothing due at the start");
        hb.tick().await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        hb.tick().await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        // Busy for 12 s: one tick is due, not two, and the next is a period after it.
        tokio::time::advance(Duration::from_secs(12)).await;
        assert!(hb.try_tick(Instant::now()));
        assert!(!hb.try_tick(Instant::now()));
        hb.tick().await;
        assert_eq!(start.elapsed(), Duration::from_secs(27));
        // Taken on time through `try_tick`: the schedule does not drift.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(hb.try_tick(Instant::now()));
        hb.tick().await;
        assert_eq!(start.elapsed(), Duration::from_secs(37));
    }
}
