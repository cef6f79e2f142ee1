//! P6: the runtime's own peak memory with a 10,000 and a 1,000,000-event backlog. The backlog
//! comes from a [`GeneratedSource`] (events made up as they are read, so the source holds
//! nothing), and each size is measured in a fresh child process. The figure is the peak of the
//! live heap while the backlog is handled, counted by [`heap::CountingAllocator`] from just
//! before the start: what the runtime allocated and still held at its worst moment. The peak
//! resident memory (`VmHWM`) is printed beside it for the record; it also holds the allocator's
//! arenas and fragmentation, which move it by megabytes between two runs of one binary.
//!
//! The handler spins [`HANDLER_SPIN`] per event, longer than the generated source takes to make
//! one, so the reader runs ahead as it does over a real backlog and the bounded read-ahead is
//! full in both sizes. A planted leak ([`Mode::hold`], a handler that keeps every event) shows
//! what the figure looks like when memory grows with the backlog.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use flowwarden::{
    change_stream, checkpoint, AnyStream, ChangeContext, ChangeEvent, ConcurrencyConfig,
    MemoryBackend, StreamHandler,
};

use super::{
    arg, flag, heap, memory_token, peak_rss_mib, reset_peak_rss, rss_mib, save_start_checkpoint,
    start_only, BenchError, GeneratedSource,
};

/// The flag that makes a bench binary measure one backlog size and exit (see
/// [`child_main_if_requested`]).
pub const CHILD_FLAG: &str = "--p6-child";

/// The flag of a child (and of `bench_memory`) that plants the leak of [`Mode::hold`].
pub const HOLD_FLAG: &str = "--hold";

/// The option of a child (and of `bench_memory`) that sets [`Mode::concurrency`].
pub const CONCURRENCY_FLAG: &str = "--concurrency";

const CHILD_LINE: &str = "p6-measured";

/// How long the handler works on each event: longer than the generated source takes to make
/// one, so a backlog stays a backlog (the reader ahead, its read-ahead full).
pub const HANDLER_SPIN: Duration = Duration::from_micros(4);

/// How a P6 run handles its events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mode {
    /// Keep every event the handler sees until the run ends: a planted leak, for showing that
    /// the measurement catches memory that grows with the backlog.
    pub hold: bool,
    /// The stream's `concurrency` (0 or 1: one event at a time); `max_in_flight` is its
    /// default, 4 x `concurrency`.
    pub concurrency: u32,
}

impl Mode {
    /// The mode named on this process's command line ([`HOLD_FLAG`], [`CONCURRENCY_FLAG`]).
    pub fn from_args() -> Self {
        Mode {
            hold: flag(HOLD_FLAG),
            concurrency: u32::try_from(arg(CONCURRENCY_FLAG, 1)).unwrap_or(u32::MAX),
        }
    }
}

/// The stream of P6: spins [`HANDLER_SPIN`] per insert; with [`Mode::hold`], keeps each event.
#[derive(Default)]
pub struct Footprint {
    mode: Mode,
    kept: Mutex<Vec<ChangeEvent>>,
}

#[change_stream(name = "p6", collection = "p6")]
#[checkpoint(save_every_n = 1, save_interval_secs = 5)]
impl Footprint {
    #[on_insert]
    async fn inserted(&self, ctx: &ChangeContext<bson::Document>) {
        let t = Instant::now();
        while t.elapsed() < HANDLER_SPIN {
            std::hint::spin_loop();
        }
        if self.mode.hold {
            self.kept
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(ctx.event().clone());
        }
    }
}

/// One backlog size, measured.
#[derive(Debug, Clone)]
pub struct Point {
    /// Events in the backlog.
    pub backlog: u64,
    /// Peak growth of the live heap while the backlog was handled, in bytes.
    pub heap_peak: usize,
    /// Resident memory just before the runtime started, in MiB.
    pub before_mib: f64,
    /// Peak resident memory while the backlog was handled, in MiB.
    pub peak_mib: f64,
    /// Whether the kernel reset the resident peak before the start.
    pub reset: bool,
    /// Events per second, for the record.
    pub rate: f64,
}

impl Point {
    /// The runtime's own peak heap, in MiB.
    pub fn heap_mib(&self) -> f64 {
        self.heap_peak as f64 / (1024.0 * 1024.0)
    }

    /// The peak resident memory above the resident memory before the start, in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.peak_mib - self.before_mib
    }
}

