//! Which streams run (registered with `#[change_stream]` or given to the builder), which backend,
//! and every check made before any stream starts: all problems are reported at once.

use std::collections::BTreeMap;

use tracing::{info, warn};

use super::{Builder, StartupError};
use crate::backend::Backend;
use crate::definition::{Deployment, LeaseConfig, OnHistoryLost, StreamDefinition};
use crate::engine::{guard_name, AnyStream};
use crate::port;
use crate::registry;
use crate::runtime::InstanceId;

impl Builder {
    /// Gathers the streams and checks everything that can be checked before starting.
    pub(super) fn collect_streams(&self) -> Result<Vec<AnyStream>, StartupError> {
        let mut problems = Vec::new();
        let mut chosen: Vec<AnyStream> = Vec::new();
        let mut supplied = self.instances.clone();
        if self.discover {
            for reg in registry::registered() {
                let def = (reg.definition)();
                if let Some(i) = supplied.iter().position(|s| s.type_id == (reg.type_id)()) {
                    chosen.push(supplied.remove(i));
                } else if let Some(s) = (reg.build_default)() {
                    chosen.push(s);
                } else if self.wanted(def.name) {
                    problems.push(format!(
                        "stream '{}' ({} at {}) has no `Default` impl: pass an instance with `flowwarden::builder().stream({}::new(..))`",
                        def.name, def.type_name, def.source, def.type_name
                    ));
                }
            }
        }
        chosen.extend(supplied);
        chosen.retain(|s| self.wanted(s.definition().name));
        if let Some(only) = &self.only {
            for name in only {
                if !chosen.iter().any(|s| s.definition().name == name) {
                    problems.push(format!(
                        "`only` names stream '{name}', which is not registered"
                    ));
                }
            }
        }
        let mut by_name: BTreeMap<&str, &StreamDefinition> = BTreeMap::new();
        for s in &chosen {
            let def = s.definition();
            if let Some(first) = by_name.insert(def.name, def) {
                problems.push(format!(
                    "two streams are named '{}': {} at {} and {} at {}; give one a different `name`",
                    def.name, first.type_name, first.source, def.type_name, def.source
                ));
            }
            problems.extend(check_definition(def));
        }
        if chosen.is_empty() && problems.is_empty() {
            problems.push(
                "no change stream is registered: annotate an impl with #[change_stream(..)] (if you did, make sure the crate that defines it is linked: reference one of its items from main)".into(),
            );
        }
        if problems.is_empty() {
            Ok(chosen)
        } else {
            Err(StartupError { problems })
        }
    }

    fn wanted(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|n| n == name))
    }

    pub(super) async fn resolve_backend(&mut self) -> Result<Backend, StartupError> {
        if let Some(b) = self.backend.take() {
            return Ok(b);
        }
        let drivers = port::drivers(&self.drivers);
        for driver in &drivers {
            if let Some(result) = driver.configure().await {
                info!(
                    driver = driver.name(),
                    "backend configured from the environment"
                );
                return result.map_err(|problems| StartupError { problems });
            }
        }
        if std::env::var_os(port::MONGODB_URI_VAR).is_some() && drivers.is_empty() {
            return Err(StartupError {
                problems: vec![format!("{} is set but no backend driver is installed: add the `flowwarden-rs-mongo` crate and call `flowwarden_rs_mongo::install_driver()` (or unset the variable to use the in-memory backend)", port::MONGODB_URI_VAR)],
            });
        }
        #[cfg(feature = "memory")]
        {
            info!("using the embedded in-memory backend: nothing persists across process restarts (set FLOWWARDEN_MONGODB_URI for MongoDB)");
            Ok(crate::memory::MemoryBackend::new().into())
        }
        #[cfg(not(feature = "memory"))]
        Err(StartupError {
            problems: vec!["no backend: pass one with `Builder::backend`, set FLOWWARDEN_MONGODB_URI with the `flowwarden-rs-mongo` crate linked, or enable the `memory` feature of flowwarden-rs for the embedded in-memory backend".into()],
        })
    }
}

