//! A source may hand its events over still encoded (`SourceItem::Encoded`, as the MongoDB
//! backend does): the engine decodes them on the stream's task and handles them exactly like
//! decoded ones, and bytes that are not a BSON document halt the stream without checkpointing
//! past them.

mod support;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bson::RawDocumentBuf;
use flowwarden::port::{
    ChangeCursor, ChangeSource, ReadMode, SourceError, SourceItem, StartAt, WatchSpec,
};
use flowwarden::{Backend, HaltReason, MemoryBackend};
use futures::FutureExt;
use support::*;

/// The in-memory source, with every event handed over encoded and read in `mode`; the event
/// of the document `_id: poison` is replaced by bytes that are not a valid BSON document.
struct Encoding {
    inner: Arc<dyn ChangeSource>,
    mode: ReadMode,
    poison: Option<i32>,
}

struct EncodingCursor {
    inner: Box<dyn ChangeCursor>,
    mode: ReadMode,
    poison: Option<i32>,
}

/// `{s: <a string whose only byte is 0xFF>}`: well framed, but not valid UTF-8, so not a
/// valid BSON document.
fn not_bson() -> RawDocumentBuf {
    let bytes = vec![
        14, 0, 0, 0, // the document's length
        0x02, b's', 0, // a string named "s"
        2, 0, 0, 0, 0xFF, 0, // of one byte (and its terminator)
        0, // the document's terminator
    ];
    RawDocumentBuf::from_bytes(bytes).expect("well framed")
}

#[async_trait]
impl ChangeSource for Encoding {
    async fn open(
        &self,
        spec: &WatchSpec,
        at: StartAt,
    ) -> Result<Box<dyn ChangeCursor>, SourceError> {
        let inner = self.inner.open(spec, at).await?;
        Ok(Box::new(EncodingCursor {
            inner,
            mode: self.mode,
            poison: self.poison,
        }))
    }

    fn describe(&self) -> String {
        format!("encoding {}", self.inner.describe())
    }
}

#[async_trait]
impl ChangeCursor for EncodingCursor {
    async fn next(&mut self) -> Result<Option<SourceItem>, SourceError> {
        Ok(match self.inner.next().await? {
            Some(SourceItem::Event(raw)) => {
                let key = raw
                    .get_document("documentKey")
                    .ok()
                    .and_then(|k| k.get_i32("_id").ok());
                let bytes = if key.is_some() && key == self.poison {
                    not_bson()
                } else {
                    RawDocumentBuf::from_document(&raw).expect("an event encodes")
                };
                Some(SourceItem::Encoded(bytes))
            }
            other => other,
        })
    }

    fn initial_position(&self) -> Option<flowwarden::ResumeToken> {
        self.inner.initial_position()
    }

    fn read_mode(&self) -> ReadMode {
        self.mode
    }
}

fn encoding(backend: &MemoryBackend, mode: ReadMode, poison: Option<i32>) -> Backend {
    let mut b: Backend = backend.clone().into();
    b.source = Arc::new(Encoding {
        inner: b.source.clone(),
        mode,
        poison,
    });
    b
}

#[tokio::test]
async fn encoded_events_are_handled_and_checkpointed_like_decoded_ones() {
    for mode in [ReadMode::ReadAhead, ReadMode::InProcess] {
        let backend = MemoryBackend::new();
        let documents = Arc::new(Mutex::new(Vec::new()));
        let seen = documents.clone();
        let probe = Probe::new(move |ctx| {
            let n = ctx.document().and_then(|d| d.get_i32("n").ok());
            seen.lock().expect("not poisoned").push(n);
            async { Ok(()) }.boxed()
        });
        let wrapped = encoding(&backend, mode, None);
        let rt = start_with(&backend, &probe, def("encoded", |_| {}), |b| {
            b.backend(wrapped)
        })
        .await;
        insert_ids(&backend, 1..=50);
        wait_status(&rt, "encoded", |s| s.counters.handled >= 50).await;
        rt.shutdown().await;
        let keys: Vec<i32> = probe
            .handled_keys()
            .iter()
            .filter_map(|k| k.as_i32())
            .collect();
        assert_eq!(keys, (1..=50).collect::<Vec<_>>(), "{mode:?}");
        let documents = documents.lock().expect("not poisoned").clone();
        assert_eq!(
            documents,
            (1..=50).map(Some).collect::<Vec<_>>(),
            "{mode:?}: every handler saw its event's full document, decoded"
        );
        let (_, processed) = stored_tokens(&backend, "encoded");
        assert_eq!(processed, probe.token_for(50), "{mode:?}");
    }
}

#[tokio::test]
async fn an_encoded_event_that_is_not_bson_halts_the_stream_before_it() {
    for mode in [ReadMode::ReadAhead, ReadMode::InProcess] {
        let backend = MemoryBackend::new();
        let probe = Probe::default();
        let wrapped = encoding(&backend, mode, Some(3));
        let rt = start_with(&backend, &probe, def("garbled", |_| {}), |b| {
            b.backend(wrapped)
        })
        .await;
        insert_ids(&backend, 1..=5);
        let st = wait_status(&rt, "garbled", |s| s.halt.is_some()).await;
        rt.shutdown().await;
        let halt = st.halt.expect("halted");
        assert_eq!(halt.reason, HaltReason::SourceFatal, "{mode:?}");
        assert_eq!(halt.runbook, "docs/runbooks/source-fatal.md");
        assert!(
            halt.message.contains("'garbled'") && halt.message.contains("not valid BSON"),
            "{mode:?}: {}",
            halt.message
        );
        let keys: Vec<i32> = probe
            .handled_keys()
            .iter()
            .filter_map(|k| k.as_i32())
            .collect();
        assert_eq!(
            keys,
            [1, 2],
            "{mode:?}: nothing at or after the garbled event ran"
        );
        let (_, processed) = stored_tokens(&backend, "garbled");
        assert_eq!(
            processed,
            probe.token_for(2),
            "{mode:?}: the checkpoint stops before the garbled event"
        );
    }
}
