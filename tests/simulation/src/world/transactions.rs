//! Transactional streams (`transactional = true`): what the harness records of their
//! transactions, and invariant 15, effects exactly once.
//!
//! The simulated handler writes each event's effect through the transaction handle
//! (`effects: {_id: "c<seq>" | "r<key>", n}`, `$inc: {n: 1}`, and, when drawn, a running
//! total), then behaves as the schedule says (fails, panics, asks for a dead letter, or
//! succeeds). A success is only recorded as *pending* in its incarnation's open transaction;
//! the recording transaction store decides: when the store applies the commit (its writes are
//! in the oplog) the event is settled as handled — invariants 3, 4 and 12 count applied
//! commits, not handler calls — and the checkpoint inside the commit is judged like any other
//! write (2, 6, 7, 8); a commit that applied nothing settles nothing.
//!
//! - 15, effects exactly once: right after each applied commit, the event's effect counter is
//!   exactly 1; at the end, no effect counter is above 1, every effect belongs to an event the
//!   source delivered (a change) or the scan returned (a snapshot read), every effect counts
//!   exactly the commits the store applied for it, every event handled has its effect, and
//!   the running total equals the sum of the effects. No halt excuses any of it: an event a
//!   loud halt left unhandled is invariant 1's to judge.

use tokio::sync::Notify;

use super::recorders::pos_label;
use super::*;

/// The collection the simulated handler writes each event's effect to.
pub(crate) const EFFECTS: &str = "effects";
/// The collection of the running total (the handler's second write, when drawn).
pub(crate) const TOTALS: &str = "effect_totals";

/// What the handler is invoked with: a change (its oplog sequence) or a snapshot read (its
/// key).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Subject {
    Change(u64),
    Read(i32),
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Change(seq) => write!(f, "#{seq}"),
            Subject::Read(k) => write!(f, "scan k{k}"),
        }
    }
}

impl Subject {
    /// The `_id` of its effect document.
    pub(crate) fn effect_id(self) -> String {
        match self {
            Subject::Change(seq) => format!("c{seq}"),
            Subject::Read(k) => format!("r{k}"),
        }
    }
}

/// A handler success inside an open transaction, waiting for its commit.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub(crate) subject: Subject,
    pub(crate) key: Option<i32>,
    /// A change's raw event, or a snapshot read's document.
    pub(crate) event: Document,
}

/// The trap a `CrashInCommit` step arms: the next commit to reach it stops there.
#[derive(Debug)]
pub(crate) struct Trap {
    /// After the commit applied (else before it reached the store).
    pub(crate) applied: bool,
    /// The incarnation whose commit stopped there.
    pub(crate) hit: Option<u32>,
    /// Tells the harness it was hit.
    pub(crate) notify: Arc<Notify>,
}

/// The ground truth of a transactional stream.
#[derive(Debug, Default)]
pub(crate) struct TxnTruth {
    /// This schedule's stream is transactional.
    pub(crate) on: bool,
    /// Per incarnation: the handler's success in its open transaction.
    pending: BTreeMap<u32, Pending>,
    /// Per effect `_id`: commits the store applied with it.
    applied: BTreeMap<String, u32>,
    /// Effects already reported as applied more than once.
    flagged: BTreeSet<String>,
    /// The armed commit trap.
    pub(crate) trap: Option<Trap>,
    /// Per incarnation: an applied commit whose reply has not reached it yet.
    answering: BTreeMap<u32, String>,
    /// Per incarnation: the effect `_id` of the event (or snapshot read) it has in processing,
    /// until it opens a cursor or reads a scan batch again.
    processing: BTreeMap<u32, String>,
}

impl TxnTruth {
    /// The truth of a run whose stream is transactional (`on`) or not.
    pub(crate) fn new(on: bool) -> Self {
        Self {
            on,
            ..Self::default()
        }
    }
}

/// The counter of an effect document (`n`).
pub(crate) fn counter(doc: &Document) -> i64 {
    match doc.get("n") {
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        _ => 0,
    }
}

impl WorldState {
    /// A transaction of `inc` begins: nothing of an earlier attempt is pending.
    pub(crate) fn on_transaction_begun(&mut self, inc: u32) {
        self.stats.transactions_begun += 1;
        self.txn.pending.remove(&inc);
        self.unanswered(inc);
    }

    /// The effect `_id` of the handler success pending in the transaction of `inc`.
    pub(crate) fn pending_effect(&self, inc: u32) -> Option<String> {
        self.txn.pending.get(&inc).map(|p| p.subject.effect_id())
    }

    /// Whether the filter call of `inc` for `subject` (attempt 1) is its transaction run again
    /// after a transient error (the event it has in processing), rather than the beginning of
    /// a new one; records `subject` as in processing. Always `false` outside transactional
    /// runs.
    pub(crate) fn transaction_rerun(&mut self, inc: u32, subject: Subject) -> bool {
        if !self.txn.on {
            return false;
        }
        let id = subject.effect_id();
        self.txn.processing.insert(inc, id.clone()) == Some(id)
    }

