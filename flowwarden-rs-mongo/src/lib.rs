//! The MongoDB backend of flowwarden-rs, on the official [`mongodb`] driver.
//!
//! [`MongoBackend`] gives every storage trait of the runtime a MongoDB implementation:
//!
//! - the change source (`watch()` on the stream's collection, read as raw documents, idle
//!   ticks from the post-batch resume token, reassembly of `$changeStreamSplitLargeEvent`
//!   fragments, and a classification of every server error for the engine);
//! - the checkpoint store on `_fw_checkpoints` (one document per stream, single conditional
//!   writes fenced by epoch);
//! - the dead-letter store on `_fw_dlq` (idempotent by record id, fenced by epoch);
//! - the lease store of `SingleLeader` streams on `_fw_locks` ([`LeaseDocument`]), judged by
//!   the server's clock;
//! - transactions for `transactional = true` streams ([`Transaction`]): a handler's writes and
//!   the checkpoint commit together (exactly-once effects, `docs/exactly-once.md`).
//!
//! # Connecting
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use flowwarden_rs_mongo::MongoBackend;
//!
//! let backend = MongoBackend::connect("mongodb://127.0.0.1:27017/?replicaSet=rs0", "app")
//!     .await
//!     .map_err(|problems| problems.join("; "))?;
//! let runtime = flowwarden::builder().backend(backend).start().await?;
//! runtime.run_until_signal().await?;
//! # Ok(()) }
//! ```
//!
//! Or let `flowwarden::run()` configure itself from `FLOWWARDEN_MONGODB_URI` (and
//! `FLOWWARDEN_DATABASE`, default `flowwarden`). This crate registers an environment
//! provider for that, but **the linker drops a crate nothing references**: name it once in the
//! program, for example with `use flowwarden_rs_mongo as _;`.
//!
//! See `docs/mongodb.md` for server versions, privileges, pre- and post-images, oplog sizing and
//! how each server error is handled.
#![cfg_attr(not(test), warn(clippy::unwrap_used))]
#![warn(unreachable_pub)]

#[cfg(feature = "dedup")]
mod applied;
mod classify;
#[cfg(feature = "cli")]
pub mod cli;
mod history;
mod lease;
mod resumes;
mod scan;
mod source;
mod stores;
mod token;
mod transaction;

use std::sync::Arc;

use bson::{doc, Bson, Document};
use flowwarden::port::{BackendDriver, ProvidedBackend};
use flowwarden::Backend;
use mongodb::Client;
use tokio::sync::OnceCell;
use tracing::{info, warn};

#[cfg(feature = "dedup")]
pub use applied::{MongoApplied, APPLIED, APPLIED_TTL_INDEX};
pub use classify::{classify, classify_facts, ErrorClass, ErrorFacts};
pub use lease::LeaseDocument;
pub use source::{MongoCursor, SPLIT_STAGE};
pub use stores::{DLQ_INDEX, MAX_RECORD_BYTES};
pub use transaction::Transaction;

/// Collection of the checkpoints (one document per stream).
pub const CHECKPOINTS: &str = "_fw_checkpoints";
/// Collection of the dead letters.
pub const DEAD_LETTERS: &str = "_fw_dlq";
/// Collection of the leases (leader election).
pub const LOCKS: &str = "_fw_locks";
/// Environment variable with the connection string.
pub const ENV_URI: &str = flowwarden::port::MONGODB_URI_VAR;
/// Environment variable with the database of the `_fw_` collections and of streams that name
/// none.
pub const ENV_DATABASE: &str = "FLOWWARDEN_DATABASE";
/// The database used when `FLOWWARDEN_DATABASE` is not set.
pub const DEFAULT_DATABASE: &str = "flowwarden";
/// Set to `true` (or `1`, `on`, `yes`) to connect with the command monitor that counts the
/// driver's own change-stream resumes (see [`ConnectOptions::count_driver_resumes`]).
pub const ENV_COUNT_DRIVER_RESUMES: &str = "FLOWWARDEN_MONGODB_COUNT_DRIVER_RESUMES";

/// How [`MongoBackend::connect_with`] sets up the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Install the command monitor that counts the change-stream resumes the driver makes on
    /// its own (a warning, `flowwarden.source.driver_resumes`,
    /// [`MongoBackend::driver_resumes`]). Default `false`: with a monitor installed the driver
    /// copies and parses every command reply once more, which costs a busy stream about a third
    /// of its throughput (docs/performance.md, P2). Nothing is lost without it (the driver
    /// resumes after the last event it returned); the resumes are only not counted.
    pub count_driver_resumes: bool,
}

