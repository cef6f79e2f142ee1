//! P2: the runtime through the real `mongodb` driver (`flowwarden-rs-mongo`) against the
//! project's wire-level emulator (in-process, `tests/mongo-emulator`; not MongoDB), against a
//! raw `watch()` loop of the driver over the same events. No-op handler.

use std::time::{Duration, Instant};

use bson::{doc, Document};
use flowwarden::{change_stream, checkpoint, AnyStream, ChangeContext, ResumeToken, StreamHandler};
use flowwarden_rs_mongo::{ConnectOptions, MongoBackend};
use mongo_emulator::{Emulator, EmulatorOptions};

use super::{save_start_checkpoint, start_only, with_checkpoint, BenchError};

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

/// The figures of one P2 measurement.
#[derive(Debug, Clone)]
pub struct P2 {
    /// Events read.
    pub events: u64,
    /// `save_every_n` of the runtime.
    pub save_every: u32,
    /// Events per second of the raw `watch()` loop.
    pub raw: f64,
    /// Events per second of the runtime on the backend as `MongoBackend::connect` builds it
    /// by default (no command monitor).
    pub runtime: f64,
    /// Events per second of the runtime on a backend that counts the driver's own resumes
    /// (`ConnectOptions::count_driver_resumes`: a command monitor on the client).
    pub runtime_monitored: f64,
}

impl P2 {
    /// runtime / raw.
    pub fn ratio(&self) -> f64 {
        self.runtime / self.raw
    }

    /// runtime with the command monitor / raw.
    pub fn ratio_monitored(&self) -> f64 {
        self.runtime_monitored / self.raw
    }
}

/// An emulator holding `events` inserts in `bench.p2`, and the token of the position before
/// them. Its oplog keeps the inserts through three runs at `save_every_n = 1`.
pub async fn prefill(events: u64) -> Result<(Emulator, Document), BenchError> {
    let emu = Emulator::start_with(EmulatorOptions {
        // Room for every run's checkpoint writes too: each is an oplog entry, and at
        // `save_every_n = 1` a run writes one per event.
        oplog_capacity: events as usize * 4 + 10_000,
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
    let done = rt
        .handle()
        .wait_for("p2", |s| s.counters.handled >= events)
        .await;
    let elapsed = t.elapsed();
    rt.shutdown().await;
    // The runtime's cursor is dropped at shutdown: wait for the driver's clean-up (see
    // `raw_loop`).
    client.shutdown().await;
    done.map_err(|e| format!("stream vanished: {e}"))?;
    Ok(events as f64 / elapsed.as_secs_f64())
}

/// One emulator with `events` inserts; per `save_every_n`, the raw loop and then the runtime
/// over them (each ratio pairs a runtime run with the raw run just before). A first raw run,
/// not counted, warms up.
pub async fn run(events: u64, save_every: &[u32]) -> Result<Vec<P2>, BenchError> {
    let (emu, start) = prefill(events).await?;
    raw_loop(&emu, &start, events).await?;
    let mut out = Vec::new();
    for &n in save_every {
        let raw = raw_loop(&emu, &start, events).await?;
        let default = runtime(&emu, &start, events, n, false).await?;
        let monitored = runtime(&emu, &start, events, n, true).await?;
        out.push(P2 {
            events,
            save_every: n,
            raw,
            runtime: default,
            runtime_monitored: monitored,
        });
    }
    Ok(out)
}
