//! P1: the runtime's overhead. A no-op handler over a prefilled in-memory backend, against a
//! bare loop over the same cursor, at a given `save_every_n`.

use std::time::Instant;

use bson::doc;
use flowwarden::port::{ChangeSource, SourceItem, StartAt};
use flowwarden::{
    change_stream, checkpoint, AnyStream, ChangeContext, MemoryBackend, StreamHandler,
};

use super::{
    bare_spec, median_by, memory_token, save_start_checkpoint, start_only, two_decimals,
    wait_handled, with_checkpoint, BenchError,
};

/// The no-op stream of P1.
#[derive(Default)]
pub struct Noop;

#[change_stream(name = "p1", collection = "p1")]
#[checkpoint(save_every_n = 1, save_interval_secs = 5)]
impl Noop {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

/// A backend with `changes` inserts in collection `p1` (positions 1..=changes).
pub fn prefill(changes: u64) -> Result<MemoryBackend, BenchError> {
    let backend = MemoryBackend::with_retention(changes as usize + 10);
    let coll = backend.collection("p1");
    for i in 0..changes as i64 {
        coll.insert_one(doc! {"_id": i, "sku": "A-1", "qty": 1})
            .map_err(|e| format!("prefill failed: {e}"))?;
    }
    Ok(backend)
}

/// Events per second of a bare loop reading the `changes` events of `backend` from the start.
pub async fn bare_loop(backend: &MemoryBackend, changes: u64) -> Result<f64, BenchError> {
    let t = Instant::now();
    let mut cursor = backend
        .open(&bare_spec("p1"), StartAt::OldestAvailable)
        .await
        .map_err(|e| format!("open failed: {e}"))?;
    let mut seen = 0u64;
    while seen < changes {
        match cursor.next().await {
            Ok(Some(SourceItem::Event(ev))) => {
                std::hint::black_box(&ev);
                seen += 1;
            }
            Ok(_) => {}
            Err(e) => return Err(format!("read failed: {e}")),
        }
    }
    Ok(changes as f64 / t.elapsed().as_secs_f64())
}

/// Events per second of the runtime handling the `changes` events of `backend` from the start
/// with the no-op handler and `save_every_n = save_every`.
pub async fn runtime(
    backend: &MemoryBackend,
    changes: u64,
    save_every: u32,
) -> Result<f64, BenchError> {
    let def = with_checkpoint(<Noop as StreamHandler>::definition(), |c| {
        c.save_every_n = save_every
    });
    let stores: flowwarden::Backend = backend.clone().into();
    // Resume after position 0 (before the first entry), where the bare loop starts.
    save_start_checkpoint(&stores, "p1", memory_token(0)).await?;
    let t = Instant::now();
    let rt = start_only(AnyStream::with_definition(Noop, def), stores).await?;
    let done = wait_handled(&rt, "p1", changes).await;
    let elapsed = t.elapsed();
    rt.shutdown().await;
    done?;
    Ok(changes as f64 / elapsed.as_secs_f64())
}

/// One bare run and the runtime run right after it.
#[derive(Debug, Clone, Copy)]
pub struct Pair {
    /// Events per second of the bare loop.
    pub bare: f64,
    /// Events per second of the runtime.
    pub runtime: f64,
}

impl Pair {
    /// runtime / bare.
    pub fn ratio(&self) -> f64 {
        self.runtime / self.bare
    }
}

/// The figures of one P1 measurement: `pairs` interleaved runs, the figure being the pair of
/// median ratio (a shared machine moves a single pair by about 0.05 either way).
#[derive(Debug, Clone)]
pub struct P1 {
    /// `save_every_n` of the runtime.
    pub save_every: u32,
    /// Every pair, in the order they ran.
    pub pairs: Vec<Pair>,
}

impl P1 {
    /// The pair of median ratio (the lower middle one of an even count; no pair measures
    /// nothing, a ratio of 0).
    pub fn median(&self) -> Pair {
        median_by(&self.pairs, Pair::ratio).unwrap_or(Pair {
            bare: 1.0,
            runtime: 0.0,
        })
    }

    /// The median ratio, runtime / bare.
    pub fn ratio(&self) -> f64 {
        self.median().ratio()
    }

    /// Every pair's ratio, in the order they ran (`0.81, 0.79, 0.84`).
    pub fn ratios(&self) -> String {
        two_decimals(self.pairs.iter().map(Pair::ratio))
    }
}

/// Measures `pairs` times (at least once) the bare loop, then the runtime, over `backend`'s
/// `changes` events, for each `save_every_n` in `save_every`: each pair is a runtime run with
/// the bare run just before, so both run on the machine as it is at that moment. A first bare
/// run, not counted, warms up (the first pass over a fresh prefill is slower).
///
/// Everything runs on a worker thread of the Tokio runtime, as the runtime's stream does (and
/// as P2 does): a thread outside the worker pool allocates from glibc's main arena, which
/// made the bare loop 3 to 4% faster than on a worker on the AMD build machine, an advantage
/// of the thread, not of the loop. [`run_here`] measures on the caller's thread instead.
pub async fn run(
    backend: &MemoryBackend,
    changes: u64,
    save_every: &[u32],
    pairs: u32,
) -> Result<Vec<P1>, BenchError> {
    let (backend, save_every) = (backend.clone(), save_every.to_vec());
    tokio::spawn(async move { run_here(&backend, changes, &save_every, pairs).await })
        .await
        .map_err(|e| format!("the measurement panicked: {e}"))?
}

/// [`run`] on the caller's thread: under `#[tokio::main]`, the bare loop then runs on the
/// main thread, outside the worker pool, while the runtime's stream still runs on a worker.
pub async fn run_here(
    backend: &MemoryBackend,
    changes: u64,
    save_every: &[u32],
    pairs: u32,
) -> Result<Vec<P1>, BenchError> {
    bare_loop(backend, changes).await?;
    let mut out = Vec::new();
    for &n in save_every {
        let mut measured = Vec::new();
        for _ in 0..pairs.max(1) {
            let bare = bare_loop(backend, changes).await?;
            let runtime = runtime(backend, changes, n).await?;
            measured.push(Pair { bare, runtime });
        }
        out.push(P1 {
            save_every: n,
            pairs: measured,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p1(ratios: &[f64]) -> P1 {
        P1 {
            save_every: 100,
            pairs: ratios
                .iter()
                .map(|r| Pair {
                    bare: 100.0,
                    runtime: 100.0 * r,
                })
                .collect(),
        }
    }

    #[test]
    fn the_figure_is_the_median_pair_and_the_lower_middle_one_of_an_even_count() {
        let odd = p1(&[0.9, 0.7, 0.8]);
        assert!((odd.ratio() - 0.8).abs() < 1e-9);
        assert_eq!(odd.ratios(), "0.90, 0.70, 0.80");
        assert!((p1(&[0.9, 0.7]).ratio() - 0.7).abs() < 1e-9);
        assert!((p1(&[0.85]).ratio() - 0.85).abs() < 1e-9);
    }
}
