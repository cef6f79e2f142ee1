//! Checkpoint writes behind the stream: a busy stream does not wait for the store between two
//! events, at most one write is in flight, every write carries only the settled prefix, and a
//! refused or fenced write behind the stream is handled like one in line.

mod support;

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use flowwarden::port::{Checkpoint, CheckpointStore, Fence, StoreError, StoreErrorKind};
use flowwarden::{Backend, HaltReason, MemoryBackend};
use support::*;
use tokio::time::Instant;

/// What a write-behind test's store does with the `n`th write (from 1).
type Answer = dyn Fn(u32) -> Option<StoreErrorKind> + Send + Sync;

/// The in-memory backend's checkpoint store, each write taking `delay` (virtual time) and
/// answering as `answer` says; it records how many writes overlap and what each one carried,
/// next to how many events the handler had finished when the write started.
struct SlowStore {
    inner: MemoryBackend,
    delay: Duration,
    answer: Box<Answer>,
    handled: Arc<AtomicUsize>,
    writes: AtomicU32,
    in_flight: AtomicU32,
    max_in_flight: AtomicU32,
    /// Per write: (the `_data` of its lastProcessed token, events handled when it started).
    carried: Mutex<Vec<(Option<String>, usize)>>,
}

#[async_trait]
impl CheckpointStore for SlowStore {
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.inner.load(stream).await
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let token = checkpoint.last_processed.as_ref().and_then(|p| {
            p.token
                .as_document()
                .get_str("_data")
                .ok()
                .map(str::to_owned)
        });
        self.carried
            .lock()
            .unwrap()
            .push((token, self.handled.load(Ordering::SeqCst)));
        tokio::time::sleep(self.delay).await;
        let result = match (self.answer)(n) {
            Some(kind) => Err(StoreError::new(kind, "refused by the test")),
            None => self.inner.save(checkpoint).await,
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }

    async fn claim(&self, key: &str, fence: &Fence) -> Result<(), StoreError> {
        self.inner.claim(key, fence).await
    }
}

/// A probe that counts the events it finished in `handled`.
fn counting_probe(handled: Arc<AtomicUsize>) -> Probe {
    use futures::FutureExt;
    Probe::new(move |_ctx| {
        let handled = handled.clone();
        async move {
            handled.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        .boxed()
    })
}

async fn run_slow(
    name: &'static str,
    delay: Duration,
    answer: impl Fn(u32) -> Option<StoreErrorKind> + Send + Sync + 'static,
    save_interval_secs: u64,
) -> (
    MemoryBackend,
    Arc<SlowStore>,
    Arc<AtomicUsize>,
    flowwarden::Runtime,
) {
    init_logs();
    let memory = MemoryBackend::new();
    let handled = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(SlowStore {
        inner: memory.clone(),
        delay,
        answer: Box::new(answer),
        handled: handled.clone(),
        writes: AtomicU32::new(0),
        in_flight: AtomicU32::new(0),
        max_in_flight: AtomicU32::new(0),
        carried: Mutex::new(Vec::new()),
    });
    let mut backend: Backend = memory.clone().into();
    backend.checkpoints = store.clone();
    let probe = counting_probe(handled.clone());
    let d = def(name, |d| {
        d.checkpoint.save_every_n = 1;
        d.checkpoint.save_interval_secs = save_interval_secs;
    });
    let rt = flowwarden::builder()
        .discover(false)
        .any_stream(flowwarden::AnyStream::with_definition(probe, d))
        .backend(backend)
        .seed(7)
        .max_await(Duration::from_millis(200))
        .shutdown_timeout(Duration::from_secs(5))
        .start()
        .await
        .expect("runtime starts");
    wait_status(&rt, name, |s| s.state != flowwarden::StreamState::Starting).await;
    (memory, store, handled, rt)
}

/// `save_every_n = 1` and a store that takes 100 ms a write: 50 events are handled while the
/// first writes are in flight (in line, they would take 5 s), the writes never overlap, each
/// carries no more than what was handled when it started, they only move forward, and the stop
/// stores the last event.
#[tokio::test(start_paused = true)]
async fn a_busy_stream_does_not_wait_for_its_checkpoint_writes() {
    let (memory, store, handled, rt) =
        run_slow("behind", Duration::from_millis(100), |_| None, 60).await;
    let t = Instant::now();
    insert_ids(&memory, 1..=50);
    wait_until("50 handled", || handled.load(Ordering::SeqCst) == 50).await;
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "50 events took {took:?} of virtual time: the stream waited for its writes"
    );
    let started_by_then = store.writes.load(Ordering::SeqCst);
    assert!(
        started_by_then < 50,
        "{started_by_then} writes started for 50 events: a save due while one is in flight must wait for it"
    );
    rt.shutdown().await;
    assert_eq!(
        store.max_in_flight.load(Ordering::SeqCst),
        1,
        "two checkpoint writes overlapped"
    );
    let carried = store.carried.lock().unwrap().clone();
    let mut last = 0u64;
    for (token, handled_then) in &carried {
        let seq = token
            .as_deref()
            .map(|t| u64::from_str_radix(t, 16).expect("a memory token"))
            .unwrap_or(0);
        assert!(
            seq as usize <= *handled_then,
            "a write carried position {seq} when only {handled_then} events were handled: {carried:?}"
        );
        assert!(seq >= last, "the checkpoint moved back: {carried:?}");
        last = seq;
    }
    let (_, processed) = stored_tokens(&memory, "behind");
    assert_eq!(processed.as_deref(), Some(token_of(50).as_str()));
}

