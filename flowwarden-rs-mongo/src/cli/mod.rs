//! The `flowwarden` admin command-line tool (feature `cli`): reads and repairs the runtime's
//! state directly in MongoDB (`_fw_checkpoints`, `_fw_dlq`, `_fw_locks`), for when the service
//! is down — the way out of a `HistoryLost` or `CorruptCheckpoint` halt among others.
//!
//! The binary (`src/bin/flowwarden.rs`) only parses the process's arguments and calls
//! [`invoke`]; everything else lives here so tests drive the same code in process. The stored
//! documents are read and written through the crate's own stores and codecs
//! ([`flowwarden::port::codec`], [`crate::LeaseDocument`]), never re-parsed by hand.
//!
//! Commands, options, exit codes and the rules for `checkpoint reset` and `dlq replay` are
//! documented in `docs/operations.md`, "Command-line tool".

mod admin_http;
mod checkpoint;
mod connect;
mod dlq;
mod error;
mod facts;
mod lease;
mod output;
mod position;
mod views;

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use flowwarden::port::DeadLetterStatus;

pub use error::{exit, CliError, CORRUPT_CHECKPOINT_RUNBOOK, EXIT_CODES};
pub use output::Report;

/// The `owner` the tool writes on a checkpoint it resets. A checkpoint saved by the tool is not
/// evidence that the stream runs; the runtime's next save replaces it with its own identity.
pub const CLI_OWNER: &str = "flowwarden-cli";

/// The default of `--stale-after`, in seconds: a checkpoint saved more recently than this (by
/// the server's clock) shows the stream running.
pub const DEFAULT_STALE_AFTER_SECS: u64 = 60;

/// The default of `--timeout`, in seconds: how long to look for a usable server.
pub const DEFAULT_TIMEOUT_SECS: u64 = 5;

/// Environment variable of `--admin`, the service's admin API base URL.
pub const ENV_ADMIN_URL: &str = "FLOWWARDEN_ADMIN_URL";

/// Environment variable of `--token`, the admin API's bearer token (the service reads the same
/// variable for the token it requires).
pub const ENV_ADMIN_TOKEN: &str = "FLOWWARDEN_ADMIN_TOKEN";

/// `flowwarden`: inspect and repair flowwarden-rs streams in MongoDB while the service is down.
#[derive(Debug, Parser)]
#[command(name = "flowwarden", version, about, long_about = None, after_help = exit_codes_help())]
pub struct Cli {
    /// Options of every command.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options of every command.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// MongoDB connection string (credentials are never printed).
    #[arg(long, global = true, env = crate::ENV_URI, hide_env_values = true)]
    pub uri: Option<String>,
    /// Database of the `_fw_` collections.
    #[arg(long, global = true, env = crate::ENV_DATABASE, default_value = crate::DEFAULT_DATABASE)]
    pub database: String,
    /// Machine-readable output: one JSON document on stdout (errors too, with `error`, `code`
    /// and `exit_code`).
    #[arg(long, global = true)]
    pub json: bool,
    /// Seconds to wait for a usable server (server selection and connect timeout), unless the
    /// connection string sets its own.
    #[arg(long, global = true, value_name = "SECS", default_value_t = DEFAULT_TIMEOUT_SECS)]
    pub timeout: u64,
    /// A checkpoint saved (or claimed) less than this many seconds ago, by the server's clock,
    /// shows its stream running: `checkpoint reset` refuses it without `--force`.
    #[arg(long, global = true, value_name = "SECS", default_value_t = DEFAULT_STALE_AFTER_SECS)]
    pub stale_after: u64,
}

