//! Cases of the checkpoint store: round trips, claims, and fencing by epoch.
//!
//! The engine fences a `SingleLeader` stream's checkpoint with the lease of the same name: the
//! checkpoint key, the lease name and `Checkpoint::stream` are all the stream's name (an
//! `AllInstances` stream with a configured identity keys its checkpoint `name@instance` and
//! writes it unfenced). So these cases take the lease named like the checkpoint key.

use bson::{doc, DateTime};
use flowwarden::port::{StoreError, StoreErrorKind};

use super::support::{
    acquire, checkpoint, ensure, ensure_eq, fence, positions, take_over, CaseResult, Cx, Failure,
    Step, LONG_TTL, SHORT_TTL,
};
use super::target::ConformanceTarget;

const KEY: &str = "conformance-checkpoint";

fn fenced(r: Result<(), StoreError>, what: &str) -> CaseResult {
    match r {
        Err(e) if e.kind == StoreErrorKind::Fenced => Ok(()),
        Err(e) => Err(Failure::Failed(format!(
            "{what}: expected a Fenced error, got {e}"
        ))),
        Ok(()) => Err(Failure::Failed(format!(
            "{what}: expected a Fenced error, the write was accepted"
        ))),
    }
}

/// `load` of a stream nothing was written for is `None`, also when another stream has one.
pub(crate) async fn unknown_stream_loads_none<T: ConformanceTarget>(cx: &Cx<'_, T>) -> CaseResult {
    let store = cx.checkpoints();
    let loaded = store.load(KEY).await.step("load of an unknown stream")?;
    ensure_eq!(loaded, None, "load of an unknown stream");
    store
        .save(&checkpoint("another-stream", 1, None))
        .await
        .step("save of another stream")?;
    let loaded = store
        .load(KEY)
        .await
        .step("load after another stream's save")?;
    ensure_eq!(
        loaded,
        None,
        "load of a stream after only another stream was saved"
    );
    Ok(())
}

/// An unfenced save then a load returns exactly what was saved (both positions, their times
/// and `startAfter` flags, owner, epoch, `updated_at`); a second save replaces the first.
pub(crate) async fn save_then_load_round_trips<T: ConformanceTarget>(cx: &Cx<'_, T>) -> CaseResult {
    let store = cx.checkpoints();
    let first = checkpoint(KEY, 10, None);
    store.save(&first).await.step("first save")?;
    let loaded = store.load(KEY).await.step("load after the first save")?;
    ensure_eq!(loaded, Some(first), "load after the first save");
    let mut second = checkpoint(KEY, 20, None);
    second.last_processed = None;
    store.save(&second).await.step("second save")?;
    let loaded = store.load(KEY).await.step("load after the second save")?;
    ensure_eq!(
        loaded,
        Some(second),
        "load after a second save (it replaces the first; an absent position stays absent)"
    );
    Ok(())
}

/// The current leader's claim then fenced save round-trips, owner and epoch included.
pub(crate) async fn fenced_save_by_current_leader_round_trips<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let leases = cx.leases()?;
    let store = cx.checkpoints();
    let a = acquire(&*leases, KEY, "instance-a", LONG_TTL).await?;
    store
        .claim(KEY, &fence(&a))
        .await
        .step("claim by the leader")?;
    let cp = checkpoint(KEY, 30, Some(&a));
    store.save(&cp).await.step("fenced save by the leader")?;
    let loaded = store.load(KEY).await.step("load after the fenced save")?;
    ensure_eq!(loaded, Some(cp), "load after the leader's fenced save");
    Ok(())
}

/// A save carrying epoch N after a claim with epoch N+1 is `Fenced`, and the stored checkpoint
/// keeps its positions.
pub(crate) async fn save_after_newer_claim_is_fenced<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let leases = cx.leases()?;
    let store = cx.checkpoints();
    let a = acquire(&*leases, KEY, "instance-a", SHORT_TTL).await?;
    store
        .claim(KEY, &fence(&a))
        .await
        .step("claim by the first leader")?;
    let kept = checkpoint(KEY, 40, Some(&a));
    store.save(&kept).await.step("save by the first leader")?;
    let b = take_over(&*leases, &a, "instance-b").await?;
    store
        .claim(KEY, &fence(&b))
        .await
        .step("claim by the new leader")?;
    fenced(
        store.save(&checkpoint(KEY, 41, Some(&a))).await,
        &format!(
            "save with epoch {} after a claim with epoch {}",
            a.epoch, b.epoch
        ),
    )?;
    let loaded = store
        .load(KEY)
        .await
        .step("load after the rejected save")?
        .ok_or_else(|| Failure::Failed("the checkpoint vanished after a rejected save".into()))?;
    ensure_eq!(
        positions(&loaded),
        positions(&kept),
        "positions after a rejected save (must be untouched)"
    );
    Ok(())
}

