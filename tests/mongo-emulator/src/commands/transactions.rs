//! Multi-document transactions ("Transactions" and "Production Considerations" in the manual,
//! the driver's Transactions specification): the state of each session keyed by `lsid.id` and
//! `txnNumber`, CRUD inside a transaction against its own snapshot, `commitTransaction` (the
//! conflict check and the atomic apply) and `abortTransaction`.
//!
//! A transaction starts with a copy of every collection (its snapshot) taken at its first
//! command. Its commands run against that copy, and their writes are held back from the oplog
//! (`Data::capture`). At commit, under the state lock, the writes are checked against the
//! versions of the documents they touch and replayed onto the committed collections, then
//! logged as consecutive oplog entries sharing one cluster time.

use std::collections::btree_map::Entry as MapEntry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};

use super::{as_i64, dispatch, get_more_step, ok, CmdResult, Reply, State};
use crate::changestream::MAX_BSON;
use crate::error::{CommandError, TRANSIENT_TRANSACTION_ERROR};
use crate::state::{value_key, Collection, OpKind};
use crate::txn::{PendingOp, TxnTag, Versions};

/// Every database: name → collection name → collection.
type Dbs = BTreeMap<String, BTreeMap<String, Collection>>;

/// Commands that may run inside a transaction.
const ALLOWED: [&str; 9] = [
    "insert",
    "update",
    "delete",
    "find",
    "findAndModify",
    "findandmodify",
    "aggregate",
    "getMore",
    "killCursors",
];

/// An open transaction.
#[derive(Debug)]
struct Txn {
    /// `lsid.id` as the driver sent it.
    id: Bson,
    /// The oplog head when it started: a committed write after it conflicts.
    start_pos: u64,
    /// Server time (ms) when it started, for the lifetime limit.
    started_ms: i64,
    /// Its snapshot of every collection, with its own writes applied.
    dbs: Dbs,
    /// Its writes, in order, applied at commit.
    ops: Vec<PendingOp>,
}

/// What a session's latest `txnNumber` was used for.
#[derive(Debug)]
enum Phase {
    Active(Box<Txn>),
    Committed,
    /// Aborted, and why (shown in the NoSuchTransaction message).
    Aborted(String),
    RetryableWrite,
}

#[derive(Debug)]
struct Session {
    /// The highest `txnNumber` seen on the session.
    number: i64,
    phase: Phase,
}

/// Every session that used a `txnNumber`, and the transaction counters.
#[derive(Debug)]
pub(crate) struct Transactions {
    sessions: HashMap<Vec<u8>, Session>,
    pub(crate) committed: u64,
    pub(crate) aborted: u64,
    lifetime_ms: i64,
}