impl GlobalArgs {
    /// `--stale-after` as a duration.
    pub fn stale_after(&self) -> Duration {
        Duration::from_secs(self.stale_after)
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every stream with a checkpoint, a lease or dead letters: positions, last save, lease
    /// holder and expiry, dead-letter counts, and whether it looks running.
    Streams,
    /// Show or reset a stream's checkpoint.
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// List, show, replay or discard dead letters.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Show or release a lease.
    #[command(subcommand)]
    Lease(LeaseCommand),
}

/// `flowwarden checkpoint ...`.
#[derive(Debug, Subcommand)]
pub enum CheckpointCommand {
    /// The stored checkpoint of a stream (its `_id` in `_fw_checkpoints`: the stream's name, or
    /// `<stream>@<instance>`), with its leases and whether it looks running.
    Show {
        /// The checkpoint's name.
        name: String,
    },
    /// Replace a stream's checkpoint by one explicit position (both tokens). Refused while the
    /// stream looks running unless `--force`; prints the old and new positions and the gap.
    Reset(ResetArgs),
}

/// `flowwarden checkpoint reset NAME --to-now | --to-time T | --to-token JSON [--force]`.
#[derive(Debug, Args)]
pub struct ResetArgs {
    /// The checkpoint's name.
    pub name: String,
    /// Where the stream must resume.
    #[command(flatten)]
    pub to: ResetTarget,
    /// Reset even though a live lease or a recent save shows the stream running.
    #[arg(long)]
    pub force: bool,
}

/// The position of `checkpoint reset`: exactly one of the three.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ResetTarget {
    /// Resume after everything written so far (the server's current operation time): changes
    /// between the old position and now are skipped.
    #[arg(long)]
    pub to_now: bool,
    /// Resume at this time (RFC 3339, for example 2024-05-01T12:00:00Z), rounded down to the
    /// second: every change from that second on is delivered.
    #[arg(long, value_name = "RFC3339")]
    pub to_time: Option<String>,
    /// Resume after this resume token (extended JSON, for example '{"_data": "8263..."}').
    #[arg(long, value_name = "JSON")]
    pub to_token: Option<String>,
}

/// `flowwarden dlq ...`.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dead letters, oldest first.
    List {
        /// Only this stream.
        #[arg(long)]
        stream: Option<String>,
        /// Only this status.
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        /// At most this many.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
    },
    /// One dead letter, with its event and error chain.
    Show {
        /// The record's id.
        id: String,
    },
    /// Mark a dead letter discarded (kept for audit), directly in MongoDB, as the service's
    /// discard does.
    Discard {
        /// The record's id.
        id: String,
    },
    /// Run a dead letter through its stream's handler again: through the running service's
    /// admin API, which has the handler code (`POST /dead-letters/{id}/replay`).
    Replay {
        /// The record's id.
        id: String,
        /// The service's admin API, for example http://127.0.0.1:9090.
        #[arg(long, value_name = "URL", env = ENV_ADMIN_URL)]
        admin: Option<String>,
        /// The admin API's bearer token.
        #[arg(long, env = ENV_ADMIN_TOKEN, hide_env_values = true)]
        token: Option<String>,
    },
}

/// A dead-letter status on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusArg {
    /// Waiting for an operator.
    Pending,
    /// Replayed successfully.
    Replayed,
    /// Discarded by an operator.
    Discarded,
}

impl From<StatusArg> for DeadLetterStatus {
    fn from(s: StatusArg) -> Self {
        match s {
            StatusArg::Pending => DeadLetterStatus::Pending,
            StatusArg::Replayed => DeadLetterStatus::Replayed,
            StatusArg::Discarded => DeadLetterStatus::Discarded,
        }
    }
}

/// `flowwarden lease ...`.
#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// A stream's leases: its leader lease (`NAME`) and its checkpoint guard
    /// (`NAME#checkpoint`), with holder, epoch, expiry and whether they are held now.
    Show {
        /// The stream (or the exact lease name).
        name: String,
    },
    /// Make a lease free now (the epoch is kept, so fencing still works). Refused while it is
    /// held, by the server's clock, unless `--force`: use it once the holder is known to be gone.
    Release {
        /// The exact lease name (`NAME` or `NAME#checkpoint`).
        name: String,
        /// Release a lease that is still held.
        #[arg(long)]
        force: bool,
    },
}

