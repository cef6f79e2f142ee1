//! P2: the runtime through the real `mongodb` driver (`flowwarden-rs-mongo`) against the
//! project's wire-level emulator (in-process, `tests/mongo-emulator`; not MongoDB), against a
//! raw `watch()` loop of the driver over the same events. No-op handler.

use std::time::{Duration, Instant};

use bson::{doc, Document};
use flowwarden::{change_stream, checkpoint, AnyStream, ChangeContext, ResumeToken, StreamHandler};
use flowwarden_rs_mongo::{ConnectOptions, MongoBackend};
use mongo_emulator::{Emulator, EmulatorOptions};

use super::{
    median_by, save_start_checkpoint, start_only, two_decimals, wait_handled, with_checkpoint,
    BenchError,
};

/// The database P2 works in.
pub const DB: &str = "bench";

/// The no-op stream of P2.
#[derive(Default)]
pub struct MongoNoop;

#[change_stream(name = "p2", collection = "p2")]
#[checkpoint(save_every_n = 1, save_interval_secs = 5)]
impl MongoNoop {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

/// One raw run and the two runtime runs right after it.
#[derive(Debug, Clone, Copy)]
pub struct Pair {
    /// Events per second of the raw `watch()` loop.
    pub raw: f64,
    /// Events per second of the runtime on the backend as `MongoBackend::connect` builds it
    /// by default (no command monitor).
    pub runtime: f64,
    /// Events per second of the runtime on a backend that counts the driver's own resumes
    /// (`ConnectOptions::count_driver_resumes`: a command monitor on the client).
    pub runtime_monitored: f64,
}

impl Pair {
    /// runtime / raw.
    pub fn ratio(&self) -> f64 {
        self.runtime / self.raw
    }

    /// runtime with the command monitor / raw.
    pub fn ratio_monitored(&self) -> f64 {
        self.runtime_monitored / self.raw
    }
}

/// The figures of one P2 measurement: `pairs` interleaved runs, the figure being the pair of
/// median ratio (as P1's).
#[derive(Debug, Clone)]
pub struct P2 {
    /// Events read.
    pub events: u64,
    /// `save_every_n` of the runtime.
    pub save_every: u32,
    /// Every pair, in the order they ran.
    pub pairs: Vec<Pair>,
}

impl P2 {
    /// The pair of median ratio (the lower middle one of an even count; no pair measures
    /// nothing, a ratio of 0).
    pub fn median(&self) -> Pair {
        median_by(&self.pairs, Pair::ratio).unwrap_or(Pair {
            raw: 1.0,
            runtime: 0.0,
            runtime_monitored: 0.0,
        })
    }

    /// The median ratio, runtime / raw.
    pub fn ratio(&self) -> f64 {
        self.median().ratio()
    }

    /// The median ratio with the command monitor (over the same pairs, taken by that ratio).
    pub fn ratio_monitored(&self) -> f64 {
        median_by(&self.pairs, Pair::ratio_monitored).map_or(0.0, |p| p.ratio_monitored())
    }

