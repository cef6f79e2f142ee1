//! Cases of the lease store: acquisition, refusal, renewal, expiry, release and epochs.
//!
//! Expiry is real: leases are taken with a TTL of a few hundred milliseconds and the case
//! waits it out (the store judges expiry by its own clock).

use super::support::{
    acquire, ensure, ensure_eq, CaseResult, Cx, Failure, Step, LONG_TTL, PAST_SHORT_TTL, SHORT_TTL,
};
use super::target::ConformanceTarget;

const NAME: &str = "conformance-lease";

/// `try_acquire` of a lease nobody ever held succeeds with epoch 1, for that stream and owner.
pub(crate) async fn acquire_free_lease_gets_epoch_1<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let leases = cx.leases()?;
    let a = acquire(&*leases, NAME, "instance-a", LONG_TTL).await?;
    ensure_eq!(a.stream.as_str(), NAME, "the lease's stream");
    ensure_eq!(a.owner.as_str(), "instance-a", "the lease's owner");
    ensure_eq!(a.epoch, 1, "the epoch of the first acquisition");
    Ok(())
}

/// While a lease is held, another owner's `try_acquire` is refused (`None`) and leaves it
/// with its holder.
pub(crate) async fn held_lease_refuses_another_owner<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let leases = cx.leases()?;
    let a = acquire(&*leases, NAME, "instance-a", LONG_TTL).await?;
    let b = leases
        .try_acquire(NAME, "instance-b", LONG_TTL)
        .await
        .step("try_acquire by a second owner")?;
    ensure_eq!(
        b,
        None,
        "try_acquire by a second owner while the lease is held"
    );
    let cur = leases.current(NAME).await.step("current")?;
    ensure_eq!(
        cur.map(|l| (l.owner, l.epoch)),
        Some((a.owner.clone(), a.epoch)),
        "current after a refused acquisition"
    );
    let renewed = leases
        .renew(&a, LONG_TTL)
        .await
        .step("renew by the holder")?;
    ensure!(
        renewed.is_some(),
        "the holder could not renew after a refused acquisition by another owner"
    );
    Ok(())
}

/// `renew` keeps owner and epoch and pushes the expiry out: past the original TTL another
/// owner is still refused.
pub(crate) async fn renew_extends<T: ConformanceTarget>(cx: &Cx<'_, T>) -> CaseResult {
    let leases = cx.leases()?;
    let a = acquire(&*leases, NAME, "instance-a", SHORT_TTL).await?;
    let renewed = leases
        .renew(&a, LONG_TTL)
        .await
        .step("renew")?
        .ok_or_else(|| Failure::Failed("renew of a held lease returned None".into()))?;
    ensure_eq!(
        (renewed.owner.as_str(), renewed.epoch),
        (a.owner.as_str(), a.epoch),
        "owner and epoch after renew"
    );
    ensure!(
        renewed.expires_at > a.expires_at,
        "renew with a longer TTL did not move the expiry out: {} then {}",
        a.expires_at,
        renewed.expires_at
    );
    tokio::time::sleep(PAST_SHORT_TTL).await;
    let b = leases
        .try_acquire(NAME, "instance-b", LONG_TTL)
        .await
        .step("try_acquire past the original TTL")?;
    ensure_eq!(
        b,
        None,
        "try_acquire by another owner past the original TTL of a renewed lease"
    );
    Ok(())
}

/// After a lease expires another owner acquires it with a strictly higher epoch; the old
/// holder can no longer renew it, and its stale release does not free it.
pub(crate) async fn expired_lease_goes_to_another_owner_with_higher_epoch<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let leases = cx.leases()?;
    let a = acquire(&*leases, NAME, "instance-a", SHORT_TTL).await?;
    tokio::time::sleep(PAST_SHORT_TTL).await;
    let b = acquire(&*leases, NAME, "instance-b", LONG_TTL).await?;
    ensure!(
        b.epoch > a.epoch,
        "epoch after expiry and a new owner: {} then {}",
        a.epoch,
        b.epoch
    );
    let renewed = leases
        .renew(&a, LONG_TTL)
        .await
        .step("renew by the old holder")?;
    ensure_eq!(
        renewed,
        None,
        "renew by the old holder after another owner took the lease"
    );
    leases.release(&a).await.step("release by the old holder")?;
    let c = leases
        .try_acquire(NAME, "instance-c", LONG_TTL)
        .await
        .step("try_acquire by a third owner")?;
    ensure_eq!(
        c,
        None,
        "try_acquire by a third owner after the old holder's stale release"
    );
    let cur = leases.current(NAME).await.step("current")?;
    ensure_eq!(
        cur.map(|l| (l.owner, l.epoch)),
        Some((b.owner.clone(), b.epoch)),
        "current after the old holder's stale release"
    );
    Ok(())
}

