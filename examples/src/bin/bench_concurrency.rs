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

use flowwarden_examples::bench::{arg, p3};

#[tokio::main]
async fn main() {
    let events = arg("--events", 20_000);
    let keys = arg("--keys", 10_000).max(1);
    let concurrency = arg("--concurrency", 64) as u32;
    let baseline = arg("--baseline", 1) as u32;
    match p3::compare(events, keys, baseline, concurrency).await {
        Ok(f) => {
            for (c, rate) in [(baseline, f.baseline_rate), (concurrency, f.rate)] {
                println!(
                    "concurrency = {c:>3}: {events} events over {keys} keys = {rate:>9.0} events/s (per-key order checked)"
                );
            }
            println!(
                "ratio concurrency {concurrency} / concurrency {baseline} = {:.1}",
                f.ratio()
            );
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
