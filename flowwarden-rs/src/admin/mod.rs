//! The HTTP admin API and Prometheus exposition (feature `admin`).
//!
//! Off unless asked for: [`crate::Builder::admin`] or the environment variable
//! [`ADMIN_ADDR_VAR`] (read at [`crate::Builder::start`]) names the address; a bare port or a
//! host-less `:port` binds `127.0.0.1`. The server runs as a task on the runtime's Tokio runtime,
//! started by [`crate::Builder::start`] and stopped with the runtime.
//!
//! Every route is in [`routes()`] and in the OpenAPI document served at `/openapi.json`:
//! health (`/health/live`, `/health/ready`), streams (`/streams`, `/streams/{name}` and its
//! `stop` / `start` / `restart`), dead letters (`/dead-letters`, `/dead-letters/{id}` and its
//! `replay` / `discard`), `/metrics`, and the live status page at `/` (one self-contained HTML
//! page polling the JSON API). The API is built on [`crate::RuntimeHandle`] and
//! [`crate::DeadLetters`] only. Mutating routes require `Authorization: Bearer <token>` with the
//! token of [`crate::Builder::admin_token`] or [`ADMIN_TOKEN_VAR`]; without a configured token
//! they answer 403. Errors are JSON: `{"error": "...", "code": "..."}`.
//!
//! The dependencies: `axum` (the Tokio ecosystem's HTTP framework, on `hyper`), the
//! `metrics-exporter-prometheus` recorder (the runtime already reports through the `metrics`
//! facade, so this renders exactly those metrics), and `serde_json`. Operators' guide:
//! `docs/operations.md`.

mod auth;
mod dead_letters;
mod error;
mod health;
mod metrics;
mod openapi;
mod router;
mod server;
mod status_page;
mod streams;

pub use error::AdminError;
pub use router::{routes, Route};
pub(crate) use server::{launch, AdminSettings};
pub use server::{ADMIN_ADDR_VAR, ADMIN_TOKEN_VAR};
