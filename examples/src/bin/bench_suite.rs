//! The whole benchmark suite of docs/performance.md (P1 to P6) in one run, printed as one
//! table. Run in release mode:
//!
//! ```text
//! cargo run --release -p flowwarden-examples --bin bench_suite [-- --quick]
//! ```
//!
//! `--quick` uses smaller counts (a smoke run; its figures are not the documented ones).
//! Each part runs in a child process of this binary (`--part P1` .. `--part P6` runs one part
//! alone), so that none measures in a process an earlier part changed; each prints its lines
//! as it finishes, and a part that fails prints its error in its row and the suite goes on.

use std::time::Instant;

use flowwarden_examples::bench::heap::CountingAllocator;
use flowwarden_examples::bench::{
    arg_text, flag, p1, p2, p3, p4, p5, p6, print_table, verdict, BenchError, Row,
};

/// The counts of one run.
struct Counts {
    p1: u64,
    p2: u64,
    p3_events: u64,
    p3_keys: u64,
    p4: u64,
    p5: u64,
    p6_small: u64,
    p6_large: u64,
}

const FULL: Counts = Counts {
    p1: 1_000_000,
    p2: 50_000,
    p3_events: 20_000,
    p3_keys: 10_000,
    p4: 10_000,
    p5: 100_000,
    p6_small: 10_000,
    p6_large: 1_000_000,
};

const QUICK: Counts = Counts {
    p1: 100_000,
    p2: 5_000,
    p3_events: 2_000,
    p3_keys: 1_000,
    p4: 10_000,
    p5: 10_000,
    p6_small: 10_000,
    p6_large: 100_000,
};

