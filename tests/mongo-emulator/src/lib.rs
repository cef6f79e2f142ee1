//! A wire-level emulator of a MongoDB replica-set primary — test infrastructure, **not MongoDB**.
//!
//! It speaks enough of the wire protocol (OP_MSG) for the real `mongodb` driver (3.x) to run
//! CRUD and change streams against it over TCP on a loopback port, and lets a test inject the
//! failures that matter to a change-stream consumer: resumable errors, lost history, dropped
//! connections, step-down, delays. Everything is deterministic: no randomness, no timers except
//! the ones a test asks for.
//!
//! ```no_run
//! # async fn demo() -> Result<(), mongo_emulator::EmulatorError> {
//! let emu = mongo_emulator::Emulator::start().await?;
//! let uri = emu.uri(); // mongodb://127.0.0.1:PORT/?replicaSet=rs0
//! emu.fail_get_more(1, mongo_emulator::CommandError::shutdown_in_progress());
//! # let _ = uri; Ok(()) }
//! ```
//!
//! What it emulates and where it deviates is listed in `docs/testing/mongo-emulator.md`.

mod changestream;
mod commands;
mod error;
mod server;
mod state;
mod txn;
mod wire;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{Bson, Document, Timestamp};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use error::{CommandError, EmulatorError};

use commands::State;
use server::{FailRule, Faults, Shared};
use state::Token;

/// Default oplog capacity, in entries.
pub const DEFAULT_OPLOG_CAPACITY: usize = 1_000_000;

/// Default transaction lifetime limit: 60 s, the server's default.
pub const DEFAULT_TRANSACTION_LIFETIME_LIMIT: Duration = Duration::from_secs(60);

/// Start-up options.
#[derive(Debug, Clone)]
pub struct EmulatorOptions {
    /// Port to listen on (on 127.0.0.1); 0 picks a free port.
    pub port: u16,
    /// How many oplog entries are retained; older ones are discarded (their history is lost).
    pub oplog_capacity: usize,
    /// How long a transaction may stay open, in server time (the real clock plus
    /// [`Emulator::advance_clock`]), before it is aborted, like the server's
    /// `transactionLifetimeLimitSeconds`. Default [`DEFAULT_TRANSACTION_LIFETIME_LIMIT`].
    pub transaction_lifetime_limit: Duration,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        EmulatorOptions {
            port: 0,
            oplog_capacity: DEFAULT_OPLOG_CAPACITY,
            transaction_lifetime_limit: DEFAULT_TRANSACTION_LIFETIME_LIMIT,
        }
    }
}

/// A running emulator. Dropping the handle stops it and closes every connection.
#[derive(Debug)]
pub struct Emulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.accept.abort();
        self.close_connections();
    }
}

impl Emulator {
    /// Starts an emulator on a free loopback port with default options.
    pub async fn start() -> Result<Emulator, EmulatorError> {
        Emulator::start_with(EmulatorOptions::default()).await
    }

    /// Starts an emulator with the given options. Must be called inside a tokio runtime; the
    /// emulator's tasks run on that runtime.
    pub async fn start_with(options: EmulatorOptions) -> Result<Emulator, EmulatorError> {
        let listener = TcpListener::bind(("127.0.0.1", options.port))
            .await
            .map_err(|source| EmulatorError::Bind {
                port: options.port,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| EmulatorError::Bind {
                port: options.port,
                source,
            })?;
        let me = addr.to_string();
        let (kill_tx, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(
                options.oplog_capacity,
                me.clone(),
                options.transaction_lifetime_limit,
            )),
            faults: Mutex::new(Faults::default()),
            kill_tx,
            me,
            next_conn: AtomicI64::new(1),
            accepted: AtomicU64::new(0),
        });
        let accept = tokio::spawn(server::accept_loop(listener, shared.clone()));
        tracing::info!(%addr, "mongo emulator listening (test infrastructure, not MongoDB)");
        Ok(Emulator {
            shared,
            addr,
            accept,
        })
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `mongodb://127.0.0.1:PORT/?replicaSet=rs0` (replica-set discovery, as in production).
    pub fn uri(&self) -> String {
        format!("mongodb://{}/?replicaSet=rs0", self.addr)
    }

    /// `mongodb://127.0.0.1:PORT/?directConnection=true` (no discovery).
    pub fn uri_direct(&self) -> String {
        format!("mongodb://{}/?directConnection=true", self.addr)
    }

    // ----- fault injection -------------------------------------------------------------------

