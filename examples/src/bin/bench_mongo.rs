//! P2 of the benchmark suite: the runtime through the real `mongodb` driver against the
//! in-process wire-level emulator (not MongoDB), against a raw `watch()` loop of the driver
//! over the same events, no-op handler. Run in release mode:
//!
//! ```text
//! cargo run --release -p flowwarden-examples --bin bench_mongo [-- --events N] [-- --save-every N] [-- --pairs N]
//! ```
//!
//! Without `--save-every`, measures `save_every_n = 1` and `= 100`. Prints every one of the
//! `--pairs` interleaved pairs (default 3), then the median.

use flowwarden_examples::bench::{arg, p2};

#[tokio::main]
async fn main() {
    let events = arg("--events", 50_000);
    let pairs = arg("--pairs", 3) as u32;
    let save_every = match arg("--save-every", 0) {
        0 => vec![1, 100],
        n => vec![n as u32],
    };
    match p2::run(events, &save_every, pairs).await {
        Ok(figures) => {
            for f in figures {
                for (i, p) in f.pairs.iter().enumerate() {
                    println!(
                        "save_every_n = {:>3}, pair {}: raw watch() {:>8.0} events/s, runtime {:>8.0} events/s, ratio {:.2}; counting driver resumes (command monitor) {:>8.0} events/s, ratio {:.2}",
                        f.save_every, i + 1, p.raw, p.runtime, p.ratio(), p.runtime_monitored, p.ratio_monitored()
                    );
                }
                println!(
                    "save_every_n = {:>3}: ratio runtime/raw = {:.2} (median of {} pairs: {}); counting driver resumes {:.2}",
                    f.save_every,
                    f.ratio(),
                    f.pairs.len(),
                    f.ratios(),
                    f.ratio_monitored()
                );
            }
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