/// The MongoDB backend: a driver client and the database of the `_fw_` collections. Cheap to
/// clone (the driver's client is shared).
#[derive(Clone)]
pub struct MongoBackend {
    pub(crate) client: Client,
    pub(crate) database: String,
    pub(crate) description: String,
    pub(crate) indexes: Arc<OnceCell<()>>,
    /// Driver resumes, counted when this crate built the client (`None` for `from_client`).
    pub(crate) resumes: Option<Arc<resumes::DriverResumes>>,
    /// The lease store whose leases fence this backend's checkpoint and dead-letter writes,
    /// when it is not this backend's `_fw_locks` (see [`MongoBackend::fenced_by`]).
    pub(crate) fence_leases: Option<Arc<dyn flowwarden::port::LeaseStore>>,
    /// The server's transaction lifetime limit, as this backend assumes it (see
    /// [`MongoBackend::with_transaction_lifetime`]).
    pub(crate) transaction_lifetime: std::time::Duration,
}

impl std::fmt::Debug for MongoBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoBackend")
            .field("server", &self.description)
            .field("database", &self.database)
            .finish()
    }
}

/// Errors of this crate's own operations (connecting, index creation).
#[derive(Debug, thiserror::Error)]
pub enum MongoBackendError {
    /// The driver failed.
    #[error("MongoDB error: {0}")]
    Driver(#[from] mongodb::error::Error),
}

impl MongoBackend {
    /// Connects to `uri`, checks the deployment (a replica-set member or a mongos: change
    /// streams do not exist on a standalone) and returns the backend, or every problem found.
    pub async fn connect(uri: &str, database: &str) -> Result<MongoBackend, Vec<String>> {
        Self::connect_with(uri, database, ConnectOptions::default()).await
    }

    /// [`MongoBackend::connect`] with these options.
    pub async fn connect_with(
        uri: &str,
        database: &str,
        options: ConnectOptions,
    ) -> Result<MongoBackend, Vec<String>> {
        let resumes = options
            .count_driver_resumes
            .then(|| Arc::new(resumes::DriverResumes::default()));
        let client = match mongodb::options::ClientOptions::parse(uri).await {
            Ok(mut client_options) => {
                if let Some(resumes) = &resumes {
                    client_options.command_event_handler = Some(resumes.monitor());
                }
                Client::with_options(client_options)
            }
            Err(e) => Err(e),
        };
        let client = match client {
            Ok(c) => c,
            Err(e) => {
                let mut problems = database_name_problems(database);
                problems.push(format!(
                    "cannot use the MongoDB connection string {}: {}",
                    redact_uri(uri),
                    short_error(&e)
                ));
                return Err(problems);
            }
        };
        let backend = MongoBackend {
            client,
            database: database.to_owned(),
            description: format!("MongoDB at {}", redact_uri(uri)),
            indexes: Arc::default(),
            resumes,
            fence_leases: None,
            transaction_lifetime: flowwarden::port::DEFAULT_TRANSACTION_LIFETIME,
        };
        backend.validate().await?;
        info!(server = %redact_uri(uri), database, "using the MongoDB backend");
        Ok(backend)
    }

    /// Wraps a ready client, without checking the deployment (call
    /// [`MongoBackend::validate`] before starting streams, or use [`MongoBackend::connect`]).
    pub fn from_client(client: Client, database: impl Into<String>) -> MongoBackend {
        let database = database.into();
        MongoBackend {
            client,
            description: format!("MongoDB (client supplied), database {database}"),
            database,
            indexes: Arc::default(),
            resumes: None,
            fence_leases: None,
            transaction_lifetime: flowwarden::port::DEFAULT_TRANSACTION_LIFETIME,
        }
    }

    /// How many times the driver resumed `stream`'s change stream on its own, after a
    /// resumable error the runtime never saw (see `docs/checkpoint-resume.md`). `None` when the
    /// client was supplied ([`MongoBackend::from_client`]) or connected without counting
    /// ([`ConnectOptions::count_driver_resumes`]): only a client built by
    /// [`MongoBackend::connect`] carries the command monitor that counts them.
    pub fn driver_resumes(&self, stream: &str) -> Option<u64> {
        self.resumes.as_ref().map(|r| r.resumes(stream))
    }

