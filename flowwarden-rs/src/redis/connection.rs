//! How the stores reach Redis: the settings ([`RedisConfig`]), the one shared, reconnecting
//! connection ([`RedisConnection`]), and the key layout.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, IntoConnectionInfo, Value};
use tracing::{debug, info, warn};

use super::error::store_error;
use crate::port::{StoreError, StoreErrorKind};

/// The environment variable the example and the tests read the Redis URL from.
const URL_VAR: &str = "FLOWWARDEN_REDIS_URL";

/// How to reach Redis, how long to wait for it, and the prefix of every key.
#[derive(Clone)]
pub struct RedisConfig {
    url: String,
    prefix: String,
    operation_timeout: Duration,
    connect_timeout: Duration,
}

impl RedisConfig {
    /// The default key prefix.
    pub const DEFAULT_PREFIX: &'static str = "flowwarden:";
    /// The URL used when none is given: a local server on the default port.
    pub const DEFAULT_URL: &'static str = "redis://127.0.0.1:6379";
    /// The environment variable [`RedisConfig::from_env`] reads (`FLOWWARDEN_REDIS_URL`).
    pub const URL_VAR: &'static str = URL_VAR;

    /// Settings for the server at `url` (`redis://[user:password@]host:port[/db]`; TLS is not
    /// enabled in this build), with the default prefix and timeouts (5 s per operation, 5 s per
    /// connection attempt).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            operation_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// Settings for the URL in `FLOWWARDEN_REDIS_URL`, else [`RedisConfig::DEFAULT_URL`].
    pub fn from_env() -> Self {
        Self::new(std::env::var(URL_VAR).unwrap_or_else(|_| Self::DEFAULT_URL.to_owned()))
    }

    /// The prefix of every key the stores write (default `flowwarden:`): several services,
    /// or tests, share one server by using different prefixes.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest one store operation (a script and its reply, reconnection included) may
    /// take before it fails as `Unavailable` (default 5 s).
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The longest one connection attempt may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The URL, with any password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact(&self.url)
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url())
            .field("prefix", &self.prefix)
            .field("operation_timeout", &self.operation_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// `redis://user:secret@host` as `redis://user:***@host`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => format!("{scheme}://***@{host}"),
        },
        None => url.to_owned(),
    }
}

/// Why [`RedisConnection::connect`] failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RedisConnectError {
    /// The URL does not parse.
    #[error("invalid Redis URL '{url}': {message}")]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// The server could not be reached, or did not answer `PING`.
    #[error("cannot reach Redis at '{url}': {message}")]
    Unreachable {
        /// The URL, password redacted.
        url: String,
        /// The client's error.
        message: String,
    },
    /// The server is too old: the scripts need Redis 5 or later (effects replication, so a
    /// script may read `TIME` and then write).
    #[error("Redis at '{url}' is version {version}; the flowwarden stores need 5.0 or later")]
    Unsupported {
        /// The URL, password redacted.
        url: String,
        /// The server's `redis_version`.
        version: String,
    },
}

