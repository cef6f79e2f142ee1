//! P6: the runtime's own peak memory with a 10,000 and a 1,000,000-event backlog. The backlog
//! comes from a [`GeneratedSource`] (events made up as they are read, so the source holds
//! nothing), and each size is measured in a fresh child process: the figure is the peak
//! resident memory while the backlog is handled (`VmHWM`, reset just before the start) minus
//! the resident memory just before the runtime starts.

use std::sync::Arc;
use std::time::Instant;

use flowwarden::{
    change_stream, checkpoint, AnyStream, ChangeContext, MemoryBackend, StreamHandler,
};

use super::{
    memory_token, peak_rss_mib, reset_peak_rss, rss_mib, save_start_checkpoint, start_only,
    BenchError, GeneratedSource,
};

/// The flag that makes a bench binary measure one backlog size and exit (see
/// [`child_main_if_requested`]).
pub const CHILD_FLAG: &str = "--p6-child";

const CHILD_LINE: &str = "p6-measured";

/// The no-op stream of P6.
#[derive(Default)]
pub struct Footprint;

#[change_stream(name = "p6", collection = "p6")]
#[checkpoint(save_every_n = 1, save_interval_secs = 5)]
impl Footprint {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

/// One backlog size, measured.
#[derive(Debug, Clone)]
pub struct Point {
    /// Events in the backlog.
    pub backlog: u64,
    /// Resident memory just before the runtime started, in MiB.
    pub before_mib: f64,
    /// Peak resident memory while the backlog was handled, in MiB.
    pub peak_mib: f64,
    /// Whether the kernel reset the peak before the start (otherwise the peak may be older).
    pub reset: bool,
    /// Events per second, for the record.
    pub rate: f64,
}

impl Point {
    /// The runtime's own peak: `peak_mib - before_mib`.
    pub fn own_mib(&self) -> f64 {
        self.peak_mib - self.before_mib
    }
}

async fn measure(backlog: u64) -> Result<Point, BenchError> {
    let mut stores: flowwarden::Backend = MemoryBackend::new().into();
    stores.source = Arc::new(GeneratedSource::new(backlog, "flowwarden"));
    save_start_checkpoint(&stores, "p6", memory_token(0)).await?;
    let def = <Footprint as StreamHandler>::definition();
    let before_mib = rss_mib();
    let reset = reset_peak_rss();
    let t = Instant::now();
    let rt = start_only(AnyStream::with_definition(Footprint, def), stores).await?;
    let done = rt
        .handle()
        .wait_for("p6", |s| s.counters.handled >= backlog)
        .await;
    let rate = backlog as f64 / t.elapsed().as_secs_f64();
    let peak_mib = peak_rss_mib();
    rt.shutdown().await;
    done.map_err(|e| format!("stream vanished: {e}"))?;
    Ok(Point {
        backlog,
        before_mib,
        peak_mib,
        reset,
        rate,
    })
}

/// Call first in `main` of a binary that runs P6: in a child started with
/// `--p6-child N`, measures a backlog of N, prints the result for the parent and exits.
pub fn child_main_if_requested() {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == CHILD_FLAG) else {
        return;
    };
    let backlog = args
        .get(i + 1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let result = tokio::runtime::Runtime::new()
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(measure(backlog)));
    match result {
        Ok(p) => {
            println!(
                "{CHILD_LINE} {} {} {} {} {}",
                p.backlog, p.before_mib, p.peak_mib, p.reset, p.rate
            );
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("P6 child, backlog {backlog}: {e}");
            std::process::exit(1);
        }
    }
}

/// Measures a backlog of `backlog` in a child process running this same binary (which must call
/// [`child_main_if_requested`] first). Blocks until the child is done.
pub fn measure_in_child(backlog: u64) -> Result<Point, BenchError> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::process::Command::new(exe)
        .args([CHILD_FLAG, &backlog.to_string()])
        .output()
        .map_err(|e| format!("cannot start the P6 child: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "the P6 child failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let line = stdout
        .lines()
        .find(|l| l.starts_with(CHILD_LINE))
        .ok_or_else(|| format!("the P6 child printed no result: {stdout}"))?;
    let f: Vec<&str> = line.split_whitespace().skip(1).collect();
    let num = |i: usize| -> Result<f64, BenchError> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("unreadable P6 result: {line}"))
    };
    Ok(Point {
        backlog: num(0)? as u64,
        before_mib: num(1)?,
        peak_mib: num(2)?,
        reset: f.get(3) == Some(&"true"),
        rate: num(4)?,
    })
}

/// Both sizes, each in its own child: `(small, large)`.
pub fn run(small: u64, large: u64) -> Result<(Point, Point), BenchError> {
    Ok((measure_in_child(small)?, measure_in_child(large)?))
}
