//! The orders example: one command, no setup.
//!
//! ```text
//! cargo run -p flowwarden-examples --bin orders
//! ```
//!
//! On the embedded in-memory backend by default; on MongoDB when `FLOWWARDEN_MONGODB_URI` is
//! set (database `FLOWWARDEN_DATABASE`, default `flowwarden_example`). See
//! `flowwarden_examples::orders` for what it does. Exits 0 when run 2 resumed from the
//! checkpoint of run 1.

use flowwarden_examples::orders::{run, Target};

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,flowwarden=info".into()),
        )
        .with_target(false)
        .init();
    let target = match Target::from_env().await {
        Ok(target) => target,
        Err(problems) => {
            for p in problems {
                eprintln!("cannot use MongoDB: {p}");
            }
            std::process::exit(2);
        }
    };
    if let Err(e) = run(target).await {
        eprintln!("example failed: {e}");
        std::process::exit(1);
    }
}