    /// `inc` opened a cursor or read a scan batch: what comes next is delivered anew.
    pub(crate) fn transaction_delivery(&mut self, inc: u32) {
        self.txn.processing.remove(&inc);
    }

    /// The handler of `inc` succeeded inside its transaction: the commit decides.
    pub(crate) fn on_transactional_success(&mut self, inc: u32, pending: Pending) {
        self.txn.pending.insert(inc, pending);
    }

    /// The transaction of `inc` was aborted: nothing of it is applied.
    pub(crate) fn on_transaction_aborted(&mut self, inc: u32) {
        self.txn.pending.remove(&inc);
    }

    /// The commit of `inc` applied and its reply reached the runtime.
    pub(crate) fn on_commit_answered(&mut self, inc: u32) {
        self.txn.answering.remove(&inc);
    }

    /// Counts an applied commit of `inc` whose reply never reached it (it crashed, stopped or
    /// moved on without it).
    pub(crate) fn unanswered(&mut self, inc: u32) {
        if let Some(id) = self.txn.answering.remove(&inc) {
            self.stats.unanswered_commits += 1;
            let tag = self.tag(inc);
            self.log(format!(
                "{tag}the reply of the applied commit of effect {id} never reached the runtime"
            ));
        }
    }

    /// A commit of `inc` returned `result`. `applied`: the store applied it (its writes are in
    /// the oplog); `effect`: the pending event's effect counter right after; `current`: the
    /// lease at that instant.
    pub(crate) fn on_commit(
        &mut self,
        inc: u32,
        checkpoint: Option<&Checkpoint>,
        result: &Result<(), TransactionError>,
        applied: bool,
        effect: Option<i64>,
        current: Option<&Lease>,
    ) {
        let tag = self.tag(inc);
        let pending = self.txn.pending.remove(&inc);
        let label = pending
            .as_ref()
            .map_or_else(|| "nothing handled".to_owned(), |p| p.subject.to_string());
        let with = checkpoint.map_or_else(
            || " without a checkpoint".to_owned(),
            |c| {
                format!(
                    " with the checkpoint seen {} processed {}{}",
                    pos_label(&c.last_seen),
                    pos_label(&c.last_processed),
                    c.epoch.map(|e| format!(" (epoch {e})")).unwrap_or_default()
                )
            },
        );
        if !applied {
            self.on_commit_not_applied(inc, checkpoint, result, pending.as_ref(), &label, &with);
            return;
        }
        self.stats.commits_applied += 1;
        let reported = match result {
            Ok(()) => String::new(),
            Err(e) => format!(", reported {:?}: {}", e.kind, e.message),
        };
        self.log(format!("{tag}commit of {label} applied{with}{reported}"));
        match result {
            Ok(()) => {}
            Err(e) if e.kind == TransactionErrorKind::CommitUnknown => {
                self.stats.unknown_outcomes += 1;
            }
            Err(e) => self.violate(
                Invariant::EffectsExactlyOnce,
                format!(
                    "{tag}the commit of {label} failed ({:?}) yet the store applied its writes",
                    e.kind
                ),
            ),
        }
        // The commit settles the event and stores the checkpoint in one step: settle first,
        // then judge the checkpoint against what is settled.
        match &pending {
            Some(p) => {
                self.txn.answering.insert(inc, p.subject.effect_id());
                match p.subject {
                    Subject::Change(seq) => {
                        self.on_success(seq, p.key);
                        self.project_change(seq, p.key, &p.event);
                    }
                    Subject::Read(k) => self.on_snapshot_success(k, &p.event),
                }
            }
            None => self.violate(
                Invariant::EffectsExactlyOnce,
                format!(
                    "{tag}a commit applied writes, but no handler succeeded in its transaction"
                ),
            ),
        }
        if let Some(cp) = checkpoint {
            self.check_checkpoint(cp);
            self.on_checkpoint_accepted(inc, cp, current);
            self.on_snapshot_checkpoint(inc, cp);
        }
        let Some(p) = pending else { return };
        let id = p.subject.effect_id();
        *self.txn.applied.entry(id.clone()).or_default() += 1;
        let n = effect.unwrap_or(0);
        if n > 1 {
            self.txn.flagged.insert(id);
            self.violate(
                Invariant::EffectsExactlyOnce,
                format!("{tag}the effect of {label} is now applied {n} times"),
            );
        } else if n < 1 {
            self.violate(
                Invariant::EffectsExactlyOnce,
                format!("{tag}the commit of {label} applied, but the handler's effect is not in"),
            );
        }
    }

