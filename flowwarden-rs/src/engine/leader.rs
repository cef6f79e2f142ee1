//! `SingleLeader` streams: stand by until the lease is ours, run the stream fenced by the
//! lease's epoch, renew on a dedicated task, and stop before the lease can expire.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{AbortOnDrop, ErasedStream, StreamEnv, StreamExit};
use crate::definition::LeaseConfig;
use crate::port::{Fence, Lease, LeaseStore};
use crate::status::{HaltReason, StreamState};

/// Runs `stream` whenever this instance holds its lease; stands by otherwise.
pub(crate) async fn run_single_leader(
    stream: Arc<dyn ErasedStream>,
    env: StreamEnv,
    leases: Arc<dyn LeaseStore>,
    owner: String,
    cfg: LeaseConfig,
) -> StreamExit {
    let name = stream.definition().name;
    let mut external_stop = env.stop.clone();
    loop {
        if *external_stop.borrow() {
            env.status.set_state(StreamState::Stopped);
            return StreamExit::Stopped;
        }
        env.status.update(|s| s.state = StreamState::Standby);
        // The store grants the lease at or after this instant, however late its answer comes:
        // the lease's validity is counted from here.
        let asked_at = Instant::now();
        let lease = match leases.try_acquire(name, &owner, cfg.lease()).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                wait_or_stop(&mut external_stop, cfg.standby_poll()).await;
                continue;
            }
            Err(e) if e.kind == crate::port::StoreErrorKind::Corrupt => {
                error!(stream = name, error = %e, "the stream's lease cannot be read; standing by until it is fixed (docs/runbooks/fenced.md)");
                wait_or_stop(&mut external_stop, cfg.standby_poll()).await;
                continue;
            }
            Err(e) => {
                warn!(stream = name, error = %e, "lease store unavailable; standing by");
                wait_or_stop(&mut external_stop, cfg.standby_poll()).await;
                continue;
            }
        };
        if Instant::now() + cfg.renew() >= asked_at + cfg.lease() {
            warn!(
                stream = name,
                epoch = lease.epoch,
                "the lease was granted too late to be used before it expires; standing by"
            );
            release(&*leases, &lease, name).await;
            wait_or_stop(&mut external_stop, cfg.standby_poll()).await;
            continue;
        }
        info!(stream = name, owner = %owner, epoch = lease.epoch, "this instance leads the stream");
        let fence = Fence {
            owner: owner.clone(),
            epoch: lease.epoch,
        };
        let exit =
            run_while_held(&*stream, &env, &leases, &lease, asked_at, cfg, Some(fence)).await;
        let stopping = *external_stop.borrow();
        match exit {
            StreamExit::Halted(h) if h.reason == HaltReason::Fenced => {
                warn!(
                    stream = name,
                    "deposed: another instance holds the stream now; standing by"
                );
            }
            StreamExit::Stopped if !stopping => {
                warn!(
                    stream = name,
                    epoch = lease.epoch,
                    "leadership lost (lease not renewed in time); standing by"
                );
            }
            other => {
                // Stopped on request or halted: progress is flushed; only now free the lease,
                // so a standby never overlaps this leader.
                release(&*leases, &lease, name).await;
                return other;
            }
        }
    }
}

/// Runs one session of `stream` while this instance holds `lease`: a task renews it, and the
/// session stops (flushing its progress) when the lease is lost or cannot be renewed in time,
/// or when `env.stop` asks for it.
pub(super) async fn run_while_held(
    stream: &dyn ErasedStream,
    env: &StreamEnv,
    leases: &Arc<dyn LeaseStore>,
    lease: &Lease,
    asked_at: Instant,
    cfg: LeaseConfig,
    fence: Option<Fence>,
) -> StreamExit {
    let (session_tx, session_rx) = watch::channel(false);
    let session_tx = Arc::new(session_tx);
    let _renewer = AbortOnDrop(tokio::spawn(renew_loop(
        leases.clone(),
        lease.clone(),
        asked_at,
        cfg,
        session_tx.clone(),
    )));
    let _forwarder = AbortOnDrop(tokio::spawn({
        let mut stop = env.stop.clone();
        let tx = session_tx.clone();
        async move {
            let _ = stop.wait_for(|s| *s).await;
            let _ = tx.send(true);
        }
    }));
    let session_env = StreamEnv {
        source: env.source.clone(),
        checkpoints: env.checkpoints.clone(),
        dead_letters: env.dead_letters.clone(),
        status: env.status.clone(),
        probe: env.probe.clone(),
        stop: session_rx,
        options: env.options.clone(),
        checkpoint_key: env.checkpoint_key.clone(),
        fence,
        instance: env.instance.clone(),
        transactions: env.transactions.clone(),
    };
    stream.run(session_env).await
}

pub(super) async fn release(leases: &dyn LeaseStore, lease: &Lease, name: &str) {
    if let Err(e) = leases.release(lease).await {
        warn!(stream = name, error = %e, "could not release the lease; it expires by itself");
    }
}

/// Waits `period`, or less when a stop is requested.
pub(super) async fn wait_or_stop(stop: &mut watch::Receiver<bool>, period: std::time::Duration) {
    tokio::select! {
        _ = tokio::time::sleep(period) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}

/// Renews every `renew_secs`. When the lease is lost, or cannot be renewed before one renew
/// period remains on it, stops the session: the leader stops before its lease can expire. A
/// renewal that does not answer (a partition while the driver waits for its timeout, a
/// saturated connection pool) is waited for only while it could still help.
async fn renew_loop(
    leases: Arc<dyn LeaseStore>,
    mut lease: Lease,
    asked_at: Instant,
    cfg: LeaseConfig,
    stop: Arc<watch::Sender<bool>>,
) {
    let name = lease.stream.clone();
    let mut valid_until = asked_at + cfg.lease();
    loop {
        tokio::time::sleep(cfg.renew()).await;
        let attempt_at = Instant::now();
        let answer_by = valid_until
            .checked_sub(cfg.renew() / 2)
            .unwrap_or(valid_until);
        match tokio::time::timeout_at(answer_by, leases.renew(&lease, cfg.lease())).await {
            Ok(Ok(Some(renewed))) => {
                lease = renewed;
                valid_until = attempt_at + cfg.lease();
            }
            Ok(Ok(None)) => {
                warn!(stream = %name, epoch = lease.epoch, "lease lost; stopping the stream");
                let _ = stop.send(true);
                return;
            }
            Ok(Err(e)) => {
                warn!(stream = %name, error = %e, "lease renewal failed");
                if Instant::now() + cfg.renew() >= valid_until {
                    warn!(stream = %name, "the lease cannot be renewed before it expires; stopping the stream");
                    let _ = stop.send(true);
                    return;
                }
            }
            Err(_) => {
                warn!(stream = %name, epoch = lease.epoch, "the lease renewal did not answer before the lease runs out; stopping the stream");
                let _ = stop.send(true);
                return;
            }
        }
    }
}
