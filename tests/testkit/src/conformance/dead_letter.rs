//! Cases of the dead-letter store: round trips, listing, status changes, idempotent puts,
//! the size limit, and fencing by epoch.

use bson::doc;
use flowwarden::port::codec::{encode_dead_letter, encoded_len};
use flowwarden::port::{
    DeadLetterQuery, DeadLetterRecord, DeadLetterStatus, PutOutcome, StoreErrorKind,
};

use super::support::{
    acquire, dead_letter, ensure, ensure_eq, take_over, CaseResult, Cx, Failure, Step, SHORT_TTL,
};
use super::target::ConformanceTarget;

const STREAM: &str = "conformance-dlq";

fn ids(records: &[DeadLetterRecord]) -> Vec<String> {
    records.iter().map(|r| r.id.clone()).collect()
}

/// A `put` of a new record is `Inserted`, and `get` returns it exactly; `get` of an unknown
/// id is `None`.
pub(crate) async fn put_then_get_round_trips<T: ConformanceTarget>(cx: &Cx<'_, T>) -> CaseResult {
    let store = cx.dead_letters()?;
    let r = dead_letter(STREAM, 1, 1_700_000_000_000);
    let outcome = store.put(&r).await.step("put")?;
    ensure_eq!(outcome, PutOutcome::Inserted, "outcome of the first put");
    let got = store.get(&r.id).await.step("get")?;
    ensure_eq!(got, Some(r), "get after put");
    let missing = store
        .get("no-such-record")
        .await
        .step("get of an unknown id")?;
    ensure_eq!(missing, None, "get of an unknown id");
    Ok(())
}

/// `list` filters by stream and status, returns oldest first (by first failure), and keeps
/// at most `limit`.
pub(crate) async fn list_filters_by_stream_status_and_limit<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let store = cx.dead_letters()?;
    let other = "conformance-dlq-other";
    let r1 = dead_letter(STREAM, 1, 1_700_000_001_000);
    let r2 = dead_letter(STREAM, 2, 1_700_000_003_000);
    let r3 = dead_letter(other, 3, 1_700_000_002_000);
    let r4 = dead_letter(STREAM, 4, 1_700_000_004_000);
    // Put out of order: the listing must sort.
    for r in [&r4, &r2, &r3, &r1] {
        store.put(r).await.step(&format!("put {}", r.id))?;
    }
    let changed = store
        .set_status(&r2.id, DeadLetterStatus::Discarded)
        .await
        .step("set_status")?;
    ensure!(changed, "set_status of a stored record returned false");
    let list = |stream: Option<&str>, status: Option<DeadLetterStatus>, limit: Option<usize>| {
        let store = store.clone();
        let query = DeadLetterQuery {
            stream: stream.map(str::to_owned),
            status,
            limit,
        };
        async move {
            store
                .list(&query)
                .await
                .map(|rs| ids(&rs))
                .step(&format!("list {query:?}"))
        }
    };
    let all = list(None, None, None).await?;
    ensure_eq!(
        all,
        ids(&[r1.clone(), r3.clone(), r2.clone(), r4.clone()]),
        "list of everything, oldest first"
    );
    let one_stream = list(Some(STREAM), None, None).await?;
    ensure_eq!(
        one_stream,
        ids(&[r1.clone(), r2.clone(), r4.clone()]),
        "list of one stream"
    );
    let pending = list(None, Some(DeadLetterStatus::Pending), None).await?;
    ensure_eq!(
        pending,
        ids(&[r1.clone(), r3.clone(), r4.clone()]),
        "list of pending records"
    );
    let both = list(Some(STREAM), Some(DeadLetterStatus::Pending), None).await?;
    ensure_eq!(
        both,
        ids(&[r1.clone(), r4.clone()]),
        "list of one stream's pending records"
    );
    let discarded = list(Some(STREAM), Some(DeadLetterStatus::Discarded), None).await?;
    ensure_eq!(discarded, vec![r2.id.clone()], "list of discarded records");
    let limited = list(None, None, Some(2)).await?;
    ensure_eq!(limited, ids(&[r1.clone(), r3.clone()]), "list with limit 2");
    let limited = list(Some(STREAM), None, Some(1)).await?;
    ensure_eq!(limited, ids(&[r1]), "list of one stream with limit 1");
    let none = list(Some("conformance-dlq-none"), None, None).await?;
    ensure_eq!(
        none,
        Vec::<String>::new(),
        "list of a stream without records"
    );
    Ok(())
}