    /// Makes the next `times` commands named `command` (as sent: `getMore`, `aggregate`,
    /// `insert`, `find`, `hello`, ...) fail with `error` before doing anything. Rules for
    /// different commands are independent; a new rule for the same command replaces the old one.
    pub fn fail_command(&self, command: &str, times: u32, error: CommandError) {
        let mut f = self.shared.faults();
        f.rules.retain(|r| r.command != command);
        if times > 0 {
            f.rules.push(FailRule {
                command: command.to_string(),
                remaining: times,
                error,
            });
        }
    }

    /// Makes the next `times` `getMore` commands fail with `error`.
    pub fn fail_get_more(&self, times: u32, error: CommandError) {
        self.fail_command("getMore", times, error);
    }

    /// Makes the next `times` `aggregate` commands fail with `error`.
    pub fn fail_aggregate(&self, times: u32, error: CommandError) {
        self.fail_command("aggregate", times, error);
    }

    /// Makes the next `times` `commitTransaction` commands that succeed reply with `error`
    /// instead: the commit **is** applied (its writes are visible and streamed), only the
    /// reply is lost, as when a primary commits and then fails before answering. The first
    /// such command applies the transaction; a retry of a committed transaction applies
    /// nothing and also counts. Labelled `RetryableWriteError` (for example
    /// [`CommandError::interrupted_due_to_repl_state_change`]), the driver retries the commit
    /// once by itself; a second failure reaches the caller labelled
    /// `UnknownTransactionCommitResult`. A new call replaces the pending rule.
    pub fn fail_commit_after_applying(&self, times: u32, error: CommandError) {
        self.shared.faults().commit_after = (times > 0).then(|| FailRule {
            command: "commitTransaction".to_string(),
            remaining: times,
            error,
        });
    }

    /// Removes every pending injected failure (including
    /// [`Emulator::fail_commit_after_applying`]).
    pub fn clear_failures(&self) {
        let mut f = self.shared.faults();
        f.rules.clear();
        f.commit_after = None;
    }

    /// Drops every open client connection now (the driver sees network errors and reconnects).
    pub fn close_connections(&self) {
        self.shared.kill_tx.send_modify(|g| *g += 1);
    }

    /// Steps down: `hello` answers `isWritablePrimary: false, secondary: true`, and every
    /// command except the handshake, `ping`, `buildInfo`, `endSessions`, `killCursors` and
    /// `replSetGetStatus` fails with 10107 NotWritablePrimary (labelled
    /// `ResumableChangeStreamError` on a change stream `getMore`, `RetryableWriteError` on a
    /// retryable write), until [`Emulator::step_up`].
    ///
    /// Like a server that steps down, it aborts every open transaction.
    pub fn step_down(&self) {
        self.shared.faults().stepped_down = true;
        let mut st = self.shared.state();
        st.txn.abort_all("the primary stepped down");
        commands::sync_versions(&mut st);
    }

    /// Ends a step-down.
    pub fn step_up(&self) {
        self.shared.faults().stepped_down = false;
    }

    /// Moves the server's clock (`$$NOW` in queries and pipeline updates, the cluster and wall
    /// times of later oplog entries) forward by `by`, as if that much time had passed on the
    /// server only: leases judged by server time expire while the clients' own timers have
    /// not moved, and a write after the jump is `by` newer than the one before it (for lag).
    pub fn advance_clock(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        let mut st = self.shared.state();
        st.data.clock_offset_ms = st.data.clock_offset_ms.saturating_add(ms);
    }

    /// The server's time now (the real clock plus every [`Emulator::advance_clock`]).
    pub fn server_time(&self) -> bson::DateTime {
        self.shared.state().now()
    }

    /// Delays every reply by `delay` (`None` removes the delay).
    pub fn delay_replies(&self, delay: Option<Duration>) {
        self.shared.faults().delay_all = delay;
    }

    /// Delays replies to commands named `command` by `delay` (`None` removes it). Takes
    /// precedence over [`Emulator::delay_replies`].
    pub fn delay_command(&self, command: &str, delay: Option<Duration>) {
        let mut f = self.shared.faults();
        match delay {
            Some(d) => {
                f.delays.insert(command.to_string(), d);
            }
            None => {
                f.delays.remove(command);
            }
        }
    }

    /// How many commands named `command` were received (including failed and injected ones).
    pub fn command_count(&self, command: &str) -> u64 {
        self.shared
            .faults()
            .counts
            .get(command)
            .copied()
            .unwrap_or(0)
    }

    /// Resets every command counter to zero.
    pub fn reset_command_counts(&self) {
        self.shared.faults().counts.clear();
    }

