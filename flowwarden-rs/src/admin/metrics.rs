//! `GET /metrics`: Prometheus text exposition of what the runtime reports through the
//! `metrics` facade (`flowwarden.events.received` is rendered `flowwarden_events_received`).
//!
//! The Prometheus recorder is installed as the process's global recorder the first time an
//! admin server starts, and only when no global recorder is installed yet; otherwise `/metrics`
//! answers 501 saying so (the other recorder receives the metrics).

use std::sync::OnceLock;
use std::time::Duration;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing::{info, warn};

use super::error::ApiError;

/// How often histograms are drained so their buffers do not grow between scrapes.
pub(crate) const UPKEEP_EVERY: Duration = Duration::from_secs(5);

static EXPORTER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The Prometheus handle, installing the recorder on the first call when no other global
/// recorder is installed; `None` when another one is.
pub(crate) fn exporter() -> Option<&'static PrometheusHandle> {
    EXPORTER
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            match metrics::set_global_recorder(recorder) {
                Ok(()) => {
                    info!("Prometheus recorder installed; metrics are served at GET /metrics");
                    Some(handle)
                }
                Err(_) => {
                    warn!("another global metrics recorder is installed; GET /metrics answers 501 (the metrics go to that recorder)");
                    None
                }
            }
        })
        .as_ref()
}

/// Drains histogram buffers; called every [`UPKEEP_EVERY`] by the server task.
pub(crate) fn upkeep() {
    if let Some(h) = exporter() {
        h.run_upkeep();
    }
}

fn exposition(exporter: Option<&PrometheusHandle>) -> Result<Response, ApiError> {
    let handle = exporter.ok_or(ApiError::MetricsUnavailable)?;
    let mut response = handle.render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}

/// `GET /metrics`.
pub(crate) async fn render() -> Result<Response, ApiError> {
    exposition(exporter())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn without_our_recorder_metrics_is_501() {
        let response = exposition(None).into_response();
        assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
    }
}
