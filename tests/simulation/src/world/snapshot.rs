//! Initial snapshots (`start_position = Snapshot`): what the harness records of them, and
//! invariants 12–14.
//!
//! The source wrapper records every scan batch (what it asked for, what it returned, the oplog
//! head then) and every open; the checkpoint wrapper every snapshot progress the store accepted
//! (the recorded start, the last `_id`) and the completion (a checkpoint without snapshot
//! progress); the handler every snapshot read and, for every success, the projection a real
//! handler would keep: per key, the document and the version it reflects (the oplog sequence
//! of the write that produced it: every written document carries it as `v`), applied only when
//! newer than what the projection holds, as an idempotent handler does under at-least-once
//! delivery (a zombie's late success of an old version changes nothing).
//!
//! - 12, no silent loss: at the end the projection equals the collection, key by key, except
//!   keys the pipeline, the filter, a dead letter or a reported gap account for; unless the
//!   stream halted loudly. A snapshot that never completed without a loud halt is a loss.
//! - 13, resume: every scan batch asks for the documents after the stored last `_id` or later
//!   (never from the beginning once progress is stored); the stored start never changes and
//!   the stored last `_id` never moves back; while a stored snapshot is unfinished no cursor
//!   opens anywhere but at the recorded start; the completed snapshot hands over at the
//!   recorded start.
//! - 14, history lost: a snapshot is declared complete only after its runtime opened the
//!   stream at the recorded start after its last scan batch (the start is retained); a
//!   snapshot whose start left the retained history ends `HistoryLost`; a runtime that halts
//!   `HistoryLost` during a snapshot does so only when the start really is lost.

use super::recorders::{pos_label, pos_seq};
use super::*;

/// The snapshot progress the store last accepted.
#[derive(Debug, Clone)]
pub(crate) struct StoredSnapshot {
    /// The recorded start (oplog sequence).
    pub(crate) start: u64,
    /// The last settled `_id`.
    pub(crate) last_id: Option<i32>,
}

/// One key's snapshot reads.
#[derive(Debug, Default, Clone)]
pub(crate) struct Reads {
    /// Times a scan batch returned the document.
    scanned: u32,
    /// Handler invocations (the behaviour's hash counts them).
    pub(crate) calls: u32,
    /// Successful reads.
    handled: u32,
    /// How the first settled read ended.
    settled: Option<Settle>,
}

/// The ground truth of a snapshot start.
#[derive(Debug, Default)]
pub(crate) struct SnapshotTruth {
    /// This schedule starts with a snapshot.
    pub(crate) on: bool,
    /// The snapshot progress the store last accepted.
    pub(crate) stored: Option<StoredSnapshot>,
    /// A checkpoint without snapshot progress was accepted after the snapshot began.
    pub(crate) completed: bool,
    /// Per key: its snapshot reads.
    pub(crate) reads: BTreeMap<i32, Reads>,
    /// Per incarnation: its scan batches so far.
    batches: BTreeMap<u32, u64>,
    /// Per incarnation: it opened the stream at the recorded start after its last batch.
    confirmed: BTreeMap<u32, bool>,
    /// Per key: the version the projection reflects, and the document (`None`: deleted, or
    /// changed by an update the handler could not apply).
    projection: BTreeMap<i32, (u64, Option<Document>)>,
    /// Nothing at or before this version counts any more (the collection was dropped).
    dropped_at: u64,
    /// Keys some version of which had `status: "hidden"` (the `NotHidden` pipeline, carried
    /// over to the scan, keeps them from it).
    pub(crate) hidden: BTreeSet<i32>,
}

impl SnapshotTruth {
    /// The truth of a run that starts with a snapshot (`on`) or not.
    pub(crate) fn new(on: bool) -> Self {
        Self {
            on,
            ..Self::default()
        }
    }
}

/// The integer `_id` of a document or a scan position.
pub(crate) fn int_key(id: &Bson) -> Option<i32> {
    match id {
        Bson::Int32(k) => Some(*k),
        Bson::Int64(k) => i32::try_from(*k).ok(),
        _ => None,
    }
}

fn key_label(k: Option<i32>) -> String {
    k.map_or_else(|| "the beginning".into(), |k| format!("k{k}"))
}

