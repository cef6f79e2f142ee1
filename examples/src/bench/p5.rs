//! P5: a restart after a filter-heavy period. A backlog where `#[filter]` rejects 999 events
//! out of 1,000 is settled; the process then "crashes" (the checkpoint store stops storing,
//! then the runtime stops) once the heartbeat has written the settled position; a new runtime
//! resumes with `resume_strategy = ProcessedFirst` and, from the same stored checkpoint, with
//! `SeenFirst`. The figure is the number of events each restart reads again before the first
//! new one.

use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use flowwarden::port::Checkpoint;
use flowwarden::{
    change_stream, checkpoint, AnyStream, ChangeContext, MemoryBackend, ResumeStrategy,
    StreamHandler,
};

use super::{
    memory_seq, memory_token, save_start_checkpoint, start_only, with_checkpoint, BenchError,
    CountingCheckpoints,
};

/// Keeps one event in 1,000 (`n % 1000 == 0`).
#[derive(Default)]
pub struct Picky;

#[change_stream(name = "p5", collection = "p5")]
#[checkpoint(save_every_n = 1, save_interval_secs = 1)]
impl Picky {
    #[filter]
    fn one_in_a_thousand(&self, ctx: &ChangeContext<bson::Document>) -> bool {
        ctx.document()
            .and_then(|d| d.get_i64("n").ok())
            .is_some_and(|n| n % 1000 == 0)
    }

    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

/// The figures of P5.
#[derive(Debug, Clone)]
pub struct P5 {
    /// Events in the filter-heavy period.
    pub events: u64,
    /// Of which the filter passed.
    pub handled: u64,
    /// The stored checkpoint at the crash: the oplog position of `lastProcessed`.
    pub last_processed: Option<u64>,
    /// ... and of `lastSeen`.
    pub last_seen: Option<u64>,
    /// Events read again on the restart with `ProcessedFirst`.
    pub rescanned_processed_first: u64,
    /// Events read again on the restart with `SeenFirst`.
    pub rescanned_seen_first: u64,
}

fn seq_of(p: &Option<flowwarden::port::StoredPosition>) -> Option<u64> {
    p.as_ref().and_then(|p| memory_seq(&p.token))
}

/// Runs P5 over a period of `events` inserts (a multiple of 1,000 keeps the period's end
/// 999 filtered events after the last handled one).
pub async fn run(events: u64) -> Result<P5, BenchError> {
    let backend = MemoryBackend::with_retention(events as usize + 10);
    let coll = backend.collection("p5");
    for i in 0..events as i64 {
        coll.insert_one(doc! {"_id": i, "n": i})
            .map_err(|e| format!("prefill failed: {e}"))?;
    }
    let plain: flowwarden::Backend = backend.clone().into();
    save_start_checkpoint(&plain, "p5", memory_token(0)).await?;

    // The filter-heavy period, up to the crash.
    let counting = CountingCheckpoints::new(plain.checkpoints.clone());
    let mut stores = plain.clone();
    stores.checkpoints = Arc::new(counting.clone());
    let def = <Picky as StreamHandler>::definition();
    let rt = start_only(AnyStream::with_definition(Picky, def), stores).await?;
    let status = rt
        .handle()
        .wait_for("p5", |s| s.counters.handled + s.counters.filtered >= events)
        .await
        .map_err(|e| e.to_string())?;
    // The heartbeat (every second) writes the settled position; crash once it has.
    let mut stored = None;
    for _ in 0..500 {
        let cp = plain
            .checkpoints
            .load("p5")
            .await
            .map_err(|e| e.to_string())?;
        if cp.as_ref().and_then(|c| seq_of(&c.last_seen)) == Some(events) {
            stored = cp;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    counting.freeze();
    rt.shutdown().await;
    let stored: Checkpoint =
        stored.ok_or("the heartbeat did not write the settled position within 10 s")?;

    // New events arrive after the restart: the first is a marker the filter passes.
    coll.insert_one(doc! {"_id": events as i64, "n": 1_000_000_000i64})
        .map_err(|e| format!("write failed: {e}"))?;
    let mut rescanned = Vec::new();
    for strategy in [ResumeStrategy::ProcessedFirst, ResumeStrategy::SeenFirst] {
        plain
            .checkpoints
            .save(&stored)
            .await
            .map_err(|e| e.to_string())?;
        let def = with_checkpoint(def, |c| c.resume_strategy = strategy);
        let rt = start_only(AnyStream::with_definition(Picky, def), plain.clone()).await?;
        let after = rt
            .handle()
            .wait_for("p5", |s| s.counters.handled >= 1)
            .await
            .map_err(|e| e.to_string())?;
        rt.shutdown().await;
        rescanned.push(after.counters.received.saturating_sub(1));
    }
    Ok(P5 {
        events,
        handled: status.counters.handled,
        last_processed: seq_of(&stored.last_processed),
        last_seen: seq_of(&stored.last_seen),
        rescanned_processed_first: rescanned[0],
        rescanned_seen_first: rescanned[1],
    })
}