    /// A commit the store did not apply.
    fn on_commit_not_applied(
        &mut self,
        inc: u32,
        checkpoint: Option<&Checkpoint>,
        result: &Result<(), TransactionError>,
        pending: Option<&Pending>,
        label: &str,
        with: &str,
    ) {
        let tag = self.tag(inc);
        match result {
            Ok(()) => {
                // Nothing to write (no handler write): only the checkpoint, if any.
                self.log(format!(
                    "{tag}commit of {label} acknowledged{with}, no write"
                ));
                if pending.is_some() {
                    self.violate(
                        Invariant::EffectsExactlyOnce,
                        format!("{tag}the commit of {label} was acknowledged, but the handler's writes were not applied"),
                    );
                }
                if let Some(cp) = checkpoint {
                    self.check_checkpoint(cp);
                    self.on_checkpoint_accepted(inc, cp, None);
                }
            }
            Err(e) => {
                match e.kind {
                    TransactionErrorKind::Fenced => {
                        self.stats.fenced_commits += 1;
                        self.stats.fenced_checkpoint_writes += 1;
                        let err = StoreError::new(StoreErrorKind::Fenced, e.message.clone());
                        self.on_fenced(inc, &format!("commit of {label}{with}"), &err);
                    }
                    TransactionErrorKind::CommitUnknown => {
                        self.stats.unknown_outcomes += 1;
                        self.log(format!("{tag}commit of {label}{with}: outcome reported unknown, nothing applied: {}", e.message));
                    }
                    kind => {
                        self.stats.failed_commits += 1;
                        self.log(format!(
                            "{tag}commit of {label}{with} failed ({kind:?}), nothing applied: {}",
                            e.message
                        ));
                    }
                }
                // Invariant 2 on the attempted write: it may pass its own event only.
                if let Some(cp) = checkpoint {
                    let own = pending.and_then(|p| match p.subject {
                        Subject::Change(seq) => Some(seq),
                        Subject::Read(_) => None,
                    });
                    self.check_checkpoint_excusing(cp, own);
                }
            }
        }
    }

    /// Invariant 15 at the end of the run: `effects` is the effects collection, `total` the
    /// running total's counter (when the handler keeps one).
    pub(crate) fn check_effects_end(&mut self, effects: Vec<Document>, total: Option<i64>) {
        if !self.txn.on {
            return;
        }
        let found: BTreeMap<String, i64> = effects
            .iter()
            .filter_map(|d| Some((d.get_str("_id").ok()?.to_owned(), counter(d))))
            .collect();
        let mut problems = Vec::new();
        for (id, n) in &found {
            let applied = self.txn.applied.get(id).copied().unwrap_or(0);
            if *n > 1 && !self.txn.flagged.contains(id) {
                problems.push(format!("effect {id} applied {n} times"));
            }
            if i64::from(applied) != *n {
                problems.push(format!(
                    "effect {id} counts {n}, but the store applied {applied} commit(s) of it"
                ));
            }
            if !self.effect_delivered(id) {
                problems.push(format!(
                    "effect {id} belongs to no event the source delivered"
                ));
            }
        }
        for id in self.txn.applied.keys() {
            if !found.contains_key(id) {
                problems.push(format!(
                    "commits of {id} applied, but its effect document is missing"
                ));
            }
        }
        // Every change handled has its effect exactly once (flagged ones were reported).
        for seq in self.successes.keys() {
            let id = Subject::Change(*seq).effect_id();
            if found.get(&id) != Some(&1) && !self.txn.flagged.contains(&id) {
                problems.push(format!(
                    "change #{seq} was handled, but its effect counts {}",
                    found.get(&id).copied().unwrap_or(0)
                ));
            }
        }
        let second = self
            .settings
            .transactional
            .as_ref()
            .is_some_and(|t| t.second_write);
        let sum: i64 = found.values().sum();
        if second && total.unwrap_or(0) != sum {
            problems.push(format!(
                "the running total is {}, but the effects sum to {sum}: a commit applied only part of its writes",
                total.unwrap_or(0)
            ));
        }
        self.log(format!(
            "effects at the end: {} event(s), {sum} application(s)",
            found.len()
        ));
        if !problems.is_empty() {
            problems.truncate(12);
            self.violate(
                Invariant::EffectsExactlyOnce,
                format!("at the end: {}", problems.join("; ")),
            );
        }
    }

    /// Whether the event of effect `id` was delivered: a change a cursor delivered, or a
    /// snapshot read a scan batch returned.
    fn effect_delivered(&self, id: &str) -> bool {
        if let Some(seq) = id.strip_prefix('c').and_then(|s| s.parse::<u64>().ok()) {
            // A change before the stream's start too (a rewound cursor delivers it again).
            return self.deliveries.get(&seq).is_some_and(|d| *d > 0);
        }
        if let Some(k) = id.strip_prefix('r').and_then(|s| s.parse::<i32>().ok()) {
            return self.snapshot_scanned(k);
        }
        false
    }
}
