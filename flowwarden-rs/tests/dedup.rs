//! The idempotency helper (feature `dedup`): a redelivered event is applied once, a failed
//! effect is retried and applied (never skipped), and skips are counted.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::Bson;
use flowwarden::dedup::Idempotency;
use flowwarden::{HandlerError, MemoryBackend};
use futures::FutureExt;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::*;

fn skipped(snapshotter: &metrics_util::debugging::Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(v) if key.key().name() == flowwarden::dedup::DUPLICATES_SKIPPED => {
                Some(v)
            }
            _ => None,
        })
        .sum()
}

#[test]
fn a_redelivered_event_is_applied_once_and_the_skip_is_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let backend = MemoryBackend::new();
            // No checkpoint between the events and the crash: all three are redelivered.
            let d = def("deduped", |d| {
                d.checkpoint.save_every_n = 1_000;
                d.checkpoint.save_interval_secs = 0;
            });
            let dedup = Idempotency::in_memory(Duration::from_secs(3_600));
            let effects = Arc::new(Mutex::new(Vec::new()));
            let probe = flowwarden_testkit::applying_once(&dedup, &effects);
            let rt = start(&backend, &probe, d).await;
            insert_ids(&backend, [1, 2, 3]);
            wait_until("3 handled", || probe.successes().len() == 3).await;
            rt.handle().crash().await;

            let again = flowwarden_testkit::applying_once(&dedup, &effects);
            let rt = start(&backend, &again, d).await;
            wait_until("3 redelivered and settled", || again.successes().len() == 3).await;
            let st = rt.handle().status("deduped").unwrap();
            rt.shutdown().await;
            assert_eq!(st.counters.received, 3, "the three events came again");
            assert_eq!(
                *effects.lock().unwrap(),
                vec![Bson::Int32(1), Bson::Int32(2), Bson::Int32(3)],
                "each effect applied once"
            );
        });
    });
    assert_eq!(
        skipped(&snapshotter),
        3,
        "the three redeliveries are counted as skipped"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_effect_is_retried_and_applied_not_skipped() {
    let backend = MemoryBackend::new();
    let dedup = Idempotency::in_memory(Duration::from_secs(3_600));
    let effects = Arc::new(Mutex::new(Vec::<Bson>::new()));
    let tries = Arc::new(AtomicU32::new(0));
    let probe = {
        let (dedup, effects, tries) = (dedup.clone(), effects.clone(), tries.clone());
        Probe::new(move |ctx| {
            let (dedup, effects, tries) = (dedup.clone(), effects.clone(), tries.clone());
            async move {
                dedup
                    .once(&ctx, || async {
                        if tries.fetch_add(1, Ordering::SeqCst) == 0 {
                            return Err(HandlerError::msg("the mail server is down"));
                        }
                        effects.lock().unwrap().push(Bson::Int32(1));
                        Ok(())
                    })
                    .await
            }
            .boxed()
        })
    };
    let rt = start(&backend, &probe, def("retried-effect", |_| {})).await;
    insert_ids(&backend, [1]);
    wait_until("1 handled", || probe.successes().len() == 1).await;
    rt.shutdown().await;
    assert_eq!(tries.load(Ordering::SeqCst), 2, "failed once, then applied");
    assert_eq!(*effects.lock().unwrap(), vec![Bson::Int32(1)]);
}