/// The checks of one definition that the macros cannot make (hand-written definitions).
fn check_definition(def: &StreamDefinition) -> Vec<String> {
    let mut p = Vec::new();
    let at = format!(
        "stream '{}' ({} at {})",
        def.name, def.type_name, def.source
    );
    if def.name.trim().is_empty() {
        p.push(format!("{at}: the name is empty"));
    }
    if def.collection.trim().is_empty() {
        p.push(format!("{at}: the collection is empty"));
    }
    if def.checkpoint.save_every_n == 0 {
        p.push(format!("{at}: save_every_n must be at least 1"));
    }
    if def.retry.max_attempts == 0 {
        p.push(format!(
            "{at}: retry max_attempts must be at least 1 (it counts the first try)"
        ));
    }
    if def.restart.initial_delay_ms == 0 {
        p.push(format!("{at}: restart initial_delay_ms must not be 0"));
    }
    if def.transactional && def.concurrency.concurrency() > 1 {
        p.push(format!(
            "{at}: `transactional = true` handles one event at a time (each event's writes commit with the checkpoint that moves past it); remove `concurrency = {}`",
            def.concurrency.concurrency
        ));
    }
    p
}

/// Every `SingleLeader` stream needs a lease store; every transactional stream a transaction
/// store whose handle type its handlers take.
pub(super) fn check_deployments(
    streams: &[AnyStream],
    backend: &Backend,
) -> Result<(), StartupError> {
    let mut problems: Vec<String> = streams
        .iter()
        .map(|s| s.definition())
        .filter(|d| matches!(d.deployment, Deployment::SingleLeader(_)) && backend.leases.is_none())
        .map(|d| {
            format!(
                "stream '{}' is SingleLeader but the backend has no lease store",
                d.name
            )
        })
        .collect();
    for s in streams.iter().filter(|s| s.definition().transactional) {
        let name = s.definition().name;
        let Some(store) = &backend.transactions else {
            problems.push(format!(
                "stream '{name}' is transactional but the backend offers no transactions: use MongoDB (a replica set) or the in-memory backend, whose transaction stores keep the checkpoint with the handler's writes (docs/exactly-once.md)"
            ));
            continue;
        };
        let offered = store.handle_type();
        for wanted in s.inner.transaction_types() {
            if wanted != offered {
                problems.push(format!(
                    "stream '{name}' takes a `&{}` but the backend's transactions ({}) hand out `{}`: take `&{}` in its handlers",
                    wanted.name,
                    store.describe(),
                    offered.name,
                    offered.name
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(StartupError { problems })
    }
}

/// The checkpoint guard's timing must let it renew before it expires.
pub(super) fn check_guard_timing(guard: LeaseConfig) -> Result<(), StartupError> {
    if guard.renew_secs == 0
        || guard.standby_poll_secs == 0
        || guard.renew_secs * 2 > guard.lease_secs
    {
        return Err(StartupError {
            problems: vec![format!(
                "checkpoint_guard: renew_secs ({}) and standby_poll_secs ({}) must be at least 1, and renew_secs at most half of lease_secs ({})",
                guard.renew_secs, guard.standby_poll_secs, guard.lease_secs
            )],
        });
    }
    Ok(())
}

/// Warnings a macro cannot emit on stable Rust, logged at startup.
pub(super) fn log_warnings(def: &StreamDefinition, backend: &Backend, instance: &InstanceId) {
    if def.deployment == Deployment::AllInstances && !instance.is_configured() {
        if backend.leases.is_some() {
            info!(stream = def.name, guard = %guard_name(def.name), "AllInstances without a configured instance identity: one instance runs this stream under the checkpoint named after it, holding its checkpoint guard; a second instance halts (SharedCheckpoint) instead of sharing it. Give each replica a stable FLOWWARDEN_INSTANCE_ID to run several (docs/deployment.md)");
        } else {
            warn!(stream = def.name, "AllInstances without a configured instance identity on a backend without a lease store: the checkpoint is kept under the stream name and nothing stops two instances from sharing it (which loses events). Run one instance, give each a stable FLOWWARDEN_INSTANCE_ID, or add a lease store (docs/runbooks/shared-checkpoint.md)");
        }
    }
    let has_dead_letters = backend.dead_letters.is_some();
    let c = &def.checkpoint;
    if c.save_interval_secs == 0 && c.save_every_n > 1 {
        warn!(stream = def.name, "save_interval_secs = 0 with save_every_n = {}: no heartbeat writes the settled position, so after a crash up to {} handled events are delivered again and filtered-out or idle progress is not saved until the next handled batch", c.save_every_n, c.save_every_n - 1);
    }
    if c.on_history_lost == OnHistoryLost::ResumeFromNow {
        warn!(stream = def.name, "on_history_lost = ResumeFromNow accepts a gap when history is lost (it is logged and counted, but the changes are not delivered)");
    }
    if !has_dead_letters {
        warn!(
            stream = def.name,
            "no dead-letter store: an event that exhausts its retries halts the stream"
        );
    }
}
