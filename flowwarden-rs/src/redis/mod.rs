//! Redis checkpoint and lease stores (feature `redis`).
//!
//! [`RedisCheckpointStore`] and [`RedisLeaseStore`] implement [`crate::port::CheckpointStore`]
//! and [`crate::port::LeaseStore`] on one Redis server, with the same semantics as the MongoDB
//! and in-memory stores (they pass the backend conformance suite against a real server):
//!
//! - every decision is **one Lua script** (`EVALSHA`, loaded on first use), so a checkpoint
//!   claim or save checks the stream's lease and the stored checkpoint's epoch and writes in
//!   one atomic step;
//! - lease expiry is computed and judged by the **server's** clock (`TIME` inside the script),
//!   never the client's;
//! - a lease record never expires and is never deleted, so epochs never restart at 1;
//! - connection errors and timeouts are [`crate::port::StoreErrorKind::Unavailable`] (the
//!   engine retries); a stored checkpoint that does not parse is
//!   [`crate::port::StoreErrorKind::Corrupt`], naming the stream.
//!
//! Dead letters are not stored in Redis: keep them in MongoDB or in memory (a
//! [`crate::Backend`] mixes stores freely). The change source is whatever the backend says (the
//! in-memory one, or MongoDB's change streams).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use flowwarden::redis::{RedisCheckpointStore, RedisConfig, RedisConnection, RedisLeaseStore};
//!
//! let redis = RedisConnection::connect(&RedisConfig::from_env().prefix("orders-svc:")).await?;
//! let memory = flowwarden::MemoryBackend::new();
//! let backend = flowwarden::Backend {
//!     checkpoints: Arc::new(RedisCheckpointStore::new(&redis)),
//!     leases: Some(Arc::new(RedisLeaseStore::new(&redis))),
//!     transactions: None,
//!     ..flowwarden::Backend::from(memory)
//! };
//! # let _ = backend; Ok(()) }
//! ```
//!
//! The key layout, the scripts and the client choice are described in
//! `docs/integrations/redis.md`.

#[cfg(feature = "dedup")]
mod applied;
mod checkpoints;
mod connection;
mod error;
mod leases;
mod scripts;

#[cfg(feature = "dedup")]
pub use applied::RedisApplied;
pub use checkpoints::RedisCheckpointStore;
pub use connection::{RedisConfig, RedisConnectError, RedisConnection};
pub use leases::RedisLeaseStore;