    /// How many TCP connections were accepted since start.
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(AtomicOrdering::Relaxed)
    }

    // ----- oplog control -------------------------------------------------------------------

    /// Discards every oplog entry up to and including the position of `token` (a change
    /// event's `_id` or a post-batch resume token issued by this emulator). Resuming from
    /// `token` or anything older then fails with 286 ChangeStreamHistoryLost, and open streams
    /// that had not read past it fail on their next `getMore`.
    pub fn truncate_oplog_through(&self, token: &Document) -> Result<(), EmulatorError> {
        let t = Token::parse(&Bson::Document(token.clone()))
            .map_err(|e| EmulatorError::BadToken(e.errmsg))?;
        self.shared.state().data.truncate_before(t.pos + 1);
        Ok(())
    }

    /// Keeps only the newest `n` oplog entries.
    pub fn keep_last_oplog_entries(&self, n: usize) {
        let mut st = self.shared.state();
        let first = (st.data.head_pos + 1).saturating_sub(n as u64);
        st.data.truncate_before(first);
    }

    /// Refuses (`true`) or allows `find` on `local.oplog.rs`: refused, it fails with 13
    /// Unauthorized, as for a user without the `find` privilege on `local`.
    pub fn deny_oplog_reads(&self, deny: bool) {
        self.shared.state().deny_oplog_reads = deny;
    }

    /// Refuses (`true`) or allows `serverStatus`: refused, it fails with 13 Unauthorized, as
    /// for a user without the `serverStatus` action (role `clusterMonitor`).
    pub fn deny_server_status(&self, deny: bool) {
        self.shared.state().deny_server_status = deny;
    }

    /// Makes every write after `token` (a post-batch or event token of this emulator, e.g.
    /// [`Emulator::head_resume_token`] taken earlier) race the next change stream opened
    /// without a start option (at "now"): it starts right after `token`, as a real server
    /// does for writes that commit while it opens the stream, so its first batch carries
    /// those events (and the driver reports no start position). One-shot.
    pub fn race_writes_since(&self, token: &Document) -> Result<(), EmulatorError> {
        let t = Token::parse(&Bson::Document(token.clone()))
            .map_err(|e| EmulatorError::BadToken(e.errmsg))?;
        self.shared.state().open_at_now_after = Some(t.pos);
        Ok(())
    }

    /// Timestamp of the oldest retained oplog entry (what `local.oplog.rs` sorted by
    /// `$natural: 1` returns first).
    pub fn oldest_oplog_time(&self) -> Option<Timestamp> {
        self.shared.state().data.oplog.front().map(|e| e.ts)
    }

    /// Timestamp of the newest oplog entry (the `operationTime` of the last write).
    pub fn latest_oplog_time(&self) -> Timestamp {
        self.shared.state().data.head_ts
    }

    /// Number of retained oplog entries.
    pub fn oplog_len(&self) -> usize {
        self.shared.state().data.oplog.len()
    }

    /// A resume token for the current oplog head: resuming after it yields only later events.
    pub fn head_resume_token(&self) -> Document {
        let st = self.shared.state();
        st.data.high_water(st.data.head_pos).to_document()
    }

    // ----- data helpers ----------------------------------------------------------------------

    /// Inserts a document without going through the wire (it is logged and streamed like any
    /// insert). An `_id` is added when missing.
    pub fn insert_direct(&self, db: &str, coll: &str, doc: &Document) -> Result<(), EmulatorError> {
        commands::insert_direct(&mut self.shared.state(), db, coll, doc)
            .map_err(EmulatorError::WriteRefused)
    }

    /// Every document of a collection, in natural order.
    pub fn documents(&self, db: &str, coll: &str) -> Result<Vec<Document>, EmulatorError> {
        let st = self.shared.state();
        let c = st
            .data
            .coll(db, coll)
            .ok_or_else(|| EmulatorError::NoSuchCollection(format!("{db}.{coll}")))?;
        Ok(c.docs.values().map(|d| (**d).clone()).collect())
    }

    /// Number of open cursors (find and change stream).
    pub fn open_cursors(&self) -> usize {
        self.shared.state().cursors.len()
    }

    // ----- transactions ------------------------------------------------------------------

    /// How many transactions committed (retried commits of a committed transaction not
    /// counted again).
    pub fn transactions_committed(&self) -> u64 {
        self.shared.state().txn.committed
    }

    /// How many transactions were aborted: by `abortTransaction`, a failed command or commit,
    /// a write conflict, a newer transaction on the session, `endSessions`, step-down, an
    /// injected `TransientTransactionError`, or the lifetime limit (counted when noticed: at
    /// the next command or observation).
    pub fn transactions_aborted(&self) -> u64 {
        let mut st = self.shared.state();
        commands::expire_transactions(&mut st);
        st.txn.aborted
    }

    /// Number of open transactions (after aborting those past the lifetime limit).
    pub fn open_transactions(&self) -> usize {
        let mut st = self.shared.state();
        commands::expire_transactions(&mut st);
        st.txn.open()
    }
}
