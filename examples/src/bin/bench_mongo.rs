//! P2 of the benchmark suite: the runtime through the real `mongodb` driver against the
//! in-process wire-level emulator (not MongoDB), against a raw `watch()` loop of the driver
//! over the same events, no-op handler. Run in release mode:
//!
//! ```text
//! cargo run --release -p flowwarden-examples --bin bench_mongo [-- --events N] [-- --save-every N]
//! ```
//!
//! Without `--save-every`, measures `save_every_n = 1` and `= 100`.

use flowwarden_examples::bench::{arg, p2};

#[tokio::main]
async fn main() {
    let events = arg("--events", 50_000);
    let save_every = match arg("--save-every", 0) {
        0 => vec![1, 100],
        n => vec![n as u32],
    };
    match p2::run(events, &save_every).await {
        Ok(figures) => {
            for f in figures {
                println!(
                    "save_every_n = {:>3}: raw watch() {:>8.0} events/s, runtime {:>8.0} events/s, ratio {:.2}; counting driver resumes (command monitor) {:>8.0} events/s, ratio {:.2}",
                    f.save_every, f.raw, f.runtime, f.ratio(), f.runtime_monitored, f.ratio_monitored()
                );
            }
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
