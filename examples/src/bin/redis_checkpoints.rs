//! A `Backend` mixing stores: the in-memory change source (and dead letters) with checkpoints
//! and leases in Redis.
//!
//! ```text
//! redis-server --daemonize yes --port 6379 --save "" --appendonly no   # if none runs yet
//! cargo run -p flowwarden-examples --bin redis_checkpoints
//! ```
//!
//! Redis at `FLOWWARDEN_REDIS_URL` (default `redis://127.0.0.1:6379`), keys under
//! `flowwarden-example:`. A `SingleLeader` stream takes its lease in Redis, handles three
//! inserts, and writes its checkpoint into Redis, fenced by the lease's epoch; the program then
//! prints the stored checkpoint and the lease, removes its two keys, and exits 0.
//!
//! Why remove them: the in-memory source does not outlive the process, so a checkpoint kept
//! from an earlier run points into a change history that is gone, and the next run would
//! (rightly) halt with `HistoryLost` instead of silently starting over. A real deployment pairs
//! the Redis stores with a durable source (MongoDB) and keeps its keys.

use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use flowwarden::port::{CheckpointStore, LeaseStore};
use flowwarden::redis::{RedisCheckpointStore, RedisConfig, RedisConnection, RedisLeaseStore};
use flowwarden::{change_stream, checkpoint, Backend, ChangeContext, HandlerError, MemoryBackend};

/// A shipment as stored.
#[derive(Debug, serde::Deserialize)]
struct Shipment {
    carrier: String,
}

/// Logs each new shipment; one leader across all replicas.
#[derive(Default)]
struct ShipmentStream;

#[change_stream(name = "shipments", collection = "shipments", document = Shipment,
                deployment = SingleLeader, lease_secs = 10, renew_secs = 3)]
#[checkpoint(save_every_n = 1, save_interval_secs = 1)]
impl ShipmentStream {
    #[on_insert]
    async fn created(
        &self,
        shipment: Shipment,
        ctx: &ChangeContext<Shipment>,
    ) -> Result<(), HandlerError> {
        println!("shipment {:?} by {}", ctx.document_key(), shipment.carrier);
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
enum ExampleError {
    #[error("{0}")]
    Connect(#[from] flowwarden::redis::RedisConnectError),
    #[error("{0}")]
    Start(#[from] flowwarden::StartupError),
    #[error("{0}")]
    Store(#[from] flowwarden::port::StoreError),
    #[error("{0}")]
    Memory(#[from] flowwarden::MemoryError),
    #[error("{0}")]
    Other(String),
}

async fn run() -> Result<(), ExampleError> {
    let config = RedisConfig::from_env().prefix("flowwarden-example:");
    println!("checkpoints and leases: Redis at {}", config.redacted_url());
    let redis = RedisConnection::connect(&config).await?;
    let checkpoints = RedisCheckpointStore::new(&redis);
    let leases = Arc::new(RedisLeaseStore::new(&redis));

    // The source and the dead letters stay in memory; the dead letters are fenced by the
    // leases in Redis, like the checkpoints.
    let memory = MemoryBackend::new();
    memory.fence_dead_letters_by(leases.clone());
    let backend = Backend {
        checkpoints: Arc::new(checkpoints.clone()),
        leases: Some(leases.clone()),
        transactions: None,
        ..Backend::from(memory.clone())
    };
    let runtime = flowwarden::builder()
        .backend(backend)
        .instance_id("example-node-1")
        .start()
        .await?;
    let status = tokio::time::timeout(
        Duration::from_secs(30),
        runtime
            .handle()
            .wait_for("shipments", |s| s.state == flowwarden::StreamState::Running),
    )
    .await;
    if !matches!(status, Ok(Ok(_))) {
        return Err(ExampleError::Other("the stream did not start".into()));
    }

    let shipments = memory.collection("shipments");
    for (id, carrier) in [(1, "dhl"), (2, "ups"), (3, "fedex")] {
        shipments.insert_one(doc! { "_id": id, "carrier": carrier })?;
    }
    let last = memory.oplog_head();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let stored = loop {
        if let Some(cp) = checkpoints.load("shipments").await? {
            let at = cp.last_processed.as_ref().and_then(|p| p.token.data());
            if at.and_then(|d| u64::from_str_radix(d, 16).ok()) == Some(last) {
                break cp;
            }
        }
        if tokio::time::Instant::now() > deadline {
            return Err(ExampleError::Other(
                "no checkpoint in Redis within 30 s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "checkpoint in Redis at {}: {} (owner {:?}, epoch {:?})",
        checkpoints.key("shipments"),
        stored.describe_time(),
        stored.owner,
        stored.epoch
    );
    if let Some(lease) = leases.current("shipments").await? {
        println!(
            "lease in Redis at {}: held by {} with epoch {} until {}",
            leases.key("shipments"),
            lease.owner,
            lease.epoch,
            lease.expires_at
        );
    }
    runtime.shutdown().await;
    remove_keys(
        &config,
        &[checkpoints.key("shipments"), leases.key("shipments")],
    )
    .await
}

/// Removes the example's keys (see the module docs for why), with a plain client.
async fn remove_keys(config: &RedisConfig, keys: &[String]) -> Result<(), ExampleError> {
    let url =
        std::env::var(RedisConfig::URL_VAR).unwrap_or_else(|_| RedisConfig::DEFAULT_URL.into());
    let fail = |e: redis::RedisError| {
        ExampleError::Other(format!(
            "removing the example's keys at {}: {e}",
            config.redacted_url()
        ))
    };
    let client = redis::Client::open(url.as_str()).map_err(fail)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(fail)?;
    let _: i64 = redis::cmd("DEL")
        .arg(keys)
        .query_async(&mut conn)
        .await
        .map_err(fail)?;
    Ok(())
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,flowwarden=info".into()),
        )
        .with_target(false)
        .init();
    if let Err(e) = run().await {
        eprintln!("example failed: {e}");
        std::process::exit(1);
    }
}
