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
    aggregates: HashMap<String, u64>,
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
                *me.lock().aggregates.entry(comment.to_owned()).or_default() += 1;
            }
        })
    }

    /// A comment unique to one open of `stream`.
    pub(crate) fn comment(&self, stream: &str) -> String {
        let n = self.next_open.fetch_add(1, Ordering::Relaxed);
        format!("{COMMENT_PREFIX}{stream}:{n}")
    }

    /// Aggregates run so far under `comment` (the open itself included).
    pub(crate) fn aggregates(&self, comment: &str) -> u64 {
        self.lock().aggregates.get(comment).copied().unwrap_or(0)
    }

    /// Records `n` driver resumes of `stream`.
    pub(crate) fn add_resumes(&self, stream: &str, n: u64) {
        *self.lock().resumes.entry(stream.to_owned()).or_default() += n;
    }

    /// Driver resumes of `stream` so far.
    pub(crate) fn resumes(&self, stream: &str) -> u64 {
        self.lock().resumes.get(stream).copied().unwrap_or(0)
    }

    /// Forgets a closed open's count.
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
