//! Serving the admin API: where (builder or environment), binding, and the server task that
//! stops with the runtime.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::error::AdminError;
use super::metrics;
use super::router::{router, AppState};
use crate::runtime::RuntimeHandle;

/// The environment variable naming the admin API's address when [`crate::Builder::admin`] is
/// not called: `9090` or `:9090` (both bind 127.0.0.1), `0.0.0.0:9090`, `[::1]:9090`,
/// `localhost:9090`.
pub const ADMIN_ADDR_VAR: &str = "FLOWWARDEN_ADMIN_ADDR";

/// The environment variable holding the bearer token of the mutating routes when
/// [`crate::Builder::admin_token`] is not called.
pub const ADMIN_TOKEN_VAR: &str = "FLOWWARDEN_ADMIN_TOKEN";

/// What the builder was told.
#[derive(Debug, Default)]
pub(crate) struct AdminSettings {
    pub(crate) addr: Option<SocketAddr>,
    pub(crate) token: Option<String>,
}

/// Where an address value points before it is resolved.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Addr(SocketAddr),
    Host(String),
}

/// Parses an address value: a bare port or `:port` is on 127.0.0.1; `ip:port` as given;
/// `host:port` is resolved later.
fn parse_addr(value: &str) -> Result<Target, String> {
    let value = value.trim();
    let loopback = |port: &str| {
        port.parse::<u16>()
            .map(|p| Target::Addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p)))
            .map_err(|_| format!("'{port}' is not a port"))
    };
    if let Some(port) = value.strip_prefix(':') {
        return loopback(port);
    }
    if value.bytes().all(|b| b.is_ascii_digit()) && !value.is_empty() {
        return loopback(value);
    }
    if let Ok(addr) = value.parse::<SocketAddr>() {
        return Ok(Target::Addr(addr));
    }
    if value.parse::<IpAddr>().is_ok() {
        return Err("it has no port".into());
    }
    match value.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(Target::Host(value.to_owned()))
        }
        _ => Err("expected a port, ':port', 'ip:port' or 'host:port'".into()),
    }
}

async fn resolve(settings: &AdminSettings) -> Result<Option<SocketAddr>, AdminError> {
    if let Some(addr) = settings.addr {
        return Ok(Some(addr));
    }
    let Some(value) = std::env::var(ADMIN_ADDR_VAR)
        .ok()
        .filter(|v| !v.trim().is_empty())
    else {
        return Ok(None);
    };
    let invalid = |reason: String| AdminError::InvalidAddress {
        source_name: ADMIN_ADDR_VAR,
        value: value.clone(),
        reason,
    };
    match parse_addr(&value).map_err(invalid)? {
        Target::Addr(addr) => Ok(Some(addr)),
        Target::Host(host) => tokio::net::lookup_host(host.as_str())
            .await
            .map_err(|e| invalid(e.to_string()))?
            .next()
            .map(Some)
            .ok_or_else(|| invalid("the host resolves to no address".into())),
    }
}

fn token(settings: &AdminSettings) -> Option<Arc<str>> {
    let token = settings
        .token
        .clone()
        .or_else(|| std::env::var(ADMIN_TOKEN_VAR).ok())?;
    let token = token.trim();
    if token.is_empty() {
        warn!("the admin token is empty; mutating admin endpoints stay disabled");
        return None;
    }
    Some(token.into())
}

/// Binds and serves the admin API when the builder or [`ADMIN_ADDR_VAR`] asks for it: the
/// bound address and the server task, which stops when the runtime shuts down.
pub(crate) async fn launch(
    handle: &RuntimeHandle,
    settings: AdminSettings,
) -> Result<Option<(SocketAddr, JoinHandle<()>)>, AdminError> {
    let Some(addr) = resolve(&settings).await? else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| AdminError::Bind {
        addr: addr.to_string(),
        source,
    })?;
    let token = token(&settings);
    metrics::exporter();
    info!(addr = %bound, mutating = token.is_some(), "admin API listening");
    if !bound.ip().is_loopback() && token.is_none() {
        info!(addr = %bound, "the admin API is reachable beyond this host; its read endpoints (dead letters include event documents) need no token");
    }
    let app = router(AppState {
        handle: handle.clone(),
        token,
    });
    let mut shutdown = handle.shutdown_signal();
    let task = tokio::spawn(async move {
        let upkeep = tokio::spawn(async {
            let mut every = tokio::time::interval(metrics::UPKEEP_EVERY);
            loop {
                every.tick().await;
                metrics::upkeep();
            }
        });
        let stopped = async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            warn!(error = %e, "admin API server failed");
        }
        upkeep.abort();
        info!(addr = %bound, "admin API stopped");
    });
    Ok(Some((bound, task)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(port: u16) -> Target {
        Target::Addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_addr("9090"), Ok(local(9090)));
        assert_eq!(parse_addr(":9090"), Ok(local(9090)));
        assert_eq!(parse_addr(" 0 "), Ok(local(0)));
        assert_eq!(
            parse_addr("0.0.0.0:8080"),
            Ok(Target::Addr("0.0.0.0:8080".parse().unwrap()))
        );
        assert_eq!(
            parse_addr("[::1]:8080"),
            Ok(Target::Addr("[::1]:8080".parse().unwrap()))
        );
        assert_eq!(
            parse_addr("localhost:8080"),
            Ok(Target::Host("localhost:8080".into()))
        );
        for bad in ["", "abc", "99999", ":x", "10.0.0.1", "host:", ":"] {
            assert!(parse_addr(bad).is_err(), "{bad}");
        }
    }
}