/// Epochs never restart: across release, expiry and owners, every acquisition's epoch is
/// higher than the one before.
pub(crate) async fn epochs_never_restart<T: ConformanceTarget>(cx: &Cx<'_, T>) -> CaseResult {
    let leases = cx.leases()?;
    let mut epochs = Vec::new();
    let a1 = acquire(&*leases, NAME, "instance-a", LONG_TTL).await?;
    epochs.push(a1.epoch);
    leases.release(&a1).await.step("release")?;
    let b = acquire(&*leases, NAME, "instance-b", SHORT_TTL).await?;
    epochs.push(b.epoch);
    tokio::time::sleep(PAST_SHORT_TTL).await;
    let a2 = acquire(&*leases, NAME, "instance-a", LONG_TTL).await?;
    epochs.push(a2.epoch);
    leases.release(&a2).await.step("release")?;
    let a3 = acquire(&*leases, NAME, "instance-a", LONG_TTL).await?;
    epochs.push(a3.epoch);
    ensure!(
        epochs.windows(2).all(|w| w[1] > w[0]),
        "epochs of successive acquisitions (release, expiry, release) must grow: {epochs:?}"
    );
    Ok(())
}

/// `release` frees the lease at once: another owner acquires it right away.
pub(crate) async fn release_frees_at_once<T: ConformanceTarget>(cx: &Cx<'_, T>) -> CaseResult {
    let leases = cx.leases()?;
    let a = acquire(&*leases, NAME, "instance-a", LONG_TTL).await?;
    leases.release(&a).await.step("release")?;
    let b = leases
        .try_acquire(NAME, "instance-b", LONG_TTL)
        .await
        .step("try_acquire right after a release")?
        .ok_or_else(|| {
            Failure::Failed("another owner was refused right after the holder released".into())
        })?;
    ensure_eq!(b.owner.as_str(), "instance-b", "the new lease's owner");
    let renewed = leases
        .renew(&a, LONG_TTL)
        .await
        .step("renew of a released lease")?;
    ensure_eq!(
        renewed,
        None,
        "renew of a lease released and taken by another owner"
    );
    Ok(())
}

/// A holder that acquires its own live lease again gets a new, higher epoch, and its previous
/// incarnation (the old epoch) can no longer renew: a restarted instance with the same
/// identity fences out its predecessor.
pub(crate) async fn holder_reacquire_bumps_epoch<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let leases = cx.leases()?;
    let first = acquire(&*leases, NAME, "instance-a", LONG_TTL).await?;
    let again = leases
        .try_acquire(NAME, "instance-a", LONG_TTL)
        .await
        .step("try_acquire by the holder")?
        .ok_or_else(|| Failure::Failed("the holder was refused its own live lease".into()))?;
    ensure!(
        again.epoch > first.epoch,
        "epoch after the holder acquired again: {} then {}",
        first.epoch,
        again.epoch
    );
    let renewed = leases
        .renew(&first, LONG_TTL)
        .await
        .step("renew with the previous epoch")?;
    ensure_eq!(renewed, None, "renew with the holder's previous epoch");
    Ok(())
}

/// `current` is `None` for a lease never taken, reports the holder and epoch while held, and
/// still reports the last lease (live or not) after a release.
pub(crate) async fn current_reports_holder<T: ConformanceTarget>(cx: &Cx<'_, T>) -> CaseResult {
    let leases = cx.leases()?;
    let none = leases
        .current(NAME)
        .await
        .step("current of a lease never taken")?;
    ensure_eq!(none, None, "current of a lease never taken");
    let a = acquire(&*leases, NAME, "instance-a", LONG_TTL).await?;
    let cur = leases.current(NAME).await.step("current while held")?;
    ensure_eq!(
        cur.map(|l| (l.stream, l.owner, l.epoch)),
        Some((NAME.to_owned(), a.owner.clone(), a.epoch)),
        "current while held"
    );
    leases.release(&a).await.step("release")?;
    let cur = leases.current(NAME).await.step("current after release")?;
    ensure_eq!(
        cur.map(|l| (l.owner, l.epoch)),
        Some((a.owner.clone(), a.epoch)),
        "current after release (the last lease, live or not: its epoch is kept)"
    );
    Ok(())
}