    /// Every pair's ratio, in the order they ran.
    pub fn ratios(&self) -> String {
        two_decimals(self.pairs.iter().map(Pair::ratio))
    }
}

/// An emulator holding `events` inserts in `bench.p2`, and the token of the position before
/// them. Its oplog keeps the inserts through `runs` runtime runs at `save_every_n = 1`.
pub async fn prefill(events: u64, runs: u32) -> Result<(Emulator, Document), BenchError> {
    let emu = Emulator::start_with(EmulatorOptions {
        // Room for every run's checkpoint writes too: each is an oplog entry, and at
        // `save_every_n = 1` a run writes at most one per event.
        oplog_capacity: events as usize * (runs as usize + 1) + 10_000,
        ..EmulatorOptions::default()
    })
    .await
    .map_err(|e| format!("the emulator does not start: {e}"))?;
    let start = emu.head_resume_token();
    for i in 0..events as i64 {
        emu.insert_direct(DB, "p2", &doc! {"_id": i, "sku": "A-1", "qty": 1})
            .map_err(|e| format!("prefill failed: {e}"))?;
    }
    Ok((emu, start))
}

/// Events per second of a raw `watch()` loop of the driver reading `events` events after
/// `start`, with the runtime's batch size and raw documents (as the backend reads them).
pub async fn raw_loop(emu: &Emulator, start: &Document, events: u64) -> Result<f64, BenchError> {
    let client = mongodb::Client::with_uri_str(emu.uri())
        .await
        .map_err(|e| e.to_string())?;
    let coll = client.database(DB).collection::<Document>("p2");
    let token: mongodb::change_stream::event::ResumeToken =
        bson::from_bson(bson::Bson::Document(start.clone())).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut stream = coll
        .watch()
        .resume_after(token)
        .batch_size(256)
        .max_await_time(Duration::from_millis(1000))
        .await
        .map_err(|e| format!("watch failed: {e}"))?
        .with_type::<Document>();
    let mut seen = 0u64;
    while seen < events {
        match stream.next_if_any().await {
            Ok(Some(ev)) => {
                std::hint::black_box(&ev);
                seen += 1;
            }
            Ok(None) => {}
            Err(e) => return Err(format!("read failed: {e}")),
        }
    }
    let rate = events as f64 / t.elapsed().as_secs_f64();
    // Dropping a live change stream spawns the driver's kill-cursors task; shutting the client
    // down waits for it (left running, it panics when the Tokio runtime ends under it).
    drop(stream);
    client.shutdown().await;
    Ok(rate)
}

/// Events per second of the runtime on the MongoDB backend handling `events` events after
/// `start` with the no-op handler and `save_every_n = save_every` (checkpoints are written to
/// the emulator's `_fw_checkpoints`). `monitored`: the backend counts the driver's own resumes
/// (`ConnectOptions::count_driver_resumes`); otherwise it is `MongoBackend::connect`'s default.
pub async fn runtime(
    emu: &Emulator,
    start: &Document,
    events: u64,
    save_every: u32,
    monitored: bool,
) -> Result<f64, BenchError> {
    let options = ConnectOptions {
        count_driver_resumes: monitored,
    };
    let backend = MongoBackend::connect_with(&emu.uri(), DB, options)
        .await
        .map_err(|e| e.join("; "))?;
    let client = backend.client().clone();
    let backend: flowwarden::Backend = backend.into();
    save_start_checkpoint(&backend, "p2", ResumeToken::from_document(start.clone())).await?;
    let def = with_checkpoint(<MongoNoop as StreamHandler>::definition(), |c| {
        c.save_every_n = save_every
    });
    let t = Instant::now();
    let rt = start_only(AnyStream::with_definition(MongoNoop, def), backend).await?;
    let done = wait_handled(&rt, "p2", events).await;
    let elapsed = t.elapsed();
    rt.shutdown().await;
    // The runtime's cursor is dropped at shutdown: wait for the driver's clean-up (see
    // `raw_loop`).
    client.shutdown().await;
    done?;
    Ok(events as f64 / elapsed.as_secs_f64())
}

/// One emulator with `events` inserts; per `save_every_n` in `save_every`, `pairs` times (at
/// least once) the raw loop, then the runtime without and with the command monitor over them:
/// each pair's ratios take the raw run just before, so both run on the machine as it is at
/// that moment. A first raw run, not counted, warms up.
///
/// Everything runs on a worker thread of the Tokio runtime, as the runtime's stream does: on
/// the thread of `#[tokio::main]` (outside the worker pool) the raw loop ran 10 to 15% slower
/// on the build machine, a baseline that would flatter the runtime.
pub async fn run(events: u64, save_every: &[u32], pairs: u32) -> Result<Vec<P2>, BenchError> {
    let save_every = save_every.to_vec();
    tokio::spawn(measure(events, save_every, pairs.max(1)))
        .await
        .map_err(|e| format!("the measurement panicked: {e}"))?
}

async fn measure(events: u64, save_every: Vec<u32>, pairs: u32) -> Result<Vec<P2>, BenchError> {
    let runs = save_every.len() as u32 * pairs * 2;
    let (emu, start) = prefill(events, runs).await?;
    raw_loop(&emu, &start, events).await?;
    let mut out = Vec::new();
    for n in save_every {
        let mut measured = Vec::new();
        for _ in 0..pairs {
            let raw = raw_loop(&emu, &start, events).await?;
            let runtime_default = runtime(&emu, &start, events, n, false).await?;
            let runtime_monitored = runtime(&emu, &start, events, n, true).await?;
            measured.push(Pair {
                raw,
                runtime: runtime_default,
                runtime_monitored,
            });
        }
        out.push(P2 {
            events,
            save_every: n,
            pairs: measured,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_figure_is_the_median_of_its_own_ratio_over_the_pairs() {
        let pair = |r: f64, m: f64| Pair {
            raw: 100.0,
            runtime: 100.0 * r,
            runtime_monitored: 100.0 * m,
        };
        let f = P2 {
            events: 10,
            save_every: 100,
            pairs: vec![pair(0.9, 0.5), pair(0.7, 0.7), pair(0.8, 0.6)],
        };
        assert!((f.ratio() - 0.8).abs() < 1e-9);
        assert!((f.ratio_monitored() - 0.6).abs() < 1e-9);
        assert_eq!(f.ratios(), "0.90, 0.70, 0.80");
        let none = P2 { pairs: vec![], ..f };
        assert_eq!(none.ratio(), 0.0);
    }
}