fn n(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn failed(id: &'static str, what: &str, e: BenchError) -> Vec<Row> {
    vec![Row::new(id, what, format!("failed: {e}"), "—")]
}

/// Interleaved bare / runtime pairs per P1 figure (the median is reported, every pair shown).
const P1_PAIRS: u32 = 3;

/// Interleaved raw / runtime pairs per P2 figure (the median is reported, every pair shown).
const P2_PAIRS: u32 = 3;

async fn part_p1(c: &Counts) -> Vec<Row> {
    let what = |s: &str| {
        format!(
            "no-op handler, {} events, in-memory, `save_every_n = {s}`, vs a bare loop over the same source",
            n(c.p1)
        )
    };
    let backend = match p1::prefill(c.p1) {
        Ok(b) => b,
        Err(e) => return failed("P1", &what("1 and 100"), e),
    };
    match p1::run(&backend, c.p1, &[1, 100], P1_PAIRS).await {
        Ok(fs) => fs
            .iter()
            .map(|f| {
                let target = if f.save_every == 100 {
                    verdict(">= 0.8", f.ratio() >= 0.8)
                } else {
                    "—".into()
                };
                Row::new(
                    "P1",
                    what(&f.save_every.to_string()),
                    format!(
                        "{:.2} ({:.0} vs {:.0} events/s; median of {} pairs: {})",
                        f.ratio(),
                        f.median().runtime,
                        f.median().bare,
                        f.pairs.len(),
                        f.ratios()
                    ),
                    target,
                )
            })
            .collect(),
        Err(e) => failed("P1", &what("1 and 100"), e),
    }
}

async fn part_p2(c: &Counts) -> Vec<Row> {
    let what = |s: &str| {
        format!(
            "no-op handler, {} events, `mongodb` driver against the emulator, `save_every_n = {s}`, vs a raw `watch()` loop",
            n(c.p2)
        )
    };
    match p2::run(c.p2, &[1, 100], P2_PAIRS).await {
        Ok(fs) => fs
            .iter()
            .map(|f| {
                Row::new(
                    "P2",
                    what(&f.save_every.to_string()),
                    format!(
                        "{:.2} ({:.0} vs {:.0} events/s; median of {} pairs: {}); {:.2} counting driver resumes",
                        f.ratio(),
                        f.median().runtime,
                        f.median().raw,
                        f.pairs.len(),
                        f.ratios(),
                        f.ratio_monitored(),
                    ),
                    verdict(">= 0.9", f.ratio() >= 0.9),
                )
            })
            .collect(),
        Err(e) => failed("P2", &what("1 and 100"), e),
    }
}

async fn part_p3(c: &Counts) -> Vec<Row> {
    let what = format!(
        "async handler waiting 5 ms, {} events over {} keys, `concurrency = 64` vs `1`",
        n(c.p3_events),
        n(c.p3_keys)
    );
    match p3::compare(c.p3_events, c.p3_keys, 1, 64).await {
        Ok(f) => vec![Row::new(
            "P3",
            what,
            format!(
                "{:.1}x ({:.0} vs {:.0} events/s), per-key order checked after both runs",
                f.ratio(),
                f.rate,
                f.baseline_rate
            ),
            verdict(">= 50x", f.ratio() >= 50.0),
        )],
        Err(e) => failed("P3", &what, e),
    }
}

async fn part_p4(c: &Counts) -> Vec<Row> {
    let mut rows = Vec::new();
    for s in [1u32, 10, 100] {
        let what = format!(
            "checkpoint writes per {} settled events, `save_every_n = {s}`",
            n(c.p4)
        );
        match p4::busy(c.p4, s).await {
            Ok(b) => {
                let expected = c.p4 / u64::from(s);
                rows.push(Row::new(
                    "P4",
                    what,
                    format!(
                        "{} writes (+{} at the graceful stop)",
                        n(b.writes),
                        b.stop_writes
                    ),
                    format!(
                        "{} (one per `save_every_n`): {}",
                        n(expected),
                        if b.writes == expected {
                            "met"
                        } else {
                            "**missed**"
                        }
                    ),
                ));
            }
            Err(e) => rows.extend(failed("P4", &what, e)),
        }
    }
    for moves in [true, false] {
        let what = if moves {
            "checkpoint writes per minute, idle stream, heartbeat 5 s, another collection written every second (virtual time)"
        } else {
            "checkpoint writes per minute, idle stream, heartbeat 5 s, nothing written anywhere (virtual time)"
        };
        let r = tokio::task::spawn_blocking(move || p4::idle(1, 5, moves))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        match r {
            Ok(w) => {
                let target = if moves {
                    format!(
                        "12 (one per heartbeat): {}",
                        if w == 12 { "met" } else { "**missed**" }
                    )
                } else {
                    "0 (the position does not move)".into()
                };
                rows.push(Row::new("P4", what, format!("{w} writes"), target));
            }
            Err(e) => rows.extend(failed("P4", what, e)),
        }
    }
    rows
}

async fn part_p5(c: &Counts) -> Vec<Row> {
    let what = format!(
        "restart after {} events, 99.9% rejected by `#[filter]`, crash after the heartbeat: events read again",
        n(c.p5)
    );
    match p5::run(c.p5).await {
        Ok(f) => vec![Row::new(
            "P5",
            what,
            format!(
                "`ProcessedFirst` {}, `SeenFirst` {} ({} handled; stored lastProcessed at position {}, lastSeen at {})",
                n(f.rescanned_processed_first),
                n(f.rescanned_seen_first),
                n(f.handled),
                f.last_processed.map_or("—".into(), n),
                f.last_seen.map_or("—".into(), n),
            ),
            "—",
        )],
        Err(e) => failed("P5", &what, e),
    }
}

async fn part_p6(c: &Counts) -> Vec<Row> {
    let what = format!(
        "the runtime's own peak heap, backlog of {} vs {} events (generated source; highest of 10 and of 3 child processes)",
        n(c.p6_small),
        n(c.p6_large)
    );
    let (small, large) = (c.p6_small, c.p6_large);
    let r = tokio::task::spawn_blocking(move || p6::run(small, large, p6::Mode::default()))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
    match r {
        Ok((s, l)) => {
            let ratio = l.heap_mib() / s.heap_mib();
            vec![Row::new(
                "P6",
                what,
                format!(
                    "{:.2} ({:.2} vs {:.2} MiB; peak resident {:.1} vs {:.1} MiB above the start)",
                    ratio,
                    l.heap_mib(),
                    s.heap_mib(),
                    l.rss_mib(),
                    s.rss_mib()
                ),
                verdict("flat within 10%", (ratio - 1.0).abs() <= 0.1),
            )]
        }
        Err(e) => failed("P6", &what, e),
    }
}

fn print_rows(rows: &[Row]) {
    for r in rows {
        println!("{} {}: {} [{}]", r.id, r.what, r.figure, r.target);
    }
}

// P6 counts the live heap of its child processes (this binary); off, the counter costs one load
// per allocation, so P1 to P5 are not affected.
#[global_allocator]
static HEAP: CountingAllocator = CountingAllocator;

fn main() {
    // P6 measures in children of this binary: they must not start inside a runtime.
    p6::child_main_if_requested();
    let Some(part) = arg_text("--part") else {
        suite();
        return;
    };
    let Some(part) = PARTS.into_iter().find(|p| *p == part) else {
        eprintln!("unknown part '{part}' (one of {})", PARTS.join(", "));
        std::process::exit(2);
    };
    let c = if flag("--quick") { &QUICK } else { &FULL };
    match tokio::runtime::Runtime::new() {
        Ok(rt) => rt.block_on(one_part(part, c)),
        Err(e) => {
            eprintln!("cannot start a tokio runtime: {e}");
            std::process::exit(1);
        }
    }
}

/// The parts of the suite, in the order they run.
const PARTS: [&str; 6] = ["P1", "P2", "P3", "P4", "P5", "P6"];

/// The start of a part's output line that carries one row of the table (tab-separated).
const ROW_MARK: &str = "ROW\t";

/// Runs one part in this process and prints its rows: readable, then marked for the parent.
async fn one_part(part: &'static str, c: &Counts) {
    let rows = match part {
        "P1" => part_p1(c).await,
        "P2" => part_p2(c).await,
        "P3" => part_p3(c).await,
        "P4" => part_p4(c).await,
        "P5" => part_p5(c).await,
        _ => part_p6(c).await,
    };
    print_rows(&rows);
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    for r in &rows {
        println!(
            "{ROW_MARK}{}\t{}\t{}",
            clean(&r.what),
            clean(&r.figure),
            clean(&r.target)
        );
    }
}

/// Runs `part` in a child process of this binary (`--part`), so that no part measures in a
/// process an earlier one changed (the heap left by P1's million-event prefill, its threads);
/// echoes the child's output and returns its rows.
fn part_in_child(part: &'static str, quick: bool) -> Vec<Row> {
    let what = format!("{part} in a child process");
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return failed(part, &what, format!("cannot find this binary: {e}")),
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--part", part]);
    if quick {
        cmd.arg("--quick");
    }
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => return failed(part, &what, format!("cannot start the child: {e}")),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    for line in stdout.lines() {
        match line.strip_prefix(ROW_MARK) {
            Some(fields) => {
                if let [what, figure, target] = fields.splitn(3, '\t').collect::<Vec<_>>()[..] {
                    rows.push(Row::new(part, what, figure, target));
                }
            }
            None => println!("{line}"),
        }
    }
    if rows.is_empty() || !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        rows.extend(failed(
            part,
            &what,
            format!("the child ended with {}: {}", out.status, tail.join(" / ")),
        ));
    }
    rows
}

fn suite() {
    let quick = flag("--quick");
    let started = Instant::now();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "flowwarden-rs benchmark suite{} ({cores} cores; each part in a process of its own){}",
        if quick { ", --quick" } else { "" },
        if cfg!(debug_assertions) {
            "; DEBUG BUILD: the figures mean nothing, use --release"
        } else {
            ""
        }
    );
    let mut rows = Vec::new();
    for part in PARTS {
        let t = Instant::now();
        rows.extend(part_in_child(part, quick));
        println!("({part} took {:.1?})", t.elapsed());
    }
    println!();
    print_table(&rows);
    println!();
    println!("suite took {:.1?}", started.elapsed());
}
