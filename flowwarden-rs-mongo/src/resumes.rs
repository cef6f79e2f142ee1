//! The change-stream resumes the driver makes on its own.
//!
//! `mongodb` 3.9 resumes a change stream inside `next_if_any` whenever a `getMore` fails with a
//! resumable error (any network or other non-server error, `CursorNotFound`, or the
//! `ResumableChangeStreamError` label): it runs a new `aggregate` from its cached token, with
//! no limit and no backoff, and the caller never sees the error. Nothing is lost (it resumes
//! after the last event it returned), but the runtime's restart counter and backoff never
//! hear of it. So every cursor's pipeline starts with a no-op `{$match: {$comment: ..}}`
//! naming the stream and the open (the driver's `comment` option cannot be used: 3.9 also
//! writes it into the `$changeStream` stage, which servers reject), a command monitor installed by [`crate::MongoBackend::connect`] counts the
//! aggregates per comment, and the cursor reports every one beyond its own open as a driver
//! resume: a warning, the metric `flowwarden.source.driver_resumes`, and
//! [`crate::MongoBackend::driver_resumes`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;

/// Prefix of the `comment` of every change stream this crate opens.
pub(crate) const COMMENT_PREFIX: &str = "flowwarden:";

/// The open's tag in an `aggregate` command: the `$comment` of a `$match` stage.
fn tag_of(command: &bson::Document) -> Option<&str> {
    command
        .get_array("pipeline")
        .ok()?
        .iter()
        .filter_map(|stage| stage.as_document()?.get_document("$match").ok())
        .filter_map(|m| m.get_str("$comment").ok())
        .find(|c| c.starts_with(COMMENT_PREFIX))
}

/// Aggregates seen per open (by comment), and driver resumes per stream.
#[derive(Debug, Default)]
pub(crate) struct DriverResumes {
    next_open: AtomicU64,
    state: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    /// Per open: its aggregates, read by its cursor without the lock.
    aggregates: HashMap<String, Arc<AtomicU64>>,
    resumes: HashMap<String, u64>,
}

impl DriverResumes {
    /// The command monitor to install on the client's options.
    pub(crate) fn monitor(self: &Arc<Self>) -> EventHandler<CommandEvent> {
        let me = Arc::downgrade(self);
        EventHandler::callback(move |event| {
            let (Some(me), CommandEvent::Started(started)) = (me.upgrade(), event) else {
                return;
            };
            if started.command_name != "aggregate" {
                return;
            }
            if let Some(comment) = tag_of(&started.command) {
                if let Some(count) = me.lock().aggregates.get(comment) {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    }

    /// A comment unique to one open of `stream`, and the counter of its aggregates (register
    /// it before the open runs, so the open itself is counted).
    pub(crate) fn register(&self, stream: &str) -> (String, Arc<AtomicU64>) {
        let n = self.next_open.fetch_add(1, Ordering::Relaxed);
        let comment = format!("{COMMENT_PREFIX}{stream}:{n}");
        let count = Arc::new(AtomicU64::new(0));
        self.lock()
            .aggregates
            .insert(comment.clone(), count.clone());
        (comment, count)
    }

    /// Records `n` driver resumes of `stream`; returns its total.
    pub(crate) fn add_resumes(&self, stream: &str, n: u64) -> u64 {
        let mut counts = self.lock();
        let total = counts.resumes.entry(stream.to_owned()).or_default();
        *total += n;
        *total
    }

    /// Driver resumes of `stream` so far.
    pub(crate) fn resumes(&self, stream: &str) -> u64 {
        self.lock().resumes.get(stream).copied().unwrap_or(0)
    }

    /// Forgets a closed open's counter.
    pub(crate) fn forget(&self, comment: &str) {
        self.lock().aggregates.remove(comment);
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}