/// Measures one backlog in this process, whose global allocator must be
/// [`heap::CountingAllocator`] (an error otherwise).
pub async fn measure(backlog: u64, mode: Mode) -> Result<Point, BenchError> {
    let mut stores: flowwarden::Backend = MemoryBackend::new().into();
    stores.source = Arc::new(GeneratedSource::new(backlog, "flowwarden"));
    save_start_checkpoint(&stores, "p6", memory_token(0)).await?;
    let mut def = <Footprint as StreamHandler>::definition().clone();
    def.concurrency = ConcurrencyConfig {
        concurrency: mode.concurrency.max(1),
        max_in_flight: 0,
    };
    let def: &'static _ = Box::leak(Box::new(def));
    let stream = AnyStream::with_definition(
        Footprint {
            mode,
            ..Footprint::default()
        },
        def,
    );
    let before_mib = rss_mib();
    let reset = reset_peak_rss();
    heap::start();
    if !heap::installed() {
        heap::stop();
        return Err(
            "P6 needs `#[global_allocator] static HEAP: CountingAllocator` in this binary".into(),
        );
    }
    let t = Instant::now();
    let rt = start_only(stream, stores).await?;
    let done = rt
        .handle()
        .wait_for("p6", |s| s.counters.handled >= backlog)
        .await;
    let rate = backlog as f64 / t.elapsed().as_secs_f64();
    let heap_peak = heap::stop();
    let peak_mib = peak_rss_mib();
    rt.shutdown().await;
    done.map_err(|e| format!("stream vanished: {e}"))?;
    Ok(Point {
        backlog,
        heap_peak,
        before_mib,
        peak_mib,
        reset,
        rate,
    })
}

/// Call first in `main` of a binary that runs P6: in a child started with
/// `--p6-child N [--hold] [--concurrency N]`, measures a backlog of N, prints the result for the parent and exits.
pub fn child_main_if_requested() {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == CHILD_FLAG) else {
        return;
    };
    let backlog = args
        .get(i + 1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mode = Mode::from_args();
    let result = tokio::runtime::Runtime::new()
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(measure(backlog, mode)));
    match result {
        Ok(p) => {
            println!(
                "{CHILD_LINE} {} {} {} {} {} {}",
                p.backlog, p.heap_peak, p.before_mib, p.peak_mib, p.reset, p.rate
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
/// [`child_main_if_requested`] first and declare [`heap::CountingAllocator`] as its global
/// allocator). Blocks until the child is done.
pub fn measure_in_child(backlog: u64, mode: Mode) -> Result<Point, BenchError> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = std::process::Command::new(exe);
    child.args([CHILD_FLAG, &backlog.to_string()]);
    if mode.hold {
        child.arg(HOLD_FLAG);
    }
    child.args([CONCURRENCY_FLAG, &mode.concurrency.max(1).to_string()]);
    let out = child
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
        heap_peak: num(1)? as usize,
        before_mib: num(2)?,
        peak_mib: num(3)?,
        reset: f.get(4) == Some(&"true"),
        rate: num(5)?,
    })
}

/// How many children measure the small size and the large one; each figure is the highest
/// peak of its children. The peak is a maximum over time, reached within the first few thousand
/// events and then touched again now and then (the read-ahead, the batch in hand and a checkpoint
/// write all full at once): one 10,000-event run lasts a fraction of a second and reads up to 10%
/// low against a 1,000,000-event run, which has a hundred times the chances to touch it. Ten
/// short runs against three long ones compare the bound each size reaches.
pub const RUNS: (usize, usize) = (10, 3);

/// The highest of `runs` measurements of `backlog`, each in its own child.
pub fn measure_highest(backlog: u64, mode: Mode, runs: usize) -> Result<Point, BenchError> {
    let mut highest = measure_in_child(backlog, mode)?;
    for _ in 1..runs {
        let p = measure_in_child(backlog, mode)?;
        if p.heap_peak > highest.heap_peak {
            highest = p;
        }
    }
    Ok(highest)
}

/// Both sizes, each the highest of its [`RUNS`] children: `(small, large)`.
pub fn run(small: u64, large: u64, mode: Mode) -> Result<(Point, Point), BenchError> {
    Ok((
        measure_highest(small, mode, RUNS.0)?,
        measure_highest(large, mode, RUNS.1)?,
    ))
}