    /// Checks the deployment with `hello`: it must be a replica-set member or a mongos.
    /// Returns every problem found.
    pub async fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = database_name_problems(&self.database);
        match self
            .client
            .database("admin")
            .run_command(doc! { "hello": 1 })
            .await
        {
            Ok(hello) => problems.extend(validate_hello(&hello)),
            Err(e) => problems.push(format!(
                "cannot reach MongoDB ({}): {}",
                self.description,
                short_error(&e)
            )),
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Fences this backend's checkpoint and dead-letter writes by the leases of `leases`
    /// instead of its own `_fw_locks`: for a `Backend` whose lease store is another one (Redis,
    /// for example) while checkpoints or dead letters stay in MongoDB. A `SingleLeader`
    /// stream's fenced writes are checked against the lease its leader holds, so they must be
    /// checked where that lease lives; without this, every fenced write of such a backend
    /// would be refused.
    pub fn fenced_by(mut self, leases: Arc<dyn flowwarden::port::LeaseStore>) -> Self {
        self.fence_leases = Some(leases);
        self
    }

    /// The server's `transactionLifetimeLimitSeconds` (default 60 s), when it was changed:
    /// a transactional stream's handler attempt that runs longer fails (the server would abort
    /// its transaction anyway). See `docs/exactly-once.md`.
    pub fn with_transaction_lifetime(mut self, limit: std::time::Duration) -> Self {
        self.transaction_lifetime = limit;
        self
    }

    /// The driver client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The database of the `_fw_` collections (and of streams that name none).
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Creates the indexes of the `_fw_` collections (idempotent: creating an existing index
    /// with the same definition is a no-op). The stores call this once on first use.
    pub async fn ensure_indexes(&self) -> Result<(), MongoBackendError> {
        stores::create_indexes(&self.client.database(&self.database)).await?;
        Ok(())
    }

    /// [`MongoBackend::ensure_indexes`] once per backend (retried on the next use if it fails).
    pub(crate) async fn indexes_ready(&self) -> Result<(), mongodb::error::Error> {
        self.indexes
            .get_or_try_init(|| async {
                match stores::create_indexes(&self.client.database(&self.database)).await {
                    Ok(()) => Ok(()),
                    Err(e) if classify::ErrorFacts::of(&e).code == Some(13) => {
                        // Indexes only speed up listing and let leases expire; a principal
                        // without `createIndex` can still run streams.
                        warn!(database = %self.database, error = %short_error(&e), "not allowed to create the indexes of the _fw_ collections; continuing without them (see docs/mongodb.md, Privileges)");
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            })
            .await
            .map(|_| ())
    }
}

impl From<MongoBackend> for Backend {
    fn from(m: MongoBackend) -> Self {
        let m = Arc::new(m);
        Backend {
            default_database: m.database.clone(),
            source: m.clone(),
            checkpoints: m.clone(),
            dead_letters: Some(m.clone()),
            transactions: Some(m.clone()),
            leases: Some(m),
        }
    }
}

/// Checks a `hello` reply: the server must be a replica-set member (`setName`) or a mongos
/// (`msg: "isdbgrid"`). Returns the problems (empty when the deployment can serve change
/// streams).
pub fn validate_hello(hello: &Document) -> Vec<String> {
    let mut problems = Vec::new();
    let set_name = matches!(hello.get("setName"), Some(Bson::String(s)) if !s.is_empty());
    let mongos = matches!(hello.get("msg"), Some(Bson::String(s)) if s == "isdbgrid");
    if !set_name && !mongos {
        problems.push(
            "the MongoDB server is a standalone: change streams need a replica set or a sharded \
             cluster. For development, start a single-node replica set: `mongod --replSet rs0` \
             then, once, `mongosh --eval 'rs.initiate()'` (or `docker compose up` with the \
             repository's docker-compose.yml); see docs/mongodb.md"
                .to_owned(),
        );
    }
    if let Some(wire) = hello.get("maxWireVersion").and_then(bson_int) {
        if wire < 9 {
            problems.push(format!(
                "the MongoDB server is too old (maxWireVersion {wire}): MongoDB 4.4 or later is required; see docs/mongodb.md"
            ));
        }
    }
    problems
}

fn bson_int(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        _ => None,
    }
}

pub(crate) fn database_name_problems(db: &str) -> Vec<String> {
    if db.is_empty() {
        return vec!["the database name is empty (set FLOWWARDEN_DATABASE or pass a name)".into()];
    }
    if let Some(c) = db
        .chars()
        .find(|c| matches!(c, '/' | '\\' | '.' | ' ' | '"' | '$' | '\0'))
    {
        return vec![format!(
            "the database name '{db}' contains '{c}', which MongoDB does not allow in database names"
        )];
    }
    Vec::new()
}

/// The first line of a driver error, without the debug noise of its `Display`.
pub(crate) fn short_error(e: &mongodb::error::Error) -> String {
    e.kind.to_string()
}

/// The connection string without its credentials, for logs.
pub fn redact_uri(uri: &str) -> String {
    let Some(scheme_end) = uri.find("://") else {
        return uri.to_owned();
    };
    let rest = &uri[scheme_end + 3..];
    let host_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..host_end].rfind('@') {
        Some(at) => format!("{}://***@{}", &uri[..scheme_end], &rest[at + 1..]),
        None => uri.to_owned(),
    }
}

/// The backend described by the environment: `None` when `FLOWWARDEN_MONGODB_URI` is not
/// set; otherwise the connected, validated backend or every problem found.
pub async fn backend_from_env() -> Option<Result<MongoBackend, Vec<String>>> {
    let uri = std::env::var(ENV_URI)
        .ok()
        .filter(|u| !u.trim().is_empty())?;
    let database = std::env::var(ENV_DATABASE)
        .ok()
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_DATABASE.to_owned());
    let count_driver_resumes = std::env::var(ENV_COUNT_DRIVER_RESUMES).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "true" | "1" | "on" | "yes"
        )
    });
    let options = ConnectOptions {
        count_driver_resumes,
    };
    Some(MongoBackend::connect_with(uri.trim(), database.trim(), options).await)
}

