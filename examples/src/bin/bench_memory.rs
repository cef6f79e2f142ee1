//! P6 of the benchmark suite: the runtime's own peak heap with a 10,000 and a 1,000,000-event
//! backlog from a generated source (which holds nothing), each measured in a child process.
//! `--hold` plants a leak (a handler that keeps every event) to show what growth looks like;
//! `--concurrency N` runs the stream with keyed concurrency (`max_in_flight` 4 x N).
//! Run in release mode:
//!
//! ```text
//! cargo run --release -p flowwarden-examples --bin bench_memory [-- --small N --large N --hold --concurrency N]
//! ```

use flowwarden_examples::bench::heap::CountingAllocator;
use flowwarden_examples::bench::{arg, p6};

// P6 counts the live heap (docs/performance.md, P6).
#[global_allocator]
static HEAP: CountingAllocator = CountingAllocator;

fn main() {
    p6::child_main_if_requested();
    let small = arg("--small", 10_000);
    let large = arg("--large", 1_000_000);
    let mode = p6::Mode::from_args();
    match p6::run(small, large, mode) {
        Ok((s, l)) => {
            for p in [&s, &l] {
                println!(
                    "backlog {:>9}{}, concurrency {}: peak heap {:.2} MiB; resident {:.1} MiB before the start, peak {:.1} MiB, {:.1} MiB above ({:.0} events/s{})",
                    p.backlog,
                    if mode.hold { " (--hold)" } else { "" },
                    mode.concurrency.max(1),
                    p.heap_mib(),
                    p.before_mib,
                    p.peak_mib,
                    p.rss_mib(),
                    p.rate,
                    if p.reset { "" } else { "; resident peak not reset" }
                );
            }
            println!(
                "ratio large/small: heap {:.3}, resident {:.2}",
                l.heap_mib() / s.heap_mib(),
                l.rss_mib() / s.rss_mib()
            );
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
