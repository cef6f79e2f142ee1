//! P3: keyed concurrency against one event at a time, on the in-memory backend, with an async
//! handler that waits 5 ms (an I/O-bound handler). Per-key order is checked after each run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::doc;
use flowwarden::{
    change_stream, AnyStream, ChangeContext, ConcurrencyConfig, MemoryBackend, StreamHandler,
};

use super::{memory_token, save_start_checkpoint, start_only, BenchError};

/// Records, per key, the order its changes were handled in.
#[derive(Default, Clone)]
pub struct Slow {
    seen: Arc<Mutex<HashMap<i64, Vec<i64>>>>,
}

#[change_stream(name = "p3", collection = "p3", concurrency = 64)]
impl Slow {
    #[on_change]
    async fn changed(&self, ctx: &ChangeContext<bson::Document>) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let key = ctx
            .document_key()
            .and_then(|k| k.get_i64("_id").ok())
            .unwrap_or(-1);
        let n = ctx
            .document()
            .and_then(|d| d.get_i64("n").ok())
            .unwrap_or(-1);
        if let Ok(mut seen) = self.seen.lock() {
            seen.entry(key).or_default().push(n);
        }
    }
}

/// Runs `events` writes over `keys` keys through a stream with `concurrency`; returns events/s
/// after checking that every key's changes were handled once each, in stream order.
pub async fn run(events: u64, keys: u64, concurrency: u32) -> Result<f64, BenchError> {
    let keys = keys.max(1);
    let backend = MemoryBackend::with_retention(events as usize + 10);
    let handler = Slow::default();
    let mut def = <Slow as StreamHandler>::definition().clone();
    def.concurrency = ConcurrencyConfig {
        concurrency,
        max_in_flight: 0,
    };
    def.checkpoint.save_every_n = 100;
    let def: &'static _ = Box::leak(Box::new(def));
    // The writes first (the in-memory backend finds a replaced document by scanning, which
    // would make the source the bottleneck), then the stream reads them from the start.
    let coll = backend.collection("p3");
    for i in 0..events as i64 {
        let key = i % keys as i64;
        let result = if i < keys as i64 {
            coll.insert_one(doc! {"_id": key, "n": i}).map(|_| ())
        } else {
            coll.replace_one(doc! {"_id": key}, doc! {"n": i})
                .map(|_| ())
        };
        result.map_err(|e| format!("write failed: {e}"))?;
    }
    let stores: flowwarden::Backend = backend.clone().into();
    save_start_checkpoint(&stores, "p3", memory_token(0)).await?;
    let t = Instant::now();
    let rt = start_only(AnyStream::with_definition(handler.clone(), def), stores).await?;
    rt.handle()
        .wait_for("p3", |s| s.counters.handled >= events)
        .await
        .map_err(|e| e.to_string())?;
    let elapsed = t.elapsed();
    rt.shutdown().await;
    let seen = handler.seen.lock().map_err(|e| e.to_string())?;
    let mut handled = 0;
    for (key, ns) in seen.iter() {
        handled += ns.len();
        if ns.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("key {key} handled out of order: {ns:?}"));
        }
    }
    if handled as u64 != events {
        return Err(format!("{handled} handled, {events} written"));
    }
    Ok(events as f64 / elapsed.as_secs_f64())
}

/// The figures of one P3 measurement.
#[derive(Debug, Clone)]
pub struct P3 {
    /// Events written.
    pub events: u64,
    /// Keys they are spread over.
    pub keys: u64,
    /// The baseline's concurrency (1).
    pub baseline: u32,
    /// The measured concurrency (64).
    pub concurrency: u32,
    /// Events per second at `baseline`.
    pub baseline_rate: f64,
    /// Events per second at `concurrency`.
    pub rate: f64,
}

impl P3 {
    /// rate / baseline_rate.
    pub fn ratio(&self) -> f64 {
        self.rate / self.baseline_rate
    }
}

/// The same events through `concurrency = baseline`, then `concurrency = concurrency`.
pub async fn compare(
    events: u64,
    keys: u64,
    baseline: u32,
    concurrency: u32,
) -> Result<P3, BenchError> {
    let baseline_rate = run(events, keys, baseline)
        .await
        .map_err(|e| format!("concurrency = {baseline}: {e}"))?;
    let rate = run(events, keys, concurrency)
        .await
        .map_err(|e| format!("concurrency = {concurrency}: {e}"))?;
    Ok(P3 {
        events,
        keys,
        baseline,
        concurrency,
        baseline_rate,
        rate,
    })
}
