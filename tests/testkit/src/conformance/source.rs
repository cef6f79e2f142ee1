//! Cases of the change source: reading in order, resuming exactly after a token, lost
//! history, opening at "now", and the positions of a cursor that has read nothing.

use std::time::Duration;

use flowwarden::port::{SourceErrorKind, SourceItem, StartAt};

use super::support::{
    ensure_eq, event_of, expected, next_event, ops, read_n, seen, CaseResult, Cx, Failure,
};
use super::target::ConformanceTarget;

/// How long a case waits for a cursor to report lost history or an idle tick.
const WAIT: Duration = Duration::from_secs(5);

/// A cursor opened at the oldest retained entry reads the collection's inserts, update and
/// delete in the order they were written, each with its operation type and document key.
pub(crate) async fn reads_events_in_order<T: ConformanceTarget>(cx: &Cx<'_, T>) -> CaseResult {
    cx.insert_all([1, 2, 3]).await?;
    let mut cursor = cx.open(StartAt::OldestAvailable).await?;
    let read = read_n(&mut cursor, 3, "reading the inserts").await?;
    ensure_eq!(
        ops(&read),
        expected("insert", &[1, 2, 3]),
        "the inserts, in order"
    );
    cx.update(2, 20).await?;
    cx.delete(3).await?;
    let read = read_n(&mut cursor, 2, "reading the update and the delete").await?;
    let mut want = expected("update", &[2]);
    want.extend(expected("delete", &[3]));
    ensure_eq!(ops(&read), want, "the update then the delete");
    Ok(())
}

/// A cursor opened `ResumeAfter` an event's token continues exactly after it: the next
/// events are the later ones, in order, with the same tokens as on first read.
pub(crate) async fn resume_after_token_continues_exactly_after<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    cx.insert_all([1, 2, 3, 4, 5]).await?;
    let mut cursor = cx.open(StartAt::OldestAvailable).await?;
    let first = read_n(&mut cursor, 5, "first read").await?;
    ensure_eq!(
        ops(&first),
        expected("insert", &[1, 2, 3, 4, 5]),
        "first read"
    );
    drop(cursor);
    let mut resumed = cx
        .open(StartAt::ResumeAfter(first[1].token.clone()))
        .await?;
    let again = read_n(&mut resumed, 3, "after resuming after the 2nd event").await?;
    ensure_eq!(
        again,
        first[2..].to_vec(),
        "events after resuming after the 2nd event (same events, same tokens)"
    );
    cx.insert(6).await?;
    let later = read_n(&mut resumed, 1, "a later insert on the resumed cursor").await?;
    ensure_eq!(
        ops(&later),
        expected("insert", &[6]),
        "a later insert on the resumed cursor"
    );
    drop(resumed);
    let mut last = cx
        .open(StartAt::ResumeAfter(first[4].token.clone()))
        .await?;
    let next = read_n(&mut last, 1, "after resuming after the 5th event").await?;
    ensure_eq!(next, later, "the event after the 5th, resumed");
    Ok(())
}

