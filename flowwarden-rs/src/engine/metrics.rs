//! Metric handles of one stream, registered once through the `metrics` facade.

use metrics::{counter, histogram, Counter, Histogram};

/// Metric names, FlowWarden's where they exist.
pub(crate) mod names {
    pub(crate) const RECEIVED: &str = "flowwarden.events.received";
    pub(crate) const FILTERED: &str = "flowwarden.events.filtered";
    pub(crate) const UNROUTED: &str = "flowwarden.events.unrouted";
    pub(crate) const HANDLED: &str = "flowwarden.events.handled";
    pub(crate) const RETRIED: &str = "flowwarden.events.retried";
    pub(crate) const DEAD_LETTERED: &str = "flowwarden.events.dead_lettered";
    pub(crate) const SKIPPED: &str = "flowwarden.events.skipped";
    pub(crate) const REDELIVERED: &str = "flowwarden.events.redelivered";
    pub(crate) const HANDLER_DURATION: &str = "flowwarden.handler.duration_seconds";
    pub(crate) const RESTARTS: &str = "flowwarden.stream.restarts";
    pub(crate) const FALLBACK_TO_SEEN: &str = "flowwarden.stream.resume.fallback_to_seen";
    pub(crate) const FALLBACK_TO_PROCESSED: &str = "flowwarden.stream.resume.fallback_to_processed";
    pub(crate) const HISTORY_LOST: &str = "flowwarden.stream.resume.history_lost";
    pub(crate) const CHECKPOINT_SAVED: &str = "flowwarden.checkpoint.saved";
    pub(crate) const CHECKPOINT_FAILED: &str = "flowwarden.checkpoint.save_failed";
}

#[derive(Clone)]
pub(crate) struct StreamMetrics {
    pub(crate) received: Counter,
    pub(crate) filtered: Counter,
    pub(crate) unrouted: Counter,
    pub(crate) handled: Counter,
    pub(crate) retried: Counter,
    pub(crate) dead_lettered: Counter,
    pub(crate) skipped: Counter,
    pub(crate) redelivered: Counter,
    pub(crate) handler_duration: Histogram,
    pub(crate) restarts: Counter,
    pub(crate) fallback_to_seen: Counter,
    pub(crate) fallback_to_processed: Counter,
    pub(crate) history_lost: Counter,
}

impl StreamMetrics {
    pub(crate) fn new(stream: &'static str) -> Self {
        Self {
            received: counter!(names::RECEIVED, "stream" => stream),
            filtered: counter!(names::FILTERED, "stream" => stream),
            unrouted: counter!(names::UNROUTED, "stream" => stream),
            handled: counter!(names::HANDLED, "stream" => stream),
            retried: counter!(names::RETRIED, "stream" => stream),
            dead_lettered: counter!(names::DEAD_LETTERED, "stream" => stream),
            skipped: counter!(names::SKIPPED, "stream" => stream),
            redelivered: counter!(names::REDELIVERED, "stream" => stream),
            handler_duration: histogram!(names::HANDLER_DURATION, "stream" => stream),
            restarts: counter!(names::RESTARTS, "stream" => stream),
            fallback_to_seen: counter!(names::FALLBACK_TO_SEEN, "stream" => stream),
            fallback_to_processed: counter!(names::FALLBACK_TO_PROCESSED, "stream" => stream),
            history_lost: counter!(names::HISTORY_LOST, "stream" => stream),
        }
    }
}
