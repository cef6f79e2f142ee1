//! P3 of the benchmark suite: keyed concurrency against one event at a time, on the in-memory
//! backend, with an async handler that waits 5 ms (an I/O-bound handler). Run in release mode:
//!
//! ```text
//! cargo run --release -p flowwarden-examples --bin bench_concurrency [-- --events N --keys K --concurrency C --baseline B]
//! ```
//!
//! Pushes the same events (N writes over K keys, default 20,000 over 10,000) through a stream
//! with `concurrency = 1` and one with `concurrency = C` (default 64), prints both rates and their
//! ratio, and checks after each run that every key's changes were handled in stream order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::doc;
use flowwarden::{
    change_stream, AnyStream, ChangeContext, ConcurrencyConfig, MemoryBackend, StreamHandler,
};

/// Records, per key, the order its changes were handled in.
#[derive(Default, Clone)]
struct Slow {
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

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs the events through a stream with `concurrency`; returns events/s, or why it failed.
async fn run(events: u64, keys: u64, concurrency: u32) -> Result<f64, String> {
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
    let start = flowwarden::port::Checkpoint {
        stream: "p3".into(),
        last_processed: None,
        last_seen: Some(flowwarden::port::StoredPosition {
            token: flowwarden::ResumeToken::from_document(doc! {"_data": format!("{:016X}", 0)}),
            cluster_time: None,
            wall_time: None,
            start_after: false,
        }),
        owner: None,
        epoch: None,
        updated_at: bson::DateTime::now(),
    };
    let stores: flowwarden::Backend = backend.clone().into();
    stores
        .checkpoints
        .save(&start)
        .await
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let rt = flowwarden::builder()
        .discover(false)
        .any_stream(AnyStream::with_definition(handler.clone(), def))
        .backend(backend.clone())
        .start()
        .await
        .map_err(|e| e.to_string())?;
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

#[tokio::main]
async fn main() {
    let events = arg("--events", 20_000);
    let keys = arg("--keys", 10_000).max(1);
    let concurrency = arg("--concurrency", 64) as u32;
    let baseline = arg("--baseline", 1) as u32;
    let mut rates = Vec::new();
    for c in [baseline, concurrency] {
        match run(events, keys, c).await {
            Ok(rate) => {
                println!(
                    "concurrency = {c:>3}: {events} events over {keys} keys = {rate:>9.0} events/s (per-key order checked)"
                );
                rates.push(rate);
            }
            Err(e) => {
                eprintln!("concurrency = {c}: {e}");
                std::process::exit(1);
            }
        }
    }
    println!(
        "ratio concurrency {concurrency} / concurrency {baseline} = {:.1}",
        rates[1] / rates[0]
    );
}
