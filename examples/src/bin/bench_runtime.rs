//! Throughput of the runtime on the in-memory backend, against a bare loop over the same
//! source. Run in release mode:
//!
//! ```text
//! cargo run --release -p flowwarden-examples --bin bench_runtime [-- --changes N] [-- --save-every N]
//! ```
//!
//! Prints events per second of both, their ratio, and the process's peak resident memory.

use std::time::{Duration, Instant};

use bson::doc;
use flowwarden::port::{ChangeSource, SourceItem, StartAt, WatchSpec};
use flowwarden::{
    change_stream, checkpoint, AnyStream, ChangeContext, CheckpointConfig, MemoryBackend,
    StreamHandler,
};

#[derive(Default)]
struct Noop;

#[change_stream(name = "bench", collection = "bench")]
#[checkpoint(save_every_n = 1, save_interval_secs = 5)]
impl Noop {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let changes = arg("--changes", 1_000_000);
    let save_every = arg("--save-every", 1) as u32;
    let backend = MemoryBackend::with_retention(changes as usize + 10);
    let coll = backend.collection("bench");
    let t = Instant::now();
    for i in 0..changes as i64 {
        if let Err(e) = coll.insert_one(doc! {"_id": i, "sku": "A-1", "qty": 1}) {
            eprintln!("prefill failed: {e}");
            std::process::exit(1);
        }
    }
    println!(
        "prefilled {changes} inserts in {:.2?}; peak RSS so far {:.0} MiB",
        t.elapsed(),
        peak_rss_mib()
    );

    // Bare loop: the same cursor the runtime reads, no runtime.
    let spec = WatchSpec {
        stream: "bare",
        database: None,
        collection: "bench".into(),
        pipeline: vec![],
        full_document: Default::default(),
        full_document_before_change: Default::default(),
        batch_size: 256,
        max_await: Duration::from_millis(10),
    };
    let t = Instant::now();
    let mut cursor = match backend.open(&spec, StartAt::OldestAvailable).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("open failed: {e}");
            std::process::exit(1);
        }
    };
    let mut seen = 0u64;
    while seen < changes {
        match cursor.next().await {
            Ok(Some(SourceItem::Event(ev))) => {
                std::hint::black_box(&ev);
                seen += 1;
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("read failed: {e}");
                std::process::exit(1);
            }
        }
    }
    let bare = t.elapsed();
    let bare_rate = changes as f64 / bare.as_secs_f64();
    println!("bare loop:   {changes} events in {bare:.2?} = {bare_rate:>10.0} events/s");

    // The runtime: the same events through the supervisor, router and checkpoints.
    let mut def = <Noop as StreamHandler>::definition().clone();
    def.checkpoint = CheckpointConfig {
        save_every_n: save_every,
        ..def.checkpoint
    };
    let def: &'static _ = Box::leak(Box::new(def));
    // Start after the bare loop's position 0 (the oplog's first token), as the bare loop does.
    let start = flowwarden::port::Checkpoint {
        stream: "bench".into(),
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
    if let Err(e) = stores.checkpoints.save(&start).await {
        eprintln!("cannot write the start checkpoint: {e}");
        std::process::exit(1);
    }
    let t = Instant::now();
    let rt = match flowwarden::builder()
        .discover(false)
        .any_stream(AnyStream::with_definition(Noop, def))
        .backend(backend.clone())
        .start()
        .await
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let done = rt
        .handle()
        .wait_for("bench", |s| s.counters.handled >= changes)
        .await;
    let run = t.elapsed();
    rt.shutdown().await;
    if done.is_err() {
        eprintln!("stream vanished");
        std::process::exit(1);
    }
    let run_rate = changes as f64 / run.as_secs_f64();
    println!(
        "runtime:     {changes} events in {run:.2?} = {run_rate:>10.0} events/s (save_every_n = {save_every})"
    );
    println!("ratio runtime/bare = {:.2}", run_rate / bare_rate);
    println!(
        "peak RSS {:.0} MiB (includes the prefilled oplog)",
        peak_rss_mib()
    );
}
