//! `flowwarden`: the admin command-line tool of flowwarden-rs on MongoDB (feature `cli`).
//! Everything is in `flowwarden_rs_mongo::cli`; see `docs/operations.md`, "Command-line tool".

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    flowwarden_rs_mongo::cli::init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("flowwarden: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(flowwarden_rs_mongo::cli::invoke(std::env::args_os()));
    let _ = std::io::stdout().write_all(outcome.stdout.as_bytes());
    let _ = std::io::stderr().write_all(outcome.stderr.as_bytes());
    ExitCode::from(u8::try_from(outcome.code).unwrap_or(1))
}
