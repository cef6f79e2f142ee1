//! P6 of the benchmark suite: the runtime's own peak memory with a 10,000 and a
//! 1,000,000-event backlog from a generated source (which holds nothing), each measured in a
//! child process. Run in release mode:
//!
//! ```text
//! cargo run --release -p flowwarden-examples --bin bench_memory [-- --small N --large N]
//! ```

use flowwarden_examples::bench::{arg, p6};

fn main() {
    p6::child_main_if_requested();
    let small = arg("--small", 10_000);
    let large = arg("--large", 1_000_000);
    match p6::run(small, large) {
        Ok((s, l)) => {
            for p in [&s, &l] {
                println!(
                    "backlog {:>9}: {:.1} MiB before the start, peak {:.1} MiB, own {:.1} MiB ({:.0} events/s{})",
                    p.backlog,
                    p.before_mib,
                    p.peak_mib,
                    p.own_mib(),
                    p.rate,
                    if p.reset { "" } else { "; peak not reset" }
                );
            }
            println!("ratio large/small = {:.2}", l.own_mib() / s.own_mib());
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