/// `set_status` replays and discards a record (seen by `get` and `list`), and is `false` for
/// an unknown id.
pub(crate) async fn set_status_replays_and_discards<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let store = cx.dead_letters()?;
    let r = dead_letter(STREAM, 1, 1_700_000_000_000);
    store.put(&r).await.step("put")?;
    for status in [DeadLetterStatus::Replayed, DeadLetterStatus::Discarded] {
        let changed = store.set_status(&r.id, status).await.step("set_status")?;
        ensure!(
            changed,
            "set_status({status:?}) of a stored record returned false"
        );
        let got = store
            .get(&r.id)
            .await
            .step("get")?
            .ok_or_else(|| Failure::Failed(format!("the record vanished after {status:?}")))?;
        ensure_eq!(got.status, status, "status after set_status");
        let mut expected = r.clone();
        expected.status = status;
        ensure_eq!(
            got,
            expected,
            "the record after set_status (only the status changes)"
        );
        let listed = store
            .list(&DeadLetterQuery {
                status: Some(status),
                ..DeadLetterQuery::default()
            })
            .await
            .step("list by status")?;
        ensure_eq!(ids(&listed), vec![r.id.clone()], "list by the new status");
    }
    let pending = store
        .list(&DeadLetterQuery {
            status: Some(DeadLetterStatus::Pending),
            ..DeadLetterQuery::default()
        })
        .await
        .step("list of pending")?;
    ensure_eq!(
        ids(&pending),
        Vec::<String>::new(),
        "list of pending after discard"
    );
    let unknown = store
        .set_status("no-such-record", DeadLetterStatus::Replayed)
        .await
        .step("set_status of an unknown id")?;
    ensure_eq!(unknown, false, "set_status of an unknown id");
    Ok(())
}

/// A second `put` of the same id is `AlreadyPresent` and keeps one record: attempts add up,
/// the last failure and error chain are the new ones, the first failure and the event stay,
/// and the record is pending again (a redelivered event failed again).
pub(crate) async fn put_twice_is_idempotent<T: ConformanceTarget>(cx: &Cx<'_, T>) -> CaseResult {
    let store = cx.dead_letters()?;
    let first = dead_letter(STREAM, 1, 1_700_000_000_000);
    let outcome = store.put(&first).await.step("first put")?;
    ensure_eq!(outcome, PutOutcome::Inserted, "outcome of the first put");
    store
        .set_status(&first.id, DeadLetterStatus::Replayed)
        .await
        .step("set_status")?;
    let mut again = first.clone();
    again.attempts = 2;
    again.last_failed_at = bson::DateTime::from_millis(1_700_000_500_000);
    again.error_chain = vec!["failed again".into()];
    again.error_kind = "Panicked".into();
    let outcome = store.put(&again).await.step("second put")?;
    ensure_eq!(
        outcome,
        PutOutcome::AlreadyPresent,
        "outcome of a second put of one id"
    );
    let all = store.list(&DeadLetterQuery::default()).await.step("list")?;
    ensure_eq!(
        ids(&all),
        vec![first.id.clone()],
        "records after two puts of one id"
    );
    let got = store
        .get(&first.id)
        .await
        .step("get")?
        .ok_or_else(|| Failure::Failed("the record vanished after a second put".into()))?;
    ensure_eq!(got.attempts, 5, "attempts after a second put (3 + 2)");
    ensure_eq!(
        got.first_failed_at,
        first.first_failed_at,
        "first failure after a second put"
    );
    ensure_eq!(
        got.last_failed_at,
        again.last_failed_at,
        "last failure after a second put"
    );
    ensure_eq!(
        got.error_chain,
        again.error_chain,
        "error chain after a second put"
    );
    ensure_eq!(
        got.error_kind,
        again.error_kind,
        "error kind after a second put (the new failure's, like its chain)"
    );
    ensure_eq!(
        got.status,
        DeadLetterStatus::Pending,
        "status after a second put"
    );
    ensure_eq!(got.event, first.event, "event after a second put");
    Ok(())
}