/// Once the history through an event is gone, resuming after an event before it is
/// `HistoryLost` (at the open or at the first read), never a silent jump.
pub(crate) async fn lost_history_is_history_lost<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    cx.insert_all([1, 2, 3]).await?;
    let mut cursor = cx.open(StartAt::OldestAvailable).await?;
    let read = read_n(&mut cursor, 3, "first read").await?;
    drop(cursor);
    let lost = cx
        .target
        .lose_history(&cx.env, &read[1].token)
        .await
        .map_err(|e| Failure::Failed(format!("target.lose_history: {e}")))?;
    if !lost {
        return Err(Failure::NotApplicable(
            "the target cannot discard change history".into(),
        ));
    }
    let at = StartAt::ResumeAfter(read[0].token.clone());
    let mut cursor = match cx.backend.source.open(&cx.spec(), at).await {
        Err(e) if e.kind == SourceErrorKind::HistoryLost => return Ok(()),
        Err(e) => {
            return Err(Failure::Failed(format!(
                "resume after lost history: expected HistoryLost, the open failed with {e}"
            )))
        }
        Ok(c) => c,
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, cursor.next()).await {
            Err(_) => {
                return Err(Failure::Failed(format!(
                    "resume after lost history: no HistoryLost error within {WAIT:?}"
                )))
            }
            Ok(Err(e)) if e.kind == SourceErrorKind::HistoryLost => return Ok(()),
            Ok(Err(e)) => {
                return Err(Failure::Failed(format!(
                    "resume after lost history: expected HistoryLost, the read failed with {e}"
                )))
            }
            Ok(Ok(Some(SourceItem::Idle(_)))) => continue,
            Ok(Ok(Some(item))) => {
                let e = event_of(item, "resume after lost history")?;
                return Err(Failure::Failed(format!(
                    "resume after lost history delivered an event instead of HistoryLost: {:?}",
                    seen(&e)?
                )));
            }
            Ok(Ok(None)) => {
                return Err(Failure::Failed(
                    "resume after lost history: the cursor closed without HistoryLost".into(),
                ))
            }
        }
    }
}

/// A cursor opened at "now" sees only the changes written after the open.
pub(crate) async fn open_at_now_sees_only_later_events<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    cx.insert_all([1, 2]).await?;
    let mut cursor = cx.open(StartAt::Now).await?;
    cx.insert_all([3, 4]).await?;
    let read = read_n(&mut cursor, 2, "reading after an open at now").await?;
    ensure_eq!(
        ops(&read),
        expected("insert", &[3, 4]),
        "events after an open at now"
    );
    Ok(())
}

/// A cursor opened at "now" has an initial position, and resuming after it later sees every
/// change written since, even though the cursor read nothing.
pub(crate) async fn now_initial_position_resumes_without_gap<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    cx.insert(1).await?;
    let cursor = cx.open(StartAt::Now).await?;
    let Some(initial) = cursor.initial_position() else {
        return Err(Failure::Failed(
            "a cursor opened at now has no initial position: the engine cannot persist where it started".into(),
        ));
    };
    drop(cursor);
    cx.insert_all([2, 3]).await?;
    let mut resumed = cx.open(StartAt::ResumeAfter(initial)).await?;
    let read = read_n(&mut resumed, 2, "after resuming after the initial position").await?;
    ensure_eq!(
        ops(&read),
        expected("insert", &[2, 3]),
        "events after resuming after the initial position of an open at now"
    );
    Ok(())
}

/// An idle cursor yields an idle tick carrying a token, and resuming after that token sees
/// every change written since.
pub(crate) async fn idle_tick_token_resumes_without_gap<T: ConformanceTarget>(
    cx: &Cx<'_, T>,
) -> CaseResult {
    cx.insert(1).await?;
    let mut cursor = cx.open(StartAt::Now).await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    let token = loop {
        match tokio::time::timeout_at(deadline, cursor.next()).await {
            Err(_) => {
                return Err(Failure::Failed(format!(
                    "an idle cursor gave no idle tick with a token within {WAIT:?}"
                )))
            }
            Ok(Err(e)) => return Err(Failure::Failed(format!("idle read failed: {e}"))),
            Ok(Ok(Some(SourceItem::Idle(Some(t))))) => break t,
            Ok(Ok(Some(SourceItem::Idle(None)))) => continue,
            Ok(Ok(Some(item))) => {
                let e = event_of(item, "idle read")?;
                return Err(Failure::Failed(format!(
                    "a cursor opened at now on an idle collection delivered {:?}",
                    seen(&e)?
                )));
            }
            Ok(Ok(None)) => {
                return Err(Failure::Failed("an idle cursor closed".into()));
            }
        }
    };
    drop(cursor);
    cx.insert(2).await?;
    let mut resumed = cx.open(StartAt::ResumeAfter(token)).await?;
    let e = next_event(&mut resumed, "after resuming after an idle token").await?;
    let read = vec![seen(&e)?];
    ensure_eq!(
        ops(&read),
        expected("insert", &[2]),
        "the first event after resuming after an idle tick's token"
    );
    Ok(())
}
