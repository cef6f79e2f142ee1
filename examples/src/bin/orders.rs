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

use flowwarden::MemoryBackend;
use flowwarden_examples::orders::{run, Target};
use flowwarden_rs_mongo::MongoBackend;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,flowwarden=info".into()),
        )
        .with_target(false)
        .init();
    let target = match std::env::var(flowwarden_rs_mongo::ENV_URI) {
        Ok(uri) => {
            let db = std::env::var("FLOWWARDEN_DATABASE")
                .unwrap_or_else(|_| "flowwarden_example".into());
            println!(
                "backend: MongoDB ({}), database {db}",
                flowwarden_rs_mongo::redact_uri(&uri)
            );
            match MongoBackend::connect(&uri, &db).await {
                Ok(b) => Target::Mongo(b),
                Err(problems) => {
                    for p in problems {
                        eprintln!("cannot use MongoDB: {p}");
                    }
                    std::process::exit(2);
                }
            }
        }
        Err(_) => {
            println!(
                "backend: the embedded in-memory backend (set FLOWWARDEN_MONGODB_URI for MongoDB)"
            );
            Target::Memory(MemoryBackend::new())
        }
    };
    if let Err(e) = run(target).await {
        eprintln!("example failed: {e}");
        std::process::exit(1);
    }
}
