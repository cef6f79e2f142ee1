//! P5 of the benchmark suite: events read again on a restart after a filter-heavy period
//! (999 events in 1,000 rejected by `#[filter]`), `resume_strategy = ProcessedFirst` vs
//! `SeenFirst`, from the same stored checkpoint. Run in release mode:
//!
//! ```text
//! cargo run --release -p flowwarden-examples --bin bench_restart [-- --events N]
//! ```

use flowwarden_examples::bench::{arg, p5};

#[tokio::main]
async fn main() {
    let events = arg("--events", 100_000);
    match p5::run(events).await {
        Ok(f) => {
            println!(
                "{} events, {} handled; stored at the crash: lastProcessed at {:?}, lastSeen at {:?}",
                f.events, f.handled, f.last_processed, f.last_seen
            );
            println!(
                "rescanned on restart: ProcessedFirst {}, SeenFirst {}",
                f.rescanned_processed_first, f.rescanned_seen_first
            );
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
