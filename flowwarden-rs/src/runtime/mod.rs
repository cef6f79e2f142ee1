//! Starting, supervising and controlling streams: [`run()`], [`builder()`], [`Runtime`],
//! [`RuntimeHandle`].
//!
//! One concept per module: [`Builder`] (settings), `discovery` (which streams run, and every
//! check made before any starts), `supervisor` (the stream tasks and how each is started and
//! stopped), [`RuntimeHandle`] and [`Runtime`] (status and control), [`DeadLetters`] (operator
//! actions on dead letters), the errors, and the shutdown signals.

mod builder;
mod dead_letters;
mod discovery;
mod error;
mod handle;
mod instance;
mod lag_sampler;
mod signal;
mod supervisor;

pub use builder::Builder;
pub use dead_letters::DeadLetters;
pub use error::{ControlError, DeadLetterError, RunError, StartupError};
pub use handle::{Runtime, RuntimeHandle};
pub use instance::InstanceId;

/// Builds a runtime: which streams, on which backend, with which settings.
pub fn builder() -> Builder {
    Builder::new()
}

/// Runs every registered stream until Ctrl-C (or SIGTERM), then shuts down gracefully.
///
/// The backend is MongoDB when `FLOWWARDEN_MONGODB_URI` is set and the `flowwarden-rs-mongo`
/// crate is linked, else the embedded in-memory backend (logged). Everything is validated
/// before any stream starts; every problem is reported at once.
pub async fn run() -> Result<(), RunError> {
    builder().start().await?.run_until_signal().await
}
