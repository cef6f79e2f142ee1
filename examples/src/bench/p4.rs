//! P4: how often the runtime writes its checkpoint. Writes are counted at the checkpoint store
//! ([`CountingCheckpoints`] around the in-memory one): per 10,000 settled events at a given
//! `save_every_n`, and per minute on an idle stream (tokio's virtual time: a minute passes in
//! milliseconds, and the heartbeat's ticks are exact).

use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use flowwarden::{
    change_stream, checkpoint, AnyStream, ChangeContext, MemoryBackend, StreamHandler,
};

use super::{
    memory_token, save_start_checkpoint, start_only, with_checkpoint, BenchError,
    CountingCheckpoints,
};

/// The no-op stream of P4.
#[derive(Default)]
pub struct Counted;

#[change_stream(name = "p4", collection = "p4")]
#[checkpoint(save_every_n = 1, save_interval_secs = 5)]
impl Counted {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

/// Checkpoint writes while a stream settles a backlog.
#[derive(Debug, Clone)]
pub struct Busy {
    /// Events settled.
    pub events: u64,
    /// `save_every_n`.
    pub save_every: u32,
    /// Writes from the start until every event was settled (and 300 ms more).
    pub writes: u64,
    /// Writes added by the graceful stop after that (the flush of the settled position).
    pub stop_writes: u64,
}

/// Runs `events` inserts through the no-op stream at `save_every_n = save_every` (heartbeat
/// every 5 s, which a run this short does not reach) and counts the checkpoint writes.
pub async fn busy(events: u64, save_every: u32) -> Result<Busy, BenchError> {
    let backend = MemoryBackend::with_retention(events as usize + 10);
    let coll = backend.collection("p4");
    for i in 0..events as i64 {
        coll.insert_one(doc! {"_id": i})
            .map_err(|e| format!("prefill failed: {e}"))?;
    }
    let mut stores: flowwarden::Backend = backend.into();
    save_start_checkpoint(&stores, "p4", memory_token(0)).await?;
    let counting = CountingCheckpoints::new(stores.checkpoints.clone());
    stores.checkpoints = Arc::new(counting.clone());
    let def = with_checkpoint(<Counted as StreamHandler>::definition(), |c| {
        c.save_every_n = save_every;
        c.save_interval_secs = 5;
    });
    let rt = start_only(AnyStream::with_definition(Counted, def), stores).await?;
    let done = rt
        .handle()
        .wait_for("p4", |s| s.counters.handled >= events)
        .await;
    // Let the write of the last settled batch land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writes = counting.writes();
    rt.shutdown().await;
    done.map_err(|e| format!("stream vanished: {e}"))?;
    Ok(Busy {
        events,
        save_every,
        writes,
        stop_writes: counting.writes() - writes,
    })
}

/// Checkpoint writes of a stream that receives no event for `minutes` virtual minutes, with
/// the heartbeat every `heartbeat_secs`. With `oplog_moves`, another collection is written
/// once a second meanwhile, so the stream's post-batch position keeps moving (as MongoDB's
/// periodic no-op writes and other collections' writes move it on a real replica set); without,
/// nothing at all happens on the backend. Runs on its own single-threaded runtime with paused
/// time: call it outside any tokio runtime (or from a plain thread).
pub fn idle(minutes: u64, heartbeat_secs: u64, oplog_moves: bool) -> Result<u64, BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let backend = MemoryBackend::new();
        let mut stores: flowwarden::Backend = backend.clone().into();
        save_start_checkpoint(&stores, "p4", memory_token(0)).await?;
        let counting = CountingCheckpoints::new(stores.checkpoints.clone());
        stores.checkpoints = Arc::new(counting.clone());
        let def = with_checkpoint(<Counted as StreamHandler>::definition(), |c| {
            c.save_interval_secs = heartbeat_secs;
        });
        let writer = oplog_moves.then(|| {
            let other = backend.collection("elsewhere");
            tokio::spawn(async move {
                for i in 0i64.. {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if other.insert_one(doc! {"_id": i}).is_err() {
                        return;
                    }
                }
            })
        });
        let rt = start_only(AnyStream::with_definition(Counted, def), stores).await?;
        // Count over a window that starts after the start-up and holds exactly
        // minutes * 60 / heartbeat_secs heartbeat ticks.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = counting.writes();
        tokio::time::sleep(Duration::from_secs(minutes * 60)).await;
        let writes = counting.writes() - before;
        rt.shutdown().await;
        if let Some(w) = writer {
            w.abort();
        }
        Ok(writes)
    })
}
