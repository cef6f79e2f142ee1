//! Connecting to MongoDB with a short server-selection timeout, and what `hello` tells: the
//! server's clock (by which leases and recent saves are judged) and its operation time.

use std::time::Duration;

use bson::{doc, Bson, DateTime, Document, Timestamp};
use mongodb::error::ErrorKind;
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database};
use tracing::{debug, warn};

use super::error::CliError;
use super::GlobalArgs;
use crate::{redact_uri, MongoBackend, CHECKPOINTS, DEAD_LETTERS, LOCKS};

/// An open connection: the backend (whose stores the commands reuse) and the database.
pub(crate) struct Conn {
    pub(crate) backend: MongoBackend,
    pub(crate) db: Database,
}

/// What one `hello` said about time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerClock {
    /// The server's wall clock (`localTime`); the client's when the reply has none.
    pub(crate) now: DateTime,
    /// The newest operation time the server reported (`operationTime`, `lastWrite.opTime.ts`,
    /// `$clusterTime.clusterTime`: the largest of those present).
    pub(crate) operation_time: Option<Timestamp>,
}

impl Conn {
    /// Connects as `g` says and checks the server answers.
    pub(crate) async fn open(g: &GlobalArgs) -> Result<Conn, CliError> {
        let uri = g
            .uri
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| {
                CliError::BadConfig(format!(
                    "no MongoDB connection string: pass --uri or set {}",
                    crate::ENV_URI
                ))
            })?;
        let database = g.database.trim();
        if let Some(problem) = crate::database_name_problems(database).into_iter().next() {
            return Err(CliError::BadConfig(format!(
                "{problem} (--database / {})",
                crate::ENV_DATABASE
            )));
        }
        let mut options = ClientOptions::parse(uri).await.map_err(|e| {
            let detail = crate::short_error(&e);
            let message = format!(
                "cannot use the MongoDB connection string {}: {detail}",
                redact_uri(uri)
            );
            match e.kind.as_ref() {
                // An SRV or TXT lookup that failed is the network's problem, not the string's.
                ErrorKind::DnsResolve { .. } | ErrorKind::Io(_) => CliError::Unreachable(message),
                _ => CliError::BadConfig(message),
            }
        })?;
        let timeout = Duration::from_secs(g.timeout.max(1));
        if options.server_selection_timeout.is_none() {
            options.server_selection_timeout = Some(timeout);
        }
        if options.connect_timeout.is_none() {
            options.connect_timeout = Some(timeout);
        }
        if options.app_name.is_none() {
            options.app_name = Some("flowwarden-cli".to_owned());
        }
        let client = Client::with_options(options).map_err(|e| {
            CliError::BadConfig(format!(
                "cannot use the MongoDB connection string {}: {}",
                redact_uri(uri),
                crate::short_error(&e)
            ))
        })?;
        let conn = Conn {
            db: client.database(database),
            backend: MongoBackend::from_client(client, database),
        };
        conn.hello().await?;
        debug!(server = %redact_uri(uri), database, "connected");
        Ok(conn)
    }

    /// `_fw_checkpoints`.
    pub(crate) fn checkpoints(&self) -> Collection<Document> {
        self.db.collection(CHECKPOINTS)
    }

    /// `_fw_dlq`.
    pub(crate) fn dead_letters(&self) -> Collection<Document> {
        self.db.collection(DEAD_LETTERS)
    }

    /// `_fw_locks`.
    pub(crate) fn locks(&self) -> Collection<Document> {
        self.db.collection(LOCKS)
    }

    /// The database's name.
    pub(crate) fn database(&self) -> &str {
        self.backend.database()
    }

    /// Runs `hello` on `admin`.
    pub(crate) async fn hello(&self) -> Result<Document, CliError> {
        self.backend
            .client()
            .database("admin")
            .run_command(doc! { "hello": 1 })
            .await
            .map_err(|e| CliError::driver("connecting", &e))
    }

    /// The server's clock and operation time now.
    pub(crate) async fn clock(&self) -> Result<ServerClock, CliError> {
        let hello = self.hello().await?;
        Ok(clock_of(&hello))
    }
}

/// Reads the clock and the newest operation time from a `hello` reply.
pub(crate) fn clock_of(hello: &Document) -> ServerClock {
    let now = match hello.get("localTime") {
        Some(Bson::DateTime(t)) => *t,
        _ => {
            warn!("the server's hello reply has no localTime: leases and recent saves are judged by this machine's clock");
            DateTime::now()
        }
    };
    let ts = |b: Option<&Bson>| match b {
        Some(Bson::Timestamp(t)) => Some(*t),
        _ => None,
    };
    let candidates = [
        ts(hello.get("operationTime")),
        hello
            .get_document("lastWrite")
            .ok()
            .and_then(|w| w.get_document("opTime").ok())
            .and_then(|o| ts(o.get("ts"))),
        hello
            .get_document("$clusterTime")
            .ok()
            .and_then(|c| ts(c.get("clusterTime"))),
    ];
    let operation_time = candidates
        .into_iter()
        .flatten()
        .max_by_key(|t| (t.time, t.increment));
    ServerClock {
        now,
        operation_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_operation_time_wins() {
        let hello = doc! {
            "localTime": DateTime::from_millis(5_000),
            "operationTime": Timestamp { time: 10, increment: 2 },
            "lastWrite": { "opTime": { "ts": Timestamp { time: 10, increment: 3 }, "t": 1_i64 } },
        };
        let c = clock_of(&hello);
        assert_eq!(c.now, DateTime::from_millis(5_000));
        assert_eq!(
            c.operation_time,
            Some(Timestamp {
                time: 10,
                increment: 3
            })
        );
        assert_eq!(clock_of(&doc! {}).operation_time, None);
    }
}
