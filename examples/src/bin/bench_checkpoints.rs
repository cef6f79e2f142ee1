//! P4 of the benchmark suite: checkpoint writes, counted at the store, per 10,000 settled
//! events at `save_every_n = 1, 10, 100`, and per minute on an idle stream (virtual time,
//! heartbeat every 5 s). Run in release mode:
//!
//! ```text
//! cargo run --release -p flowwarden-examples --bin bench_checkpoints [-- --events N]
//! ```

use flowwarden_examples::bench::{arg, p4};

#[tokio::main]
async fn main() {
    let events = arg("--events", 10_000);
    for n in [1, 10, 100] {
        match p4::busy(events, n).await {
            Ok(b) => println!(
                "save_every_n = {n:>3}: {} writes for {events} settled events (+{} at the graceful stop)",
                b.writes, b.stop_writes
            ),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }
    for moves in [true, false] {
        let r = tokio::task::spawn_blocking(move || p4::idle(1, 5, moves)).await;
        match r {
            Ok(Ok(w)) => println!(
                "idle stream, heartbeat 5 s, {}: {w} writes per (virtual) minute",
                if moves {
                    "oplog moving elsewhere"
                } else {
                    "nothing written anywhere"
                }
            ),
            Ok(Err(e)) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }
}
