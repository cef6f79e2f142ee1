//! The checkpoint guard of `AllInstances` streams that run without a configured instance
//! identity.
//!
//! Such a stream keeps one checkpoint under the stream's name. Two replicas running it would
//! overwrite each other's progress: a slow replica that crashes and restarts would load its
//! faster sibling's position and never see what it had not handled. So while the stream runs,
//! its instance holds a lease named `<stream>#checkpoint` in the backend's lease store. An
//! instance that finds the guard held waits up to one lease period (a crashed predecessor's
//! guard expires by then) and then halts with [`HaltReason::SharedCheckpoint`] instead of
//! sharing the checkpoint silently.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::leader::{release, run_while_held, wait_or_stop};
use super::{ErasedStream, StreamEnv, StreamExit};
use crate::definition::LeaseConfig;
use crate::port::LeaseStore;
use crate::status::{Halt, HaltReason, StreamState};

/// The lease name of a stream's checkpoint guard.
pub(crate) fn guard_name(stream: &str) -> String {
    format!("{stream}#checkpoint")
}

/// Runs `stream` while this instance holds its checkpoint guard; halts when another live
/// instance holds it.
pub(crate) async fn run_guarded(
    stream: Arc<dyn ErasedStream>,
    env: StreamEnv,
    leases: Arc<dyn LeaseStore>,
    cfg: LeaseConfig,
) -> StreamExit {
    let name = stream.definition().name;
    let guard = guard_name(name);
    let owner = env.instance.clone();
    let mut stop = env.stop.clone();
    // A guard held by a crashed predecessor expires within one lease period.
    let mut give_up_at = Instant::now() + cfg.lease() + cfg.standby_poll();
    let mut waiting_logged = false;
    loop {
        if *stop.borrow() {
            env.status.set_state(StreamState::Stopped);
            return StreamExit::Stopped;
        }
        let asked_at = Instant::now();
        let lease = match leases.try_acquire(&guard, &owner, cfg.lease()).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                let holder = match leases.current(&guard).await {
                    Ok(Some(l)) => l.owner,
                    _ => "another instance".into(),
                };
                if Instant::now() >= give_up_at {
                    return shared(&env, name, &holder);
                }
                if !waiting_logged {
                    info!(stream = name, holder = %holder, guard = %guard, "the stream's checkpoint guard is held by another instance; waiting for it to expire (a crashed instance's guard does within {} s)", cfg.lease_secs);
                    waiting_logged = true;
                }
                wait_or_stop(&mut stop, cfg.standby_poll()).await;
                continue;
            }
            Err(e) => {
                warn!(stream = name, guard = %guard, error = %e, "lease store unavailable: cannot take the checkpoint guard; retrying");
                wait_or_stop(&mut stop, cfg.standby_poll()).await;
                continue;
            }
        };
        info!(stream = name, owner = %owner, guard = %guard, "checkpoint guard taken");
        let exit = run_while_held(&*stream, &env, &leases, &lease, asked_at, cfg, None).await;
        if matches!(exit, StreamExit::Stopped) && !*stop.borrow() {
            // The guard was lost (not renewed in time): the stream stopped and flushed. Take
            // it again, or find who took it and halt.
            warn!(stream = name, guard = %guard, "checkpoint guard lost (not renewed in time); taking it again");
            give_up_at = Instant::now() + cfg.lease() + cfg.standby_poll();
            waiting_logged = false;
            continue;
        }
        release(&*leases, &lease, name).await;
        return exit;
    }
}

/// Halts: another live instance runs this stream under the same checkpoint.
fn shared(env: &StreamEnv, name: &str, holder: &str) -> StreamExit {
    let reason = HaltReason::SharedCheckpoint;
    let halt = Halt::new(reason, format!(
            "stream '{name}' is AllInstances without a configured instance identity, and another live instance ({holder}) runs it under the same checkpoint; sharing it would lose events. Give each replica its own FLOWWARDEN_INSTANCE_ID, or use deployment = SingleLeader"
        ));
    error!(
        stream = name,
        runbook = halt.runbook,
        "stream halted: {}",
        halt.message
    );
    env.status.update(|s| {
        s.state = StreamState::Stopped;
        s.halt = Some(halt.clone());
    });
    StreamExit::Halted(halt)
}
