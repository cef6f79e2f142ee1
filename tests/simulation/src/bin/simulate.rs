//! Long simulation runs: `simulate --seeds N --from SEED [--bug] [--sabotage NAME]
//! [--threads T] [--multi-only] [--snapshot-only] [--transactional-only]`; `simulate --replay SEED [--bug] [--sabotage NAME]` prints one
//! seed's full trace; `simulate --shrink SEED [..]` prints its shrunk schedule and full trace.

use std::process::ExitCode;
use std::time::Instant;

use flowwarden_simulation::{run_seed, shrink, Sabotage, Schedule, SimOptions, Stats};

/// A command-line argument that could not be used.
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("{0} needs a value")]
    Missing(String),
    #[error("{flag}: '{value}' is not a number")]
    NotANumber { flag: String, value: String },
    #[error("unknown argument '{0}' (use --seeds N --from SEED [--threads T] [--bug] [--bug-highest-completed] [--bug-unkeyed] [--bug-snapshot-start-after-scan] [--bug-snapshot-rescan-from-zero] [--bug-checkpoint-outside-transaction] [--bug-no-freeze] [--sabotage NAME] [--multi-only] [--snapshot-only] [--transactional-only] | --replay SEED [..] | --shrink SEED [..])")]
    Unknown(String),
    #[error("unknown sabotage '{0}' (one of: unfenced-writes, forged-epoch, lying-renewals, no-takeover, oldest-becomes-now, oldest-unknown-as-transient, forget-invalidate, guard-for-everyone)")]
    Sabotage(String),
}

struct Args {
    seeds: u64,
    from: u64,
    threads: u64,
    replay: Option<u64>,
    shrink: Option<u64>,
    multi_only: bool,
    snapshot_only: bool,
    transactional_only: bool,
    opts: SimOptions,
}

fn parse() -> Result<Args, ArgError> {
    let mut a = Args {
        seeds: 1_000,
        from: 0,
        threads: 1,
        replay: None,
        shrink: None,
        multi_only: false,
        snapshot_only: false,
        transactional_only: false,
        opts: SimOptions::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = |flag: &str| -> Result<u64, ArgError> {
            let v = it.next().ok_or_else(|| ArgError::Missing(flag.into()))?;
            v.parse().map_err(|_| ArgError::NotANumber {
                flag: flag.into(),
                value: v,
            })
        };
        match flag.as_str() {
            "--seeds" => a.seeds = num("--seeds")?,
            "--from" => a.from = num("--from")?,
            "--threads" => a.threads = num("--threads")?.max(1),
            "--replay" => a.replay = Some(num("--replay")?),
            "--shrink" => a.shrink = Some(num("--shrink")?),
            "--bug" => a.opts.checkpoint_on_receipt = true,
            "--bug-highest-completed" => a.opts.checkpoint_highest_completed = true,
            "--bug-unkeyed" => a.opts.unkeyed_concurrency = true,
            "--bug-snapshot-start-after-scan" => a.opts.snapshot_start_after_scan = true,
            "--bug-snapshot-rescan-from-zero" => a.opts.snapshot_rescan_from_zero = true,
            "--bug-checkpoint-outside-transaction" => a.opts.checkpoint_outside_transaction = true,
            "--bug-no-freeze" => a.opts.no_freeze_after_unknown_outcome = true,
            "--multi-only" => a.multi_only = true,
            "--transactional-only" => a.transactional_only = true,
            "--snapshot-only" => a.snapshot_only = true,
            "--sabotage" => {
                let v = it
                    .next()
                    .ok_or_else(|| ArgError::Missing("--sabotage".into()))?;
                a.opts.sabotage = Some(Sabotage::parse(&v).ok_or(ArgError::Sabotage(v))?);
            }
            other => return Err(ArgError::Unknown(other.into())),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("simulate: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = args.replay {
        return match run_seed(seed, &args.opts) {
            Ok(out) => {
                println!("{}", out.trace_text());
                for v in &out.violations {
                    println!("{v}");
                }
                if out.violations.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("simulate: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(seed) = args.shrink {
        let schedule = Schedule::generate(seed);
        return match shrink(&schedule, &args.opts, 300) {
            Ok((small, out)) => {
                println!(
                    "seed {seed}, shrunk from {} to {} steps:\n{}",
                    schedule.steps.len(),
                    small.steps.len(),
                    out.report(&small, 0)
                );
                println!("full trace:\n{}", out.trace_text());
                if out.violations.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("simulate: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let started = Instant::now();
    let started = &started;
    let multi_only = args.multi_only;
    let snapshot_only = args.snapshot_only;
    let transactional_only = args.transactional_only;
    let opts = args.opts;
    let threads = args.threads;
    let results: Vec<(Stats, Vec<u64>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut stats = Stats::default();
                    let mut failing = Vec::new();
                    let mut seed = args.from + t;
                    while seed < args.from + args.seeds {
                        let skip = (multi_only || snapshot_only || transactional_only) && {
                            let s = Schedule::generate(seed);
                            (multi_only && !s.is_multi_instance())
                                || (snapshot_only && s.settings.snapshot.is_none())
                                || (transactional_only && !s.is_transactional())
                        };
                        if skip {
                            seed += threads;
                            continue;
                        }
                        match run_seed(seed, &opts) {
                            Ok(out) => {
                                if !out.violations.is_empty() {
                                    failing.push(seed);
                                }
                                stats.merge(&out.stats);
                            }
                            Err(e) => {
                                eprintln!("seed {seed}: {e}");
                                failing.push(seed);
                            }
                        }
                        seed += threads;
                        if t == 0 && (seed - args.from) % 50_000 < threads {
                            eprintln!(
                                "  ... {} seeds, {:.0} s, {} failing so far (thread 0)",
                                seed - args.from,
                                started.elapsed().as_secs_f64(),
                                failing.len()
                            );
                        }
                    }
                    (stats, failing)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread"))
            .collect()
    });
    let mut stats = Stats::default();
    let mut failing = Vec::new();
    for (s, f) in results {
        stats.merge(&s);
        failing.extend(f);
    }
    failing.sort_unstable();
    let elapsed = started.elapsed();
    println!(
        "seeds {}..{} ({} thread(s)) in {:.1} s",
        args.from,
        args.from + args.seeds,
        threads,
        elapsed.as_secs_f64()
    );
    println!("{stats}");
    if failing.is_empty() {
        return ExitCode::SUCCESS;
    }
    println!(
        "failing seeds ({}): {:?}",
        failing.len(),
        &failing[..failing.len().min(50)]
    );
    let first = failing[0];
    let schedule = Schedule::generate(first);
    match shrink(&schedule, &opts, 300) {
        Ok((small, out)) => {
            println!(
                "\nfirst failing seed {first}, shrunk from {} to {} steps:",
                schedule.steps.len(),
                small.steps.len()
            );
            println!("{}", out.report(&small, 40));
        }
        Err(e) => eprintln!("shrinking seed {first} failed: {e}"),
    }
    ExitCode::FAILURE
}
