//! Helpers of the initial-snapshot tests (`tests/snapshot*.rs`): a log of what the handler
//! saw, a probe that keeps it, and the definition of a `start_position = Snapshot` stream.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{Bson, Document};
use flowwarden::{ChangeContext, StartPosition, StreamDefinition};
use futures::FutureExt;

use super::{def, Probe};

/// What a handler saw: (operation type, `_id`, whether it was a snapshot read).
pub type Seen = (String, Bson, bool);

/// A shared record of what the handler saw, in order.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<Seen>>>);

impl Log {
    pub fn push(&self, ctx: &ChangeContext<Document>) {
        let id = ctx
            .document_key()
            .and_then(|k| k.get("_id").cloned())
            .unwrap_or(Bson::Null);
        self.0
            .lock()
            .unwrap()
            .push((ctx.operation_type().to_string(), id, ctx.is_snapshot()));
    }

    pub fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The `_id`s (as i32) of the snapshot reads, in order.
    pub fn scanned(&self) -> Vec<i32> {
        self.all()
            .into_iter()
            .filter(|(_, _, snap)| *snap)
            .filter_map(|(_, id, _)| id.as_i32())
            .collect()
    }

    /// The `_id`s (as i32) of the changes the stream delivered, in order.
    pub fn streamed(&self) -> Vec<i32> {
        self.all()
            .into_iter()
            .filter(|(_, _, snap)| !*snap)
            .filter_map(|(_, id, _)| id.as_i32())
            .collect()
    }
}

/// A probe that records every successful call in `log`, after `before` ran.
pub fn logging_probe(
    log: &Log,
    before: impl Fn(&ChangeContext<Document>) -> Option<Duration> + Send + Sync + 'static,
) -> Probe {
    let log = log.clone();
    let before = Arc::new(before);
    Probe::new(move |ctx| {
        let log = log.clone();
        let before = before.clone();
        async move {
            if let Some(pause) = before(&ctx) {
                tokio::time::sleep(pause).await;
            }
            log.push(&ctx);
            Ok(())
        }
        .boxed()
    })
}

pub fn snapshot_def(
    name: &'static str,
    f: impl FnOnce(&mut StreamDefinition),
) -> &'static StreamDefinition {
    def(name, |d| {
        d.checkpoint.start_position = StartPosition::Snapshot;
        f(d);
    })
}

pub fn id_of(ctx: &ChangeContext<Document>) -> Option<i32> {
    ctx.document_key()
        .and_then(|k| k.get("_id"))
        .and_then(Bson::as_i32)
}