/// A record over `max_record_bytes` is refused `TooLarge` and nothing is stored; the same
/// record after `truncate_to(max_record_bytes)` (what the engine does) is stored, marked
/// truncated.
pub(crate) async fn oversized_record_is_too_large_until_truncated<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let store = cx.dead_letters()?;
    let max = store.max_record_bytes();
    let mut r = dead_letter(STREAM, 1, 1_700_000_000_000);
    r.event
        .insert("fullDocument", doc! { "blob": "x".repeat(max) });
    let size = encoded_len(&encode_dead_letter(&r));
    ensure!(
        size > max,
        "the test record is not over the limit ({size} <= {max})"
    );
    match store.put(&r).await {
        Err(e) if e.kind == StoreErrorKind::TooLarge => {}
        Err(e) => {
            return Err(Failure::Failed(format!(
                "put of a {size}-byte record (limit {max}): expected TooLarge, got {e}"
            )))
        }
        Ok(o) => {
            return Err(Failure::Failed(format!(
                "put of a {size}-byte record (limit {max}) was accepted ({o:?})"
            )))
        }
    }
    let stored = store.get(&r.id).await.step("get after a refused put")?;
    ensure!(stored.is_none(), "a record refused as too large was stored");
    r.truncate_to(max);
    ensure!(r.truncated, "truncate_to did not truncate");
    let outcome = store.put(&r).await.step("put of the truncated record")?;
    ensure_eq!(
        outcome,
        PutOutcome::Inserted,
        "outcome of the truncated record's put"
    );
    let got = store
        .get(&r.id)
        .await
        .step("get of the truncated record")?
        .ok_or_else(|| Failure::Failed("the truncated record was not stored".into()))?;
    ensure!(got.truncated, "the stored record is not marked truncated");
    ensure!(
        got.event.get_document("_fw_truncated").is_ok(),
        "the stored event has no `_fw_truncated` marker: {}",
        got.event
    );
    ensure_eq!(got, r, "the truncated record after get");
    Ok(())
}

/// A `put` carrying an epoch older than the stream's current lease is `Fenced` and stores
/// nothing; the current leader's put is stored.
pub(crate) async fn put_with_stale_epoch_is_fenced<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    let store = cx.dead_letters()?;
    let leases = cx.leases()?;
    let a = acquire(&*leases, STREAM, "instance-a", SHORT_TTL).await?;
    let b = take_over(&*leases, &a, "instance-b").await?;
    let mut stale = dead_letter(STREAM, 1, 1_700_000_000_000);
    stale.owner = Some(a.owner.clone());
    stale.epoch = Some(a.epoch);
    match store.put(&stale).await {
        Err(e) if e.kind == StoreErrorKind::Fenced => {}
        Err(e) => {
            return Err(Failure::Failed(format!(
                "put with epoch {} after epoch {}: expected Fenced, got {e}",
                a.epoch, b.epoch
            )))
        }
        Ok(o) => {
            return Err(Failure::Failed(format!(
                "put with epoch {} after epoch {} was accepted ({o:?})",
                a.epoch, b.epoch
            )))
        }
    }
    let got = store.get(&stale.id).await.step("get after a fenced put")?;
    ensure_eq!(got, None, "the record after a fenced put");
    let mut current = stale.clone();
    current.owner = Some(b.owner.clone());
    current.epoch = Some(b.epoch);
    let outcome = store
        .put(&current)
        .await
        .step("put by the current leader")?;
    ensure_eq!(
        outcome,
        PutOutcome::Inserted,
        "outcome of the current leader's put"
    );
    let got = store.get(&current.id).await.step("get")?;
    ensure_eq!(got, Some(current), "the current leader's record");
    Ok(())
}