/// One connection to Redis shared by the stores made from it: multiplexed (concurrent
/// operations share one socket) and reconnecting (after a dropped connection, the next
/// operation opens a new one). Cheap to clone.
#[derive(Clone)]
pub struct RedisConnection {
    manager: ConnectionManager,
    prefix: Arc<str>,
    operation_timeout: Duration,
    url: Arc<str>,
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConnection")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl RedisConnection {
    /// Connects and checks the server: it must answer `PING` and be Redis 5 or later. Warns
    /// (through `tracing`) when the server may evict keys or keeps no persistence, both of which
    /// can lose checkpoints and epochs (see `docs/integrations/redis.md`).
    pub async fn connect(config: &RedisConfig) -> Result<Self, RedisConnectError> {
        let url = config.redacted_url();
        let invalid = |message: String| RedisConnectError::InvalidUrl {
            url: url.clone(),
            message,
        };
        let info = config
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| invalid(e.to_string()))?;
        let client = Client::open(info).map_err(|e| invalid(e.to_string()))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.operation_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let unreachable = |message: String| RedisConnectError::Unreachable {
            url: url.clone(),
            message,
        };
        let bound = config.connect_timeout.saturating_mul(4);
        let manager = tokio::time::timeout(
            bound,
            ConnectionManager::new_with_config(client, manager_config),
        )
        .await
        .map_err(|_| unreachable(format!("no connection within {bound:?}")))?
        .map_err(|e| unreachable(e.to_string()))?;
        let connection = Self {
            manager,
            prefix: Arc::from(config.prefix.as_str()),
            operation_timeout: config.operation_timeout,
            url: Arc::from(url.as_str()),
        };
        let info: String = connection
            .query(
                "reading the server's INFO",
                ::redis::cmd("INFO").arg("server"),
            )
            .await
            .map_err(|e| unreachable(e.message))?;
        let version = info_field(&info, "redis_version").unwrap_or("unknown");
        let major = version
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok());
        if major.is_some_and(|m| m < 5) {
            return Err(RedisConnectError::Unsupported {
                url,
                version: version.to_owned(),
            });
        }
        connection.warn_about_durability().await;
        info!(url = %connection.url, version, prefix = %connection.prefix, "connected to Redis");
        Ok(connection)
    }

    /// Best effort: `CONFIG GET` is often disabled on managed servers, then nothing is said.
    async fn warn_about_durability(&self) {
        let config = |name: &'static str| async move {
            let pair: Result<Vec<String>, StoreError> = self
                .query(
                    "reading the server's configuration",
                    ::redis::cmd("CONFIG").arg("GET").arg(name),
                )
                .await;
            match pair {
                Ok(v) => v.get(1).cloned(),
                Err(e) => {
                    debug!(setting = name, error = %e, "cannot read the Redis configuration");
                    None
                }
            }
        };
        if let Some(policy) = config("maxmemory-policy").await {
            if policy.starts_with("allkeys-") {
                warn!(
                    url = %self.url,
                    policy,
                    "Redis may evict any key under memory pressure: an evicted checkpoint or lease \
                     epoch is lost; use maxmemory-policy noeviction (docs/integrations/redis.md)"
                );
            }
        }
        let aof = config("appendonly").await;
        let save = config("save").await;
        if aof.as_deref() == Some("no") && save.as_deref() == Some("") {
            warn!(
                url = %self.url,
                "Redis keeps no persistence (appendonly no, no save points): a restart of the \
                 server loses every checkpoint and lease epoch (docs/integrations/redis.md)"
            );
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key of the checkpoint hash of `stream`: `<prefix>{<stream>}:checkpoint`.
    pub(crate) fn checkpoint_key(&self, stream: &str) -> String {
        format!("{}{{{stream}}}:checkpoint", self.prefix)
    }

    /// The key of the lease hash of `stream`: `<prefix>{<stream>}:lease`.
    pub(crate) fn lease_key(&self, stream: &str) -> String {
        format!("{}{{{stream}}}:lease", self.prefix)
    }

    /// Runs one command, bounded by the operation timeout; errors as store errors.
    pub(crate) async fn query<T: ::redis::FromRedisValue>(
        &self,
        what: &str,
        cmd: &::redis::Cmd,
    ) -> Result<T, StoreError> {
        let mut conn = self.manager.clone();
        let reply = tokio::time::timeout(self.operation_timeout, cmd.query_async::<T>(&mut conn))
            .await
            .map_err(|_| self.timed_out(what))?;
        reply.map_err(|e| store_error(what, &e))
    }

    /// Runs one script with `keys` and `args`, bounded by the operation timeout.
    pub(crate) async fn eval(
        &self,
        what: &str,
        script: &::redis::Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Vec<Value>, StoreError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        let mut conn = self.manager.clone();
        let reply = tokio::time::timeout(
            self.operation_timeout,
            invocation.invoke_async::<Vec<Value>>(&mut conn),
        )
        .await
        .map_err(|_| self.timed_out(what))?;
        reply.map_err(|e| store_error(what, &e))
    }

    fn timed_out(&self, what: &str) -> StoreError {
        warn!(url = %self.url, operation = what, timeout = ?self.operation_timeout, "Redis operation timed out");
        StoreError::new(
            StoreErrorKind::Unavailable,
            format!(
                "{what}: no answer from Redis at '{}' within {:?}",
                self.url, self.operation_timeout
            ),
        )
    }
}

fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://pw@h:1"), "redis://***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn reads_info_fields() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n";
        assert_eq!(info_field(info, "redis_version"), Some("7.0.15"));
        assert_eq!(info_field(info, "nope"), None);
    }
}