/// A claim with an older epoch than a previous claim is `Fenced`.
pub(crate) async fn claim_with_older_epoch_is_fenced<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let leases = cx.leases()?;
    let store = cx.checkpoints();
    let a = acquire(&*leases, KEY, "instance-a", SHORT_TTL).await?;
    let b = take_over(&*leases, &a, "instance-b").await?;
    store
        .claim(KEY, &fence(&b))
        .await
        .step("claim by the new leader")?;
    fenced(
        store.claim(KEY, &fence(&a)).await,
        &format!(
            "claim with epoch {} after a claim with epoch {}",
            a.epoch, b.epoch
        ),
    )
}

/// A claim alone is no checkpoint: `load` returns `None` after a claim of a fresh key, and
/// the stored positions after a claim of one that has a checkpoint.
pub(crate) async fn claim_alone_is_no_checkpoint<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let leases = cx.leases()?;
    let store = cx.checkpoints();
    let a = acquire(&*leases, KEY, "instance-a", SHORT_TTL).await?;
    store
        .claim(KEY, &fence(&a))
        .await
        .step("claim of a fresh key")?;
    let loaded = store.load(KEY).await.step("load after a claim only")?;
    ensure_eq!(loaded, None, "load after only a claim");
    let kept = checkpoint(KEY, 50, Some(&a));
    store.save(&kept).await.step("save by the leader")?;
    let b = take_over(&*leases, &a, "instance-b").await?;
    store
        .claim(KEY, &fence(&b))
        .await
        .step("claim by the new leader")?;
    let loaded = store
        .load(KEY)
        .await
        .step("load after the new leader's claim")?
        .ok_or_else(|| Failure::Failed("a claim made the stored checkpoint load as None".into()))?;
    ensure_eq!(
        positions(&loaded),
        positions(&kept),
        "positions after the new leader's claim (a claim must keep them)"
    );
    Ok(())
}

/// A fenced save is checked against the *current* lease of the key, even before the new
/// leader claimed: an older epoch, another owner with the current epoch, or an epoch on a key
/// that has no lease at all are `Fenced`, and nothing is written.
pub(crate) async fn save_fenced_by_current_lease<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let leases = cx.leases()?;
    let store = cx.checkpoints();
    let lone = "conformance-no-lease";
    let mut without = checkpoint(lone, 60, None);
    without.owner = Some("instance-a".into());
    without.epoch = Some(1);
    fenced(
        store.save(&without).await,
        "save carrying epoch 1 of a key that has no lease",
    )?;
    let loaded = store
        .load(lone)
        .await
        .step("load after the rejected save")?;
    ensure_eq!(
        loaded,
        None,
        "load after a rejected save of a key without lease"
    );

    let a = acquire(&*leases, KEY, "instance-a", SHORT_TTL).await?;
    store
        .claim(KEY, &fence(&a))
        .await
        .step("claim by the first leader")?;
    let kept = checkpoint(KEY, 61, Some(&a));
    store.save(&kept).await.step("save by the first leader")?;
    let b = take_over(&*leases, &a, "instance-b").await?;
    // No claim by `b` yet: only the lease says who leads.
    fenced(
        store.save(&checkpoint(KEY, 62, Some(&a))).await,
        &format!(
            "save with epoch {} while the lease is at epoch {} (not yet claimed)",
            a.epoch, b.epoch
        ),
    )?;
    let mut intruder = checkpoint(KEY, 63, Some(&b));
    intruder.owner = Some("instance-c".into());
    fenced(
        store.save(&intruder).await,
        &format!(
            "save with the current epoch {} by another owner than the lease's",
            b.epoch
        ),
    )?;
    let loaded = store
        .load(KEY)
        .await
        .step("load after the rejected saves")?
        .ok_or_else(|| Failure::Failed("the checkpoint vanished after rejected saves".into()))?;
    ensure_eq!(
        positions(&loaded),
        positions(&kept),
        "positions after rejected saves (must be untouched)"
    );
    Ok(())
}

/// A stored checkpoint document that does not parse loads as a `Corrupt` error naming the
/// stream (needs [`ConformanceTarget::plant_checkpoint`]).
pub(crate) async fn corrupt_document_is_corrupt<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let garbage = doc! {
        "_id": KEY,
        "v": 1,
        "lastSeenToken": "not a resume token",
        "updatedAt": DateTime::from_millis(1_700_000_000_000),
    };
    let planted = cx
        .target
        .plant_checkpoint(&cx.env, KEY, garbage)
        .await
        .step("target.plant_checkpoint")?;
    if !planted {
        return Err(Failure::NotApplicable(
            "the target cannot plant a raw checkpoint document".into(),
        ));
    }
    match cx.checkpoints().load(KEY).await {
        Err(e) if e.kind == StoreErrorKind::Corrupt => {
            ensure!(
                e.message.contains(KEY),
                "the Corrupt error does not name the stream '{KEY}': {e}"
            );
            Ok(())
        }
        Err(e) => Err(Failure::Failed(format!(
            "load of a corrupt document: expected Corrupt, got {e}"
        ))),
        Ok(cp) => Err(Failure::Failed(format!(
            "load of a corrupt document succeeded: {cp:?}"
        ))),
    }
}
