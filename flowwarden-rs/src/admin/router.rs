//! The routes of the admin API: the one list ([`routes()`]) the router is built from and the
//! OpenAPI document is checked against, the shared state, and the JSON fallbacks.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use tracing::{debug, info};

use super::error::ApiError;
use super::{auth, dead_letters, health, metrics, openapi, status_page, streams};
use crate::runtime::RuntimeHandle;

/// What every request handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    /// The runtime the API reports on and controls.
    pub(crate) handle: RuntimeHandle,
    /// The bearer token of the mutating routes; `None`: they answer 403.
    pub(crate) token: Option<Arc<str>>,
}

/// Which handler serves a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Live,
    Ready,
    ListStreams,
    GetStream,
    StopStream,
    StartStream,
    RestartStream,
    ListDeadLetters,
    GetDeadLetter,
    ReplayDeadLetter,
    DiscardDeadLetter,
    Metrics,
    OpenApi,
    StatusPage,
}

/// One route of the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    method: &'static str,
    path: &'static str,
    endpoint: Endpoint,
}

impl Route {
    const fn get(path: &'static str, endpoint: Endpoint) -> Self {
        Self {
            method: "GET",
            path,
            endpoint,
        }
    }

    const fn post(path: &'static str, endpoint: Endpoint) -> Self {
        Self {
            method: "POST",
            path,
            endpoint,
        }
    }

    /// The HTTP method (`GET` or `POST`).
    pub fn method(&self) -> &'static str {
        self.method
    }

    /// The path, with parameters in braces as in OpenAPI (`/streams/{name}`).
    pub fn path(&self) -> &'static str {
        self.path
    }

    /// Whether the route changes something and so requires the bearer token.
    pub fn requires_token(&self) -> bool {
        self.method == "POST"
    }
}

static ROUTES: &[Route] = &[
    Route::get("/health/live", Endpoint::Live),
    Route::get("/health/ready", Endpoint::Ready),
    Route::get("/streams", Endpoint::ListStreams),
    Route::get("/streams/{name}", Endpoint::GetStream),
    Route::post("/streams/{name}/stop", Endpoint::StopStream),
    Route::post("/streams/{name}/start", Endpoint::StartStream),
    Route::post("/streams/{name}/restart", Endpoint::RestartStream),
    Route::get("/dead-letters", Endpoint::ListDeadLetters),
    Route::get("/dead-letters/{id}", Endpoint::GetDeadLetter),
    Route::post("/dead-letters/{id}/replay", Endpoint::ReplayDeadLetter),
    Route::post("/dead-letters/{id}/discard", Endpoint::DiscardDeadLetter),
    Route::get("/metrics", Endpoint::Metrics),
    Route::get("/openapi.json", Endpoint::OpenApi),
    Route::get("/", Endpoint::StatusPage),
];

/// Every route the admin API serves; the router is built from this list, and the OpenAPI
/// document at `/openapi.json` describes exactly these.
pub fn routes() -> &'static [Route] {
    ROUTES
}

fn handler(endpoint: Endpoint) -> MethodRouter<AppState> {
    match endpoint {
        Endpoint::Live => get(health::live),
        Endpoint::Ready => get(health::ready),
        Endpoint::ListStreams => get(streams::list),
        Endpoint::GetStream => get(streams::get_one),
        Endpoint::StopStream => post(streams::stop),
        Endpoint::StartStream => post(streams::start),
        Endpoint::RestartStream => post(streams::restart),
        Endpoint::ListDeadLetters => get(dead_letters::list),
        Endpoint::GetDeadLetter => get(dead_letters::get_one),
        Endpoint::ReplayDeadLetter => post(dead_letters::replay),
        Endpoint::DiscardDeadLetter => post(dead_letters::discard),
        Endpoint::Metrics => get(metrics::render),
        Endpoint::OpenApi => get(openapi::document),
        Endpoint::StatusPage => get(status_page::page),
    }
}

/// The router of every route in [`routes()`], mutating ones behind the token check.
pub(crate) fn router(state: AppState) -> Router {
    let mut router = Router::new();
    for route in ROUTES {
        let mut method_router = handler(route.endpoint).fallback(method_not_allowed);
        if route.requires_token() {
            method_router = method_router.route_layer(middleware::from_fn_with_state(
                state.clone(),
                auth::require_token,
            ));
        }
        router = router.route(route.path, method_router);
    }
    router
        .fallback(no_route)
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

async fn no_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::NoRoute {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

/// Logs every request: mutating ones at INFO (who changed what is worth keeping), reads at DEBUG.
async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await.into_response();
    let status = response.status().as_u16();
    if method == Method::POST {
        info!(%method, path, status, "admin request");
    } else {
        debug!(%method, path, status, "admin request");
    }
    response
}