/// A runtime builder on the backend described by the environment (see
/// [`backend_from_env`]); the in-memory backend when `FLOWWARDEN_MONGODB_URI` is not set.
pub async fn builder_from_env() -> Result<flowwarden::Builder, Vec<String>> {
    match backend_from_env().await {
        None => Ok(flowwarden::builder()),
        Some(Ok(b)) => Ok(flowwarden::builder().backend(b)),
        Some(Err(p)) => Err(p),
    }
}

/// The MongoDB backend's driver: configures it from `FLOWWARDEN_MONGODB_URI` and
/// `FLOWWARDEN_DATABASE` (see [`backend_from_env`]). Install it with [`install_driver`], name
/// it with `flowwarden::builder().driver(&MongoDriver)`, or rely on its registration, which
/// needs this crate linked.
#[derive(Debug, Clone, Copy, Default)]
pub struct MongoDriver;

impl BackendDriver for MongoDriver {
    fn name(&self) -> &'static str {
        "mongodb"
    }

    fn configure(&self) -> ProvidedBackend {
        Box::pin(async {
            let result = backend_from_env().await?;
            if let Err(problems) = &result {
                warn!(count = problems.len(), "the MongoDB backend cannot start");
            }
            Some(result.map(Backend::from))
        })
    }
}

static DRIVER: MongoDriver = MongoDriver;

/// Installs [`MongoDriver`] for every runtime of this process, so `flowwarden::run()` uses
/// MongoDB whenever `FLOWWARDEN_MONGODB_URI` is set, whether or not the linker kept this
/// crate's registration.
pub fn install_driver() {
    flowwarden::port::install_driver(&DRIVER);
}

flowwarden::register_backend_driver!(DRIVER);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_is_refused_with_instructions() {
        let p = validate_hello(&doc! {"isWritablePrimary": true, "maxWireVersion": 21});
        assert_eq!(p.len(), 1);
        assert!(p[0].contains("--replSet rs0"), "{}", p[0]);
        assert!(p[0].contains("rs.initiate()"), "{}", p[0]);
    }

    #[test]
    fn replica_set_and_mongos_are_accepted() {
        assert!(validate_hello(&doc! {"setName": "rs0", "maxWireVersion": 21}).is_empty());
        assert!(validate_hello(&doc! {"msg": "isdbgrid", "maxWireVersion": 21i64}).is_empty());
    }

    #[test]
    fn every_problem_is_reported() {
        let p = validate_hello(&doc! {"maxWireVersion": 8});
        assert_eq!(p.len(), 2, "{p:?}");
    }

    #[test]
    fn database_names_are_checked() {
        assert!(database_name_problems("app").is_empty());
        assert_eq!(database_name_problems("").len(), 1);
        assert_eq!(database_name_problems("a.b").len(), 1);
    }

    #[test]
    fn credentials_are_redacted() {
        assert_eq!(
            redact_uri("mongodb://user:secret@h1:27017,h2/?replicaSet=rs0"),
            "mongodb://***@h1:27017,h2/?replicaSet=rs0"
        );
        assert_eq!(redact_uri("mongodb://h1/db"), "mongodb://h1/db");
        assert_eq!(
            redact_uri("mongodb+srv://u:p@c.example.net"),
            "mongodb+srv://***@c.example.net"
        );
    }
}
