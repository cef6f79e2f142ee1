//! The benchmark suite of issue 10 (`docs/performance.md`): P1 to P6, each a function that runs
//! one measurement and returns its figures, and the helpers they share. The `bench_*` binaries
//! are thin wrappers; `bench_suite` runs them all and prints one table.
//!
//! Figures are printed, never asserted: each is a ratio or a count measured in one run against
//! the baseline it names. Build in release mode (`cargo run --release ...`); a debug build
//! measures the debug build.

pub mod heap;
pub mod p1;
pub mod p2;
pub mod p3;
pub mod p4;
pub mod p5;
pub mod p6;

mod counting;
mod generated;

use std::time::Duration;

use bson::doc;
use flowwarden::port::{Checkpoint, StoredPosition, WatchSpec};
use flowwarden::{Backend, CheckpointConfig, ResumeToken, StreamDefinition};

pub use counting::CountingCheckpoints;
pub use generated::GeneratedSource;

/// What a benchmark returns when it cannot measure: a message for the operator.
pub type BenchError = String;

/// The value after `name` on the command line (`--events 1000`), or `default`.
pub fn arg(name: &str, default: u64) -> u64 {
    arg_text(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The word after `name` on the command line (`--part P2`), if any.
pub fn arg_text(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

/// Whether `name` is on the command line (`--quick`).
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with(field)).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// The process's peak resident memory (`VmHWM` of `/proc/self/status`), in MiB; NaN where
/// `/proc` is not available.
pub fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// The process's current resident memory (`VmRSS`), in MiB; NaN where `/proc` is not available.
pub fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

/// Resets the peak resident memory to the current one (`echo 5 > /proc/self/clear_refs`, Linux
/// 4.0 and later). Returns whether the kernel accepted it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The token of oplog position `seq` in the format of the in-memory backend (and of
/// [`GeneratedSource`]): `{_data: "<seq as 16 hex digits>"}`. Position 0 is before the first
/// entry, so resuming after it reads everything.
pub fn memory_token(seq: u64) -> ResumeToken {
    ResumeToken::from_document(doc! {"_data": format!("{seq:016X}")})
}

/// The oplog position of a token in [`memory_token`]'s format.
pub fn memory_seq(token: &ResumeToken) -> Option<u64> {
    token
        .as_document()
        .get_str("_data")
        .ok()
        .and_then(|d| u64::from_str_radix(d, 16).ok())
}

/// Stores a checkpoint for `stream` whose seen position is `token`, so the stream's first start
/// resumes after it (as a bare loop opened there does) instead of starting at the head.
pub async fn save_start_checkpoint(
    backend: &Backend,
    stream: &str,
    token: ResumeToken,
) -> Result<(), BenchError> {
    let start = Checkpoint {
        stream: stream.into(),
        last_processed: None,
        last_seen: Some(StoredPosition {
            token,
            cluster_time: None,
            wall_time: None,
            start_after: false,
        }),
        owner: None,
        epoch: None,
        updated_at: bson::DateTime::now(),
        snapshot: None,
    };
    backend
        .checkpoints
        .save(&start)
        .await
        .map_err(|e| format!("cannot write the start checkpoint of '{stream}': {e}"))
}

/// Starts a runtime that runs only `stream` on `backend` (no discovery), as every part does.
pub async fn start_only(
    stream: flowwarden::AnyStream,
    backend: flowwarden::Backend,
) -> Result<flowwarden::Runtime, BenchError> {
    flowwarden::builder()
        .discover(false)
        .any_stream(stream)
        .backend(backend)
        .start()
        .await
        .map_err(|e| e.to_string())
}

/// A copy of `def` with its checkpoint settings changed by `change`, leaked so the runtime can
/// hold it for the rest of the process (a benchmark builds a handful).
pub fn with_checkpoint(
    def: &StreamDefinition,
    change: impl FnOnce(&mut CheckpointConfig),
) -> &'static StreamDefinition {
    let mut def = def.clone();
    change(&mut def.checkpoint);
    Box::leak(Box::new(def))
}

/// The watch spec of a bare loop over `collection`, with the runtime's default batch size.
pub fn bare_spec(collection: &str) -> WatchSpec {
    WatchSpec {
        stream: "bare",
        database: None,
        collection: collection.into(),
        pipeline: vec![],
        full_document: Default::default(),
        full_document_before_change: Default::default(),
        batch_size: 256,
        max_await: Duration::from_millis(10),
    }
}

/// Polls `cond` every 10 ms until it holds or `limit` passes; returns whether it held.
pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until stream `name` of `rt` has handled `events` events, looking every millisecond:
/// the end of a timed run is then known to within about a millisecond, where
/// `RuntimeHandle::wait_for` (which looks every 10 ms) adds up to 10 ms to it.
pub async fn wait_handled(
    rt: &flowwarden::Runtime,
    name: &str,
    events: u64,
) -> Result<(), BenchError> {
    let handle = rt.handle();
    loop {
        let status = handle
            .status(name)
            .ok_or_else(|| format!("stream '{name}' vanished"))?;
        if let Some(halt) = status.halt {
            return Err(format!("stream '{name}' halted: {}", halt.message));
        }
        if status.counters.handled >= events {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The item of median `key` among `items`, the lower middle one of an even count; `None` when
/// there is none. The figure of a measurement made of interleaved pairs (P1, P2): a single
/// pair on a shared machine moves by about 0.05 either way.
pub fn median_by<T: Clone>(items: &[T], key: impl Fn(&T) -> f64) -> Option<T> {
    let mut sorted = items.to_vec();
    sorted.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let middle = sorted.len().checked_sub(1)? / 2;
    sorted.get(middle).cloned()
}

/// `values` with two decimals, in order, comma-separated (`0.81, 0.79, 0.84`).
pub fn two_decimals(values: impl IntoIterator<Item = f64>) -> String {
    let all: Vec<String> = values.into_iter().map(|v| format!("{v:.2}")).collect();
    all.join(", ")
}

/// One line of the suite's table.
#[derive(Debug, Clone)]
pub struct Row {
    /// `P1` .. `P6`.
    pub id: &'static str,
    /// What was measured.
    pub what: String,
    /// The figure, with the numbers it is made of.
    pub figure: String,
    /// The target of issue 10 and whether it was met (`>= 0.8: missed`), or `—`.
    pub target: String,
}

impl Row {
    /// A row.
    pub fn new(
        id: &'static str,
        what: impl Into<String>,
        figure: impl Into<String>,
        target: impl Into<String>,
    ) -> Self {
        Row {
            id,
            what: what.into(),
            figure: figure.into(),
            target: target.into(),
        }
    }
}

/// `">= 0.9: met"` or `">= 0.9: **missed**"`.
pub fn verdict(target: &str, met: bool) -> String {
    if met {
        format!("{target}: met")
    } else {
        format!("{target}: **missed**")
    }
}

/// Prints `rows` as a Markdown table (the form docs/performance.md keeps).
pub fn print_table(rows: &[Row]) {
    println!("| | what | figure | target |");
    println!("|---|---|---|---|");
    for r in rows {
        println!("| {} | {} | {} | {} |", r.id, r.what, r.figure, r.target);
    }
}
