//! Runs the MongoDB wire emulator (test infrastructure, not MongoDB) as its own process.
//!
//! Usage: `mongo-emulator [--port PORT] [--oplog-capacity N]`. Prints the connection URI on the
//! first line of standard output, then serves until the process is killed.

use std::io::Write;

use mongo_emulator::{Emulator, EmulatorOptions};

fn parse_args() -> Result<EmulatorOptions, String> {
    let mut options = EmulatorOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => {
                let v = args.next().ok_or("--port needs a value")?;
                options.port = v.parse().map_err(|_| format!("invalid port '{v}'"))?;
            }
            "--oplog-capacity" => {
                let v = args.next().ok_or("--oplog-capacity needs a value")?;
                options.oplog_capacity =
                    v.parse().map_err(|_| format!("invalid capacity '{v}'"))?;
            }
            "-h" | "--help" => {
                return Err("usage: mongo-emulator [--port PORT] [--oplog-capacity N]".into());
            }
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    Ok(options)
}

fn main() {
    let options = match parse_args() {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(async move {
        match Emulator::start_with(options).await {
            Ok(emu) => {
                println!("{}", emu.uri());
                let _ = std::io::stdout().flush();
                eprintln!("mongo-emulator: test infrastructure, not MongoDB; serving until killed");
                std::future::pending::<()>().await;
                drop(emu);
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    });
}