impl Transactions {
    pub(crate) fn new(lifetime: Duration) -> Transactions {
        Transactions {
            sessions: HashMap::new(),
            committed: 0,
            aborted: 0,
            lifetime_ms: i64::try_from(lifetime.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// Number of open transactions.
    pub(crate) fn open(&self) -> usize {
        self.sessions
            .values()
            .filter(|s| matches!(s.phase, Phase::Active(_)))
            .count()
    }

    /// Aborts the session's open transaction, if any.
    fn abort(&mut self, key: &[u8], why: &str) {
        if let Some(s) = self.sessions.get_mut(key) {
            if matches!(s.phase, Phase::Active(_)) {
                s.phase = Phase::Aborted(why.to_string());
                self.aborted += 1;
            }
        }
    }

    /// Aborts every open transaction.
    pub(crate) fn abort_all(&mut self, why: &str) {
        for s in self.sessions.values_mut() {
            if matches!(s.phase, Phase::Active(_)) {
                s.phase = Phase::Aborted(why.to_string());
                self.aborted += 1;
            }
        }
    }
}

/// The transaction fields of a command that carries `autocommit`.
#[derive(Debug)]
pub(crate) struct TxnArgs {
    key: Vec<u8>,
    id: Bson,
    number: i64,
    start: bool,
}

/// The key of a session: the bytes of its `lsid.id` UUID.
pub(crate) fn session_key(id: &Bson) -> Vec<u8> {
    match id {
        Bson::Binary(b) => b.bytes.clone(),
        other => value_key(other),
    }
}

fn invalid_options(msg: impl Into<String>) -> CommandError {
    CommandError::new(72, "InvalidOptions", msg)
}

/// The transaction fields of `body`; `Ok(None)` for a command outside any transaction (one
/// without `autocommit`).
pub(crate) fn txn_args(body: &Document) -> Result<Option<TxnArgs>, CommandError> {
    let Some(autocommit) = body.get("autocommit") else {
        return Ok(None);
    };
    if autocommit != &Bson::Boolean(false) {
        return Err(invalid_options(
            "Specifying autocommit=true is not allowed.",
        ));
    }
    let id = body
        .get_document("lsid")
        .ok()
        .and_then(|l| l.get("id"))
        .cloned()
        .ok_or_else(|| invalid_options("'autocommit' is only allowed with a session (lsid)"))?;
    let number = as_i64(body.get("txnNumber"))
        .ok_or_else(|| invalid_options("'autocommit' is only allowed with a txnNumber"))?;
    let start = match body.get("startTransaction") {
        None => false,
        Some(Bson::Boolean(true)) => true,
        Some(_) => return Err(invalid_options("startTransaction must be true")),
    };
    Ok(Some(TxnArgs {
        key: session_key(&id),
        id,
        number,
        start,
    }))
}

/// Keeps document versions exactly while some transaction is open.
pub(crate) fn sync_versions(st: &mut State) {
    if st.txn.open() == 0 {
        st.data.versions = None;
    } else if st.data.versions.is_none() {
        st.data.versions = Some(Versions::default());
    }
}

/// Aborts every transaction open longer than the lifetime limit (server time).
pub(crate) fn expire(st: &mut State) {
    if st.txn.open() == 0 {
        return;
    }
    let now = st.now().timestamp_millis();
    let limit = st.txn.lifetime_ms;
    let why = format!(
        "it ran longer than the transaction lifetime limit of {} ms",
        limit
    );
    let mut expired = 0;
    for s in st.txn.sessions.values_mut() {
        if let Phase::Active(t) = &s.phase {
            if now.saturating_sub(t.started_ms) > limit {
                s.phase = Phase::Aborted(why.clone());
                expired += 1;
            }
        }
    }
    st.txn.aborted += expired;
    sync_versions(st);
}

/// Runs a command that carries `autocommit: false`.
pub(crate) fn run(
    st: &mut State,
    name: &str,
    db: &str,
    body: &Document,
    args: &TxnArgs,
) -> CmdResult {
    let result = match name {
        "commitTransaction" => commit(st, db, args),
        "abortTransaction" => abort(st, db, args),
        _ => run_inside(st, name, db, body, args),
    };
    sync_versions(st);
    result
}

/// Before a retryable write (a `txnNumber` without `autocommit`): refuses an old number, and a
/// newer one aborts the session's open transaction.
pub(crate) fn before_retryable_write(
    st: &mut State,
    key: &[u8],
    number: i64,
) -> Result<(), CommandError> {
    if let Some(s) = st.txn.sessions.get(key) {
        if s.number > number {
            return Err(CommandError::transaction_too_old(format!(
                "Retryable write with txnNumber {number} is prohibited on session because a newer retryable write or transaction with txnNumber {} has already started on this session.",
                s.number
            )));
        }
        if s.number == number && !matches!(s.phase, Phase::RetryableWrite) {
            return Err(CommandError::new(
                117,
                "ConflictingOperationInProgress",
                format!("txnNumber {number} was used by a transaction on this session"),
            ));
        }
    }
    st.txn.abort(
        key,
        "a retryable write with a newer txnNumber ran on its session",
    );
    st.txn.sessions.insert(
        key.to_vec(),
        Session {
            number,
            phase: Phase::RetryableWrite,
        },
    );
    sync_versions(st);
    Ok(())
}

/// After an injected error labelled `TransientTransactionError` on a command inside a
/// transaction: the transaction is aborted, as the server aborts it after such an error.
pub(crate) fn abort_after_injected(st: &mut State, body: &Document, error: &CommandError) {
    if !error.has_label(TRANSIENT_TRANSACTION_ERROR) {
        return;
    }
    if let Ok(Some(args)) = txn_args(body) {
        let current = st
            .txn
            .sessions
            .get(&args.key)
            .is_some_and(|s| s.number == args.number);
        if current {
            st.txn
                .abort(&args.key, "an injected TransientTransactionError");
            sync_versions(st);
        }
    }
}

/// `endSessions`: aborts the open transactions of the sessions ended.
pub(crate) fn end_sessions(st: &mut State, body: &Document) -> CmdResult {
    if let Ok(ids) = body.get_array("endSessions") {
        for lsid in ids.iter().filter_map(Bson::as_document) {
            if let Some(id) = lsid.get("id") {
                st.txn.abort(&session_key(id), "its session ended");
            }
        }
    }
    sync_versions(st);
    ok(doc! {"ok": 1.0})
}

fn no_such(number: i64, detail: &str) -> CommandError {
    CommandError::no_such_transaction(format!(
        "Transaction with {{ txnNumber: {number} }} {detail}"
    ))
}

/// Checks that the session's transaction `args.number` is open.
fn check_open(tx: &Transactions, args: &TxnArgs) -> Result<(), CommandError> {
    let n = args.number;
    match tx.sessions.get(&args.key) {
        None => Err(no_such(n, "does not match any in-progress transactions.")),
        Some(s) if s.number > n => Err(CommandError::transaction_too_old(format!(
            "txnNumber {n} is less than last txnNumber {} seen in this session",
            s.number
        ))),
        Some(s) if s.number < n => Err(no_such(
            n,
            &format!(
                "does not match any in-progress transactions. The active transaction number is {}",
                s.number
            ),
        )),
        Some(s) => match &s.phase {
            Phase::Active(_) => Ok(()),
            Phase::Committed => Err(CommandError::transaction_committed(format!(
                "Transaction {n} has been committed."
            ))),
            Phase::Aborted(why) => Err(no_such(n, &format!("has been aborted ({why})."))),
            Phase::RetryableWrite => Err(no_such(n, "was used by a retryable write.")),
        },
    }
}

fn check_allowed(name: &str, body: &Document) -> Result<(), CommandError> {
    if !ALLOWED.contains(&name) {
        return Err(CommandError::not_supported_in_transaction(format!(
            "Cannot run '{name}' in a multi-document transaction."
        )));
    }
    let change_stream = name == "aggregate"
        && body
            .get_array("pipeline")
            .ok()
            .and_then(|p| p.first())
            .and_then(Bson::as_document)
            .is_some_and(|s| s.contains_key("$changeStream"));
    if change_stream {
        return Err(CommandError::not_supported_in_transaction(
            "Operation not permitted in transaction :: caused by :: $changeStream cannot run within a multi-document transaction.",
        ));
    }
    Ok(())
}

/// Starts transaction `args.number` on its session (aborting an older open one).
fn begin(st: &mut State, body: &Document, args: &TxnArgs) -> Result<(), CommandError> {
    let n = args.number;
    if let Some(s) = st.txn.sessions.get(&args.key) {
        if s.number > n {
            return Err(CommandError::transaction_too_old(format!(
                "Cannot start transaction {n} on session because a newer transaction {} has already started.",
                s.number
            )));
        }
        if s.number == n {
            return Err(CommandError::new(
                117,
                "ConflictingOperationInProgress",
                format!("Cannot start a transaction at given transaction number {n}: a transaction or retryable write with the same number was already run on this session."),
            ));
        }
    }
    if let Some(rc) = body.get("readConcern") {
        let bad = || invalid_options("readConcern must be a document with a string level");
        let level = match rc {
            Bson::Document(d) => match d.get("level") {
                None => "local",
                Some(Bson::String(l)) => l.as_str(),
                Some(_) => return Err(bad()),
            },
            _ => return Err(bad()),
        };
        if !["local", "majority", "snapshot"].contains(&level) {
            return Err(invalid_options(format!(
                "The readConcern level must be either 'local' (default), 'majority' or 'snapshot' in order to run in a transaction, found '{level}'"
            )));
        }
    }
    st.txn
        .abort(&args.key, "a newer transaction started on its session");
    let txn = Txn {
        id: args.id.clone(),
        start_pos: st.data.head_pos,
        started_ms: st.now().timestamp_millis(),
        dbs: st.data.dbs.clone(),
        ops: Vec::new(),
    };
    st.txn.sessions.insert(
        args.key.clone(),
        Session {
            number: n,
            phase: Phase::Active(Box::new(txn)),
        },
    );
    sync_versions(st);
    Ok(())
}

fn internal(msg: &str) -> CommandError {
    CommandError::new(1, "InternalError", msg)
}

/// Takes the session's open transaction out (the session is left aborted until it is put back).
fn take_txn(st: &mut State, key: &[u8]) -> Result<Box<Txn>, CommandError> {
    let session = st
        .txn
        .sessions
        .get_mut(key)
        .ok_or_else(|| internal("the transaction's session vanished"))?;
    match std::mem::replace(&mut session.phase, Phase::Aborted(String::new())) {
        Phase::Active(t) => Ok(t),
        other => {
            session.phase = other;
            Err(internal("the transaction is not open"))
        }
    }
}

fn set_phase(st: &mut State, key: &[u8], phase: Phase) {
    if let Some(s) = st.txn.sessions.get_mut(key) {
        s.phase = phase;
    }
}

/// Runs a CRUD command inside the transaction, against its snapshot.
fn run_inside(st: &mut State, name: &str, db: &str, body: &Document, args: &TxnArgs) -> CmdResult {
    if args.start {
        begin(st, body, args)?;
    } else {
        check_open(&st.txn, args)?;
    }
    let refused = if !args.start && body.contains_key("readConcern") {
        Some(invalid_options(
            "Only the first command in a transaction may specify a readConcern",
        ))
    } else {
        check_allowed(name, body).err()
    };
    if let Some(e) = refused {
        // Like any failed command, a refused one aborts the transaction.
        let why = format!("{} {} inside it", e.code, e.code_name);
        st.txn.abort(&args.key, &why);
        return Err(e);
    }
    let mut txn = take_txn(st, &args.key)?;
    let before = txn.ops.len();
    std::mem::swap(&mut st.data.dbs, &mut txn.dbs);
    st.data.capture = Some(std::mem::take(&mut txn.ops));
    let mut result = if name == "getMore" {
        get_more_step(st, body, true).and_then(|step| {
            step.map_err(|_| internal("getMore inside a transaction would have waited"))
        })
    } else {
        dispatch(st, name, db, body)
    };
    txn.ops = st.data.capture.take().unwrap_or_default();
    std::mem::swap(&mut st.data.dbs, &mut txn.dbs);
    let mut failure = match &result {
        Err(e) => Some(format!("{} {} inside it", e.code, e.code_name)),
        Ok(Reply::Doc(d)) if d.contains_key("writeErrors") => {
            Some("a write error inside it".to_string())
        }
        _ => None,
    };
    if failure.is_none() && conflicts(st, &txn, before) {
        result = Err(CommandError::write_conflict());
        failure = Some("a write conflict".to_string());
    }
    match failure {
        None => set_phase(st, &args.key, Phase::Active(txn)),
        Some(why) => {
            set_phase(st, &args.key, Phase::Aborted(why));
            st.txn.aborted += 1;
        }
    }
    result
}

/// Whether a write of `txn` from its `from`-th on touches a document that a committed write
/// changed after the transaction started.
fn conflicts(st: &State, txn: &Txn, from: usize) -> bool {
    let Some(versions) = st.data.versions.as_ref() else {
        return false;
    };
    txn.ops
        .get(from..)
        .unwrap_or_default()
        .iter()
        .any(|op| versions.changed_after(op, txn.start_pos))
}

fn admin_only(db: &str, name: &str) -> Result<(), CommandError> {
    if db == "admin" {
        Ok(())
    } else {
        Err(CommandError::new(
            13,
            "Unauthorized",
            format!("{name} may only be run against the admin database."),
        ))
    }
}

fn commit(st: &mut State, db: &str, args: &TxnArgs) -> CmdResult {
    admin_only(db, "commitTransaction")?;
    if args.start {
        return Err(invalid_options(
            "commitTransaction cannot be the first command of a transaction",
        ));
    }
    let committed = st
        .txn
        .sessions
        .get(&args.key)
        .is_some_and(|s| s.number == args.number && matches!(s.phase, Phase::Committed));
    if committed {
        // A retried commit of a committed transaction succeeds again (and applies nothing).
        return ok(doc! {"ok": 1.0});
    }
    check_open(&st.txn, args)?;
    let txn = take_txn(st, &args.key)?;
    match apply(st, *txn, args.number) {
        Ok(()) => {
            set_phase(st, &args.key, Phase::Committed);
            st.txn.committed += 1;
            ok(doc! {"ok": 1.0})
        }
        Err(e) => {
            let why = format!("its commit failed with {} {}", e.code, e.code_name);
            set_phase(st, &args.key, Phase::Aborted(why));
            st.txn.aborted += 1;
            Err(e)
        }
    }
}

fn abort(st: &mut State, db: &str, args: &TxnArgs) -> CmdResult {
    admin_only(db, "abortTransaction")?;
    check_open(&st.txn, args)?;
    st.txn.abort(&args.key, "abortTransaction");
    ok(doc! {"ok": 1.0})
}

/// Makes the transaction's writes visible: size and conflict checks, then replays them onto
/// copies of the committed collections it touched, swaps those in and logs every write, all
/// under the state lock. Nothing changes when it fails.
fn apply(st: &mut State, txn: Txn, number: i64) -> Result<(), CommandError> {
    let size: usize = txn.ops.iter().map(PendingOp::size).sum();
    if size > MAX_BSON {
        return Err(CommandError::new(
            257,
            "TransactionTooLarge",
            format!(
                "Total size of all transaction operations must be less than {MAX_BSON}. Actual size is {size}"
            ),
        ));
    }
    if conflicts(st, &txn, 0) {
        return Err(CommandError::write_conflict());
    }
    let mut work: BTreeMap<(String, String), Collection> = BTreeMap::new();
    for op in &txn.ops {
        let c = match work.entry((op.db.clone(), op.coll.clone())) {
            MapEntry::Occupied(e) => e.into_mut(),
            MapEntry::Vacant(e) => {
                e.insert(st.data.coll(&op.db, &op.coll).cloned().unwrap_or_default())
            }
        };
        replay(c, op)?;
    }
    for ((db, coll), c) in work {
        st.data.dbs.entry(db).or_default().insert(coll, c);
    }
    let tag = Arc::new(TxnTag::new(&txn.id, number));
    st.data.log_batch(txn.ops, &tag);
    Ok(())
}

/// Applies one write of a committing transaction to a committed collection. A clash (a unique
/// key taken or a document gone since the transaction started) is a write conflict.
fn replay(c: &mut Collection, op: &PendingOp) -> Result<(), CommandError> {
    match &op.kind {
        OpKind::Insert { doc } => {
            if c.unique_violation(doc, None).is_some() {
                return Err(CommandError::write_conflict());
            }
            c.insert_record(doc.clone());
        }
        OpKind::Update { id, post, .. } | OpKind::Replace { id, post, .. } => {
            let rid = c
                .by_id
                .get(&value_key(id))
                .copied()
                .ok_or_else(CommandError::write_conflict)?;
            if c.unique_violation(post, Some(rid)).is_some() {
                return Err(CommandError::write_conflict());
            }
            c.docs.insert(rid, post.clone());
        }
        OpKind::Delete { id, .. } => {
            let rid = c
                .by_id
                .get(&value_key(id))
                .copied()
                .ok_or_else(CommandError::write_conflict)?;
            c.remove_record(rid);
        }
        // Collection commands are refused inside a transaction.
        OpKind::Noop | OpKind::Drop | OpKind::Rename { .. } | OpKind::DropDatabase => {}
    }
    Ok(())
}
