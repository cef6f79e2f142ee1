//! P1 of the benchmark suite: throughput of the runtime on the in-memory backend, against a
//! bare loop over the same source. Run in release mode:
//!
//! ```text
//! cargo run --release -p flowwarden-examples --bin bench_runtime [-- --changes N] [-- --save-every N] [-- --pairs N] [-- --main-thread]
//! ```
//!
//! Prints events per second of both and their ratio for each of `--pairs` interleaved pairs
//! (default 3), the median ratio, and the process's peak resident memory. Both run on a worker
//! thread of the Tokio runtime; with `--main-thread` the bare loop runs on the main thread.
//! `bench_suite` runs it with the others.

use std::time::Instant;

use flowwarden_examples::bench::{arg, flag, p1, peak_rss_mib};

#[tokio::main]
async fn main() {
    let changes = arg("--changes", 1_000_000);
    let save_every = arg("--save-every", 1) as u32;
    let pairs = arg("--pairs", 3) as u32;
    let t = Instant::now();
    let backend = match p1::prefill(changes) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!(
        "prefilled {changes} inserts in {:.2?}; peak RSS so far {:.0} MiB",
        t.elapsed(),
        peak_rss_mib()
    );
    let measured = if flag("--main-thread") {
        p1::run_here(&backend, changes, &[save_every], pairs).await
    } else {
        p1::run(&backend, changes, &[save_every], pairs).await
    };
    match measured {
        Ok(figures) => {
            for f in figures {
                for (i, p) in f.pairs.iter().enumerate() {
                    println!(
                        "pair {}: bare loop {:>10.0} events/s, runtime {:>10.0} events/s (save_every_n = {}), ratio {:.2}",
                        i + 1,
                        p.bare,
                        p.runtime,
                        f.save_every,
                        p.ratio()
                    );
                }
                println!(
                    "ratio runtime/bare = {:.2} (median of {} pairs: {})",
                    f.ratio(),
                    f.pairs.len(),
                    f.ratios()
                );
            }
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
    println!(
        "peak RSS {:.0} MiB (includes the prefilled oplog)",
        peak_rss_mib()
    );
}
