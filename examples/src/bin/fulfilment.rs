//! A `SingleLeader` stream, meant to run as several instances of one service: exactly one of
//! them ships each paid order; the others stand by and take over when it dies.
//!
//! ```text
//! FLOWWARDEN_MONGODB_URI=mongodb://127.0.0.1:27017/?replicaSet=rs0 \
//! FLOWWARDEN_INSTANCE_ID=pod-1 cargo run -p flowwarden-examples --bin fulfilment
//! ```
//!
//! Start it twice (two terminals, two instance ids) and insert into `orders`: one instance
//! prints `shipped order N by <instance>`. Kill it (`kill -9`): within `lease_secs +
//! standby_poll_secs` (3 s here) the other takes over from the last checkpoint. Stop it with
//! Ctrl-C or SIGTERM: it flushes its checkpoint, then releases the lease. Without
//! `FLOWWARDEN_MONGODB_URI` it runs alone on the in-memory backend, which shows nothing
//! interesting. The lease here is short so that the demo and its test fail over quickly;
//! production streams keep the defaults (30 s / 10 s / 5 s, see docs/deployment.md).

use std::sync::OnceLock;

use bson::Document;
use flowwarden::{change_stream, checkpoint, Backend, ChangeContext, HandlerError, MemoryBackend};
use flowwarden_rs_mongo::MongoBackend;

/// This process's instance identity, for the output.
static INSTANCE: OnceLock<String> = OnceLock::new();

/// Ships orders once they are inserted.
#[derive(Default)]
pub struct Fulfilment;

#[change_stream(
    name = "fulfilment",
    collection = "orders",
    deployment = SingleLeader,
    lease_secs = 2,
    renew_secs = 1,
    standby_poll_secs = 1
)]
#[checkpoint(save_every_n = 1, save_interval_secs = 1)]
impl Fulfilment {
    #[on_insert]
    async fn ship(&self, ctx: &ChangeContext<Document>) -> Result<(), HandlerError> {
        let order = ctx
            .document_key()
            .and_then(|k| k.get("_id"))
            .map(ToString::to_string)
            .unwrap_or_default();
        let me = INSTANCE.get().map(String::as_str).unwrap_or("?");
        println!("shipped order {order} by {me}");
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,flowwarden=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let instance = flowwarden::InstanceId::from_env();
    let _ = INSTANCE.set(instance.to_string());
    let backend: Backend = match std::env::var(flowwarden_rs_mongo::ENV_URI) {
        Ok(uri) => {
            let db = std::env::var("FLOWWARDEN_DATABASE")
                .unwrap_or_else(|_| "flowwarden_example".into());
            match MongoBackend::connect(&uri, &db).await {
                Ok(b) => b.into(),
                Err(problems) => {
                    for p in problems {
                        eprintln!("cannot use MongoDB: {p}");
                    }
                    std::process::exit(2);
                }
            }
        }
        Err(_) => MemoryBackend::new().into(),
    };
    let runtime = match flowwarden::builder()
        .discover(false)
        .stream(Fulfilment)
        .backend(backend)
        .instance_id(instance.as_str())
        .start()
        .await
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fulfilment cannot start: {e}");
            std::process::exit(1);
        }
    };
    println!("instance {instance} started");
    if let Err(e) = runtime.run_until_signal().await {
        eprintln!("fulfilment stopped with an error: {e}");
        std::process::exit(1);
    }
    println!("instance {instance} stopped");
}