/// A write behind the stream that the store refuses is counted, and what it carried is written
/// again: by the next write, here the heartbeat's once the stream is idle.
#[tokio::test(start_paused = true)]
async fn a_refused_write_behind_the_stream_is_written_again() {
    let (memory, store, handled, rt) = run_slow(
        "behind-refused",
        Duration::from_millis(100),
        |n| (n == 2).then_some(StoreErrorKind::Unavailable),
        1,
    )
    .await;
    insert_ids(&memory, 1..=10);
    wait_until("10 handled", || handled.load(Ordering::SeqCst) == 10).await;
    let st = wait_status(&rt, "behind-refused", |s| {
        s.counters.checkpoint_failures >= 1
            && stored_tokens(&memory, "behind-refused").1.as_deref() == Some(token_of(10).as_str())
    })
    .await;
    assert!(st.halt.is_none(), "{:?}", st.halt);
    assert!(store.writes.load(Ordering::SeqCst) >= 2);
    rt.shutdown().await;
}

/// A write behind the stream that the store refuses as fenced halts the stream, as one in line
/// does (another instance owns the checkpoint).
#[tokio::test(start_paused = true)]
async fn a_fenced_write_behind_the_stream_halts_it() {
    let (memory, _store, _handled, rt) = run_slow(
        "behind-fenced",
        Duration::from_millis(100),
        |n| (n >= 2).then_some(StoreErrorKind::Fenced),
        60,
    )
    .await;
    insert_ids(&memory, 1..=3);
    let st = wait_status(&rt, "behind-fenced", |s| s.halt.is_some()).await;
    assert_eq!(st.halt.map(|h| h.reason), Some(HaltReason::Fenced));
    rt.shutdown().await;
}

/// A crash while a write runs behind the stream: the write dies with the process (or had
/// landed), the stored checkpoint is no further than what was settled when it started, and the
/// restarted stream handles everything after the stored position again: nothing is skipped.
#[tokio::test(start_paused = true)]
async fn a_crash_with_a_write_in_flight_skips_nothing() {
    let backend = MemoryBackend::new();
    let first = Probe::default();
    let d = def("behind-crash", |d| {
        d.checkpoint.save_every_n = 1;
        d.checkpoint.save_interval_secs = 60;
    });
    let rt = start(&backend, &first, d).await;
    // Every write from now on takes 10 s: the first one due is still in flight when the
    // process dies.
    backend
        .faults()
        .set_checkpoint_save_delay(Some(Duration::from_secs(10)));
    insert_ids(&backend, 1..=10);
    wait_until("10 handled", || first.successes().len() == 10).await;
    rt.handle().crash().await;
    backend.faults().set_checkpoint_save_delay(None);
    let (_, stored) = stored_tokens(&backend, "behind-crash");
    // The write in flight carried event 1 at most (the start position before it).
    let stored_seq = stored
        .as_deref()
        .map(|t| u64::from_str_radix(t, 16).expect("a memory token"))
        .unwrap_or(0);
    assert!(stored_seq <= 1, "stored position {stored_seq}");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        stored_tokens(&backend, "behind-crash").1,
        stored,
        "a write of the crashed process landed after the crash"
    );

    let second = Probe::default();
    let rt = start(&backend, &second, d).await;
    let expected: Vec<i32> = ((stored_seq as i32 + 1)..=10).collect();
    wait_until("the rest handled again", || {
        second.successes().len() == expected.len()
    })
    .await;
    let keys: Vec<i32> = second
        .handled_keys()
        .iter()
        .map(|k| k.as_i32().expect("int key"))
        .collect();
    assert_eq!(
        keys, expected,
        "redelivered from the stored position, in order"
    );
    rt.shutdown().await;
    let (_, processed) = stored_tokens(&backend, "behind-crash");
    assert_eq!(processed.as_deref(), Some(token_of(10).as_str()));
}