/// A document's fields in name order (the projection builds documents field by field).
fn normalized(d: Option<&Document>) -> Option<BTreeMap<String, Bson>> {
    d.map(|d| d.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

impl WorldState {
    /// A scan batch of incarnation `inc` asked for the documents after `after` and got
    /// `result`, with the oplog at `head`.
    pub(crate) fn on_scan(
        &mut self,
        inc: u32,
        after: Option<&Bson>,
        result: &Result<Vec<Document>, SourceError>,
        head: u64,
    ) {
        let tag = self.tag(inc);
        let after = after.and_then(int_key);
        let docs = match result {
            Ok(docs) => docs,
            Err(e) => {
                self.log(format!(
                    "{tag}scan after {} -> error {:?}: {}",
                    key_label(after),
                    e.kind,
                    e.message
                ));
                return;
            }
        };
        let keys: Vec<i32> = docs
            .iter()
            .filter_map(|d| d.get("_id").and_then(int_key))
            .collect();
        self.log(format!(
            "{tag}scan after {} -> {keys:?} (oplog head #{head})",
            key_label(after)
        ));
        self.stats.scan_batches += 1;
        if self.start_seq.is_none() {
            // Whatever the runtime recorded: changes after the first batch are checked.
            self.start_seq = Some(head);
            self.log(format!(
                "stream start position: after #{head} (first scan batch)"
            ));
        }
        match self.snap.stored.clone() {
            None => self.violate(
                Invariant::SnapshotResume,
                format!("{tag}scanned before any snapshot start position was stored"),
            ),
            Some(s) if s.last_id.is_some() && after < s.last_id => self.violate(
                Invariant::SnapshotResume,
                format!(
                    "{tag}a scan batch asks for the documents after {} although the stored progress is after {}: documents already settled are read again",
                    key_label(after),
                    key_label(s.last_id)
                ),
            ),
            Some(_) => {}
        }
        let batches = self.snap.batches.entry(inc).or_default();
        if *batches == 0 && after.is_some() {
            self.stats.resumed_scans += 1;
        }
        *batches += 1;
        self.snap.confirmed.insert(inc, false);
        for k in keys {
            self.snap.reads.entry(k).or_default().scanned += 1;
        }
    }

    /// A cursor open of incarnation `inc` at `at` (`ok`: it opened).
    pub(crate) fn on_snapshot_open(&mut self, inc: u32, at: &StartAt, ok: bool) {
        if !self.snap.on || self.snap.completed {
            return;
        }
        // Before a start is stored, the runtime opens at "now" to take one.
        let Some(s) = self.snap.stored.clone() else {
            return;
        };
        match at {
            StartAt::ResumeAfter(t) | StartAt::StartAfter(t) if token_seq(t) == Some(s.start) => {
                if ok {
                    self.snap.confirmed.insert(inc, true);
                }
            }
            _ => {
                let tag = self.tag(inc);
                self.violate(
                    Invariant::SnapshotResume,
                    format!("{tag}opened the stream at `{at}` while the snapshot that began at #{} is unfinished: the stream may only start at the recorded start", s.start),
                );
            }
        }
    }

    /// The store accepted a checkpoint of incarnation `inc`: snapshot progress, or (the first
    /// one without) the completed snapshot.
    pub(crate) fn on_snapshot_checkpoint(&mut self, inc: u32, cp: &Checkpoint) {
        if !self.snap.on {
            return;
        }
        let tag = self.tag(inc);
        let Some(p) = &cp.snapshot else {
            let Some(s) = self.snap.stored.clone() else {
                return;
            };
            if self.snap.completed {
                return;
            }
            self.snap.completed = true;
            self.stats.snapshots_completed += 1;
            self.log(format!(
                "{tag}snapshot complete; the stream starts after #{}",
                s.start
            ));
            if self.snap.confirmed.get(&inc) != Some(&true) {
                self.violate(
                    Invariant::SnapshotHistoryLost,
                    format!("{tag}declared the snapshot complete without opening the stream at its recorded start #{} after its last scan batch: nothing shows the start is still retained", s.start),
                );
            }
            let seen = cp.last_seen.as_ref().and_then(|p| token_seq(&p.token));
            if seen != Some(s.start) || cp.last_processed.is_some() {
                self.violate(
                    Invariant::SnapshotResume,
                    format!(
                        "{tag}the completed snapshot hands over at seen {} processed {} instead of the recorded start #{}",
                        pos_seq(seen),
                        pos_label(&cp.last_processed),
                        s.start
                    ),
                );
            }
            return;
        };
        let start = token_seq(&p.start.token).unwrap_or(0);
        let last_id = p.last_id.as_ref().and_then(int_key);
        self.log(format!(
            "{tag}snapshot progress stored: start #{start}, after {}, {} read",
            key_label(last_id),
            p.scanned
        ));
        if self.snap.completed {
            self.violate(
                Invariant::SnapshotResume,
                format!("{tag}snapshot progress stored after the snapshot completed"),
            );
        }
        if let Some(prev) = self.snap.stored.clone() {
            if prev.start != start {
                self.violate(
                    Invariant::SnapshotResume,
                    format!("{tag}the snapshot's recorded start changed from #{} to #{start} while it was unfinished", prev.start),
                );
            } else if last_id < prev.last_id {
                self.violate(
                    Invariant::SnapshotResume,
                    format!(
                        "{tag}the stored last _id moved back from {} to {}",
                        key_label(prev.last_id),
                        key_label(last_id)
                    ),
                );
            }
        }
        self.snap.stored = Some(StoredSnapshot { start, last_id });
    }

    /// Whether a scan batch returned the document of `key`.
    pub(crate) fn snapshot_scanned(&self, key: i32) -> bool {
        self.snap.reads.get(&key).is_some_and(|r| r.scanned > 0)
    }

    /// The handler is invoked with the snapshot read of `key`: how many times before.
    pub(crate) fn snapshot_call(&mut self, key: i32) -> u32 {
        let r = self.snap.reads.entry(key).or_default();
        r.calls += 1;
        r.calls - 1
    }

    /// The snapshot read of `key` settled as `how` (first settlement counts).
    pub(crate) fn settle_snapshot_read(&mut self, key: i32, how: Settle) {
        let r = self.snap.reads.entry(key).or_default();
        r.settled.get_or_insert(how);
    }

    /// The handler succeeded with the snapshot read of `key` (the document as scanned).
    pub(crate) fn on_snapshot_success(&mut self, key: i32, doc: &Document) {
        self.stats.snapshot_reads += 1;
        let r = self.snap.reads.entry(key).or_default();
        r.handled += 1;
        let (handled, scanned) = (r.handled, r.scanned);
        if handled > scanned {
            self.violate(
                Invariant::DuplicateWithoutFault,
                format!("the snapshot read of k{key} handled {handled} time(s) but returned by the scan only {scanned} time(s)"),
            );
        }
        self.settle_snapshot_read(key, Settle::Handled);
        let version = doc.get_i64("v").ok().and_then(|v| u64::try_from(v).ok());
        self.project(key, version.unwrap_or(0), Some(doc.clone()));
    }

    /// The handler succeeded with change `seq` of `key` (`raw`: the event).
    pub(crate) fn project_change(&mut self, seq: u64, key: Option<i32>, raw: &Document) {
        let Some(key) = key.filter(|_| self.snap.on) else {
            return;
        };
        match raw.get_str("operationType") {
            Ok("insert" | "replace") => {
                let doc = raw.get_document("fullDocument").ok().cloned();
                self.project(key, seq, doc);
            }
            Ok("update") => {
                let current = self.snap.projection.get(&key).and_then(|(_, d)| d.clone());
                let updated = current.map(|mut d| {
                    let desc = raw.get_document("updateDescription").ok();
                    if let Some(set) = desc.and_then(|u| u.get_document("updatedFields").ok()) {
                        for (f, v) in set {
                            d.insert(f.clone(), v.clone());
                        }
                    }
                    if let Some(gone) = desc.and_then(|u| u.get_array("removedFields").ok()) {
                        for f in gone.iter().filter_map(Bson::as_str) {
                            d.remove(f);
                        }
                    }
                    d
                });
                self.project(key, seq, updated);
            }
            Ok("delete") => self.project(key, seq, None),
            _ => {}
        }
    }

    /// The handler saw the collection's drop at `seq`: the projection forgets it all.
    pub(crate) fn project_drop(&mut self, seq: u64) {
        if !self.snap.on || seq <= self.snap.dropped_at {
            return;
        }
        self.snap.dropped_at = seq;
        for entry in self.snap.projection.values_mut() {
            if entry.0 < seq {
                *entry = (seq, None);
            }
        }
    }

    /// Applies a version of `key` unless the projection already reflects a newer one.
    fn project(&mut self, key: i32, version: u64, doc: Option<Document>) {
        if version <= self.snap.dropped_at {
            return;
        }
        let newer = self
            .snap
            .projection
            .get(&key)
            .is_none_or(|(v, _)| *v < version);
        if newer {
            self.snap.projection.insert(key, (version, doc));
        }
    }

    /// Invariant 14 at the end of a runtime: a `HistoryLost` halt during a snapshot only when
    /// its recorded start is no longer retained (`first`: the oldest retained sequence).
    pub(crate) fn on_snapshot_runtime_end(&mut self, inc: u32, halt: Option<&Halt>, first: u64) {
        if !self.snap.on || self.snap.completed {
            return;
        }
        if halt.is_none_or(|h| h.reason != HaltReason::HistoryLost) {
            return;
        }
        self.stats.snapshot_history_lost += 1;
        if let Some(s) = self.snap.stored.clone() {
            if s.start + 1 >= first {
                let tag = self.tag(inc);
                self.violate(
                    Invariant::SnapshotHistoryLost,
                    format!("{tag}halted HistoryLost during the snapshot, but its recorded start #{} is still retained (oldest retained #{first}): nothing was lost", s.start),
                );
            }
        }
    }

    /// Invariants 12 and 14 at the end of the run: `documents` is the collection, `halt` and
    /// `state` the final status, `loud` whether it is a loud halt (`HistoryLost`, or the
    /// invalidate of the drop), `first` the oldest retained sequence.
    pub(crate) fn check_snapshot_end(
        &mut self,
        documents: Vec<Document>,
        state: Option<StreamState>,
        halt: Option<&Halt>,
        loud: bool,
        first: u64,
    ) {
        if !self.snap.on {
            return;
        }
        if !self.snap.completed {
            let start = self.snap.stored.as_ref().map(|s| s.start);
            let lost = start.is_some_and(|s| s + 1 < first);
            let halted_lost = state == Some(StreamState::HistoryLost)
                && halt.is_some_and(|h| h.reason == HaltReason::HistoryLost);
            if lost && !halted_lost {
                self.violate(
                    Invariant::SnapshotHistoryLost,
                    format!("the recorded start #{} left the retained history (oldest #{first}) before the snapshot completed, yet the stream ends {state:?} with halt {:?}", start.unwrap_or(0), halt.map(|h| h.reason)),
                );
            } else if !lost && !loud {
                self.violate(
                    Invariant::SnapshotNoSilentLoss,
                    format!("the snapshot never completed (stored start {}), and the stream ends {state:?} with halt {:?}", pos_seq(start), halt.map(|h| h.reason)),
                );
            }
            return;
        }
        if loud {
            return;
        }
        let collection: BTreeMap<i32, Document> = documents
            .into_iter()
            .filter_map(|d| Some((d.get("_id").and_then(int_key)?, d)))
            .collect();
        let keys: BTreeSet<i32> = collection
            .keys()
            .copied()
            .chain(self.snap.projection.keys().copied())
            .collect();
        let mut differ = Vec::new();
        for k in keys {
            let projected = self.snap.projection.get(&k).and_then(|(_, d)| d.as_ref());
            let actual = collection.get(&k);
            if normalized(projected) == normalized(actual) || self.projection_excused(k) {
                continue;
            }
            let show = |d: Option<&Document>| d.map_or_else(|| "none".into(), |d| d.to_string());
            differ.push(format!(
                "k{k}: projection {}, collection {}",
                show(projected),
                show(actual)
            ));
        }
        if !differ.is_empty() {
            self.violate(
                Invariant::SnapshotNoSilentLoss,
                format!("at the end the handler's projection differs from the collection, and no pipeline, filter, dead letter or reported gap accounts for it: {}", differ.join("; ")),
            );
        }
    }

    /// Whether `key` may legitimately differ: its handler always fails (dead letters), the
    /// pipeline keeps it from the scan and the stream, one of its snapshot reads or changes was
    /// filtered, dead-lettered, dropped by the pipeline or skipped in a reported gap, or the
    /// collection's drop was (a drop concerns every key).
    fn projection_excused(&self, key: i32) -> bool {
        let s = &self.settings;
        if s.behaviour.permanent_keys.contains(&key) {
            return true;
        }
        match s.pipeline {
            PipelineKind::NotKey(k) if k == key => return true,
            PipelineKind::NotHidden if self.snap.hidden.contains(&key) => return true,
            _ => {}
        }
        let read_not_handled = self
            .snap
            .reads
            .get(&key)
            .and_then(|r| r.settled)
            .is_some_and(|how| how != Settle::Handled);
        read_not_handled
            || self.checked_changes(u64::MAX).any(|c| {
                if c.op == Op::Drop {
                    // Delivered, it cleared the projection (`project_drop`).
                    return self.gap.contains(&c.seq);
                }
                if c.key != Some(key) {
                    return false;
                }
                c.pipeline_rejects
                    || self.gap.contains(&c.seq)
                    || self
                        .settled
                        .get(&c.seq)
                        .is_some_and(|how| *how != Settle::Handled)
            })
    }
}