fn exit_codes_help() -> String {
    let mut s = String::from("Exit codes:\n");
    for (code, meaning) in EXIT_CODES {
        s.push_str(&format!("  {code:>2}  {meaning}\n"));
    }
    s
}

/// Runs one parsed command and returns what it found or did.
pub async fn run(cli: &Cli) -> Result<Report, CliError> {
    let g = &cli.global;
    // Every command but `dlq replay` (which goes to the service) talks to MongoDB.
    let conn = || connect::Conn::open(g);
    match &cli.command {
        Command::Streams => facts::streams(&conn().await?, g).await,
        Command::Checkpoint(CheckpointCommand::Show { name }) => {
            checkpoint::show(&conn().await?, g, name).await
        }
        Command::Checkpoint(CheckpointCommand::Reset(args)) => {
            checkpoint::reset(&conn().await?, g, args).await
        }
        Command::Dlq(DlqCommand::List {
            stream,
            status,
            limit,
        }) => {
            dlq::list(
                &conn().await?,
                stream.clone(),
                status.map(Into::into),
                *limit,
            )
            .await
        }
        Command::Dlq(DlqCommand::Show { id }) => dlq::show(&conn().await?, id).await,
        Command::Dlq(DlqCommand::Discard { id }) => dlq::discard(&conn().await?, id).await,
        Command::Dlq(DlqCommand::Replay { id, admin, token }) => {
            dlq::replay(id, admin.as_deref(), token.as_deref()).await
        }
        Command::Lease(LeaseCommand::Show { name }) => lease::show(&conn().await?, name).await,
        Command::Lease(LeaseCommand::Release { name, force }) => {
            lease::release(&conn().await?, name, *force).await
        }
    }
}

/// What one invocation printed and its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The process exit code (see [`exit`]).
    pub code: i32,
    /// What goes to stdout: the report (text, or JSON with `--json`), or the JSON error.
    pub stdout: String,
    /// What goes to stderr: the error message, usage errors.
    pub stderr: String,
}

/// Parses `args` (the program name first, as in `std::env::args_os()`), runs the command and
/// renders its output: what the binary prints and exits with.
pub async fn invoke<I, T>(args: I) -> Outcome
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = e.exit_code();
            let text = e.render().to_string();
            // `--help` and `--version` are not errors: they print on stdout.
            return if code == 0 {
                Outcome {
                    code,
                    stdout: text,
                    stderr: String::new(),
                }
            } else {
                Outcome {
                    code,
                    stdout: String::new(),
                    stderr: text,
                }
            };
        }
    };
    match run(&cli).await {
        Ok(report) => Outcome {
            code: exit::OK,
            stdout: if cli.global.json {
                output::json_line(&report.to_json())
            } else {
                report.to_text()
            },
            stderr: String::new(),
        },
        Err(e) => {
            let code = e.exit_code();
            let stdout = if cli.global.json {
                output::json_line(&serde_json::json!({
                    "error": e.to_string(),
                    "code": e.code(),
                    "exit_code": code,
                }))
            } else {
                String::new()
            };
            Outcome {
                code,
                stdout,
                stderr: format!("flowwarden: {e}\n"),
            }
        }
    }
}

/// Logs of the tool to stderr: `RUST_LOG` if set, else warnings only.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_arguments_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn reset_needs_exactly_one_target() {
        assert!(Cli::try_parse_from(["flowwarden", "checkpoint", "reset", "s"]).is_err());
        assert!(Cli::try_parse_from([
            "flowwarden",
            "checkpoint",
            "reset",
            "s",
            "--to-now",
            "--to-time",
            "2024-01-01T00:00:00Z"
        ])
        .is_err());
        let cli = Cli::try_parse_from(["flowwarden", "checkpoint", "reset", "s", "--to-now"])
            .expect("parses");
        assert!(matches!(
            cli.command,
            Command::Checkpoint(CheckpointCommand::Reset(ResetArgs {
                to: ResetTarget { to_now: true, .. },
                ..
            }))
        ));
    }
}
