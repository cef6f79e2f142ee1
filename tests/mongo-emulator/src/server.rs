//! The listener, one task per connection, and the command pipeline (faults, delays,
//! step-down, dispatch, cluster time).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::commands::{self, Reply, State};
use crate::error::{CommandError, TRANSIENT_TRANSACTION_ERROR};
use crate::wire::{self, FLAG_MORE_TO_COME};

/// An injected failure: the next `remaining` commands named `command` fail with `error`.
#[derive(Debug, Clone)]
pub(crate) struct FailRule {
    pub(crate) command: String,
    pub(crate) remaining: u32,
    pub(crate) error: CommandError,
}

/// Test-controlled behaviour.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    pub(crate) rules: Vec<FailRule>,
    pub(crate) delay_all: Option<Duration>,
    pub(crate) delays: HashMap<String, Duration>,
    pub(crate) stepped_down: bool,
    pub(crate) counts: HashMap<String, u64>,
    /// The next `remaining` successful `commitTransaction`s reply with this error after
    /// committing.
    pub(crate) commit_after: Option<FailRule>,
}

/// State shared by the handle and every connection task.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) faults: Mutex<Faults>,
    /// Bumped to make every connection task drop its socket.
    pub(crate) kill_tx: watch::Sender<u64>,
    pub(crate) me: String,
    pub(crate) next_conn: AtomicI64,
    pub(crate) accepted: AtomicU64,
}

impl Shared {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Commands answered while stepped down (everything else gets 10107 NotWritablePrimary).
const ALWAYS_ALLOWED: [&str; 10] = [
    "hello",
    "isMaster",
    "ismaster",
    "ping",
    "buildInfo",
    "buildinfo",
    "endSessions",
    "killCursors",
    "replSetGetStatus",
    "killAllSessions",
];

const WRITES: [&str; 5] = [
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
];

pub(crate) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                shared.accepted.fetch_add(1, AtomicOrdering::Relaxed);
                let conn_id = shared.next_conn.fetch_add(1, AtomicOrdering::Relaxed);
                debug!(%peer, conn_id, "connection accepted");
                let shared = shared.clone();
                tokio::spawn(async move {
                    serve_connection(stream, shared, conn_id).await;
                });
            }
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>, conn_id: i64) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let mut wr = BufWriter::with_capacity(64 * 1024, wr);
    let mut kill = shared.kill_tx.subscribe();
    let mut in_buf = Vec::new();
    let mut out_buf = Vec::new();
    let mut reply_id: i32 = 1;
    loop {
        let request = tokio::select! {
            r = wire::read_request(&mut rd, &mut in_buf) => r,
            _ = kill.changed() => break,
        };
        let request = match request {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                warn!(conn_id, error = %e, "closing connection after an unreadable message");
                break;
            }
        };
        let reply = match request.body {
            Ok(body) => {
                tokio::select! {
                    r = execute(&shared, conn_id, body) => r,
                    _ = kill.changed() => break,
                }
            }
            Err(e) => {
                let err =
                    CommandError::new(22, "InvalidBSON", format!("invalid BSON in request: {e}"));
                Reply::Doc(err.to_document())
            }
        };
        if request.flags & FLAG_MORE_TO_COME != 0 {
            continue;
        }
        reply_id = reply_id.wrapping_add(1);
        if let Err(e) = wire::encode_reply(&mut out_buf, reply_id, request.request_id, &reply) {
            warn!(conn_id, error = %e, "reply could not be encoded");
            let err = CommandError::new(
                10334,
                "BSONObjectTooLarge",
                format!("reply could not be encoded: {e}"),
            );
            if wire::encode_reply(
                &mut out_buf,
                reply_id,
                request.request_id,
                &Reply::Doc(err.to_document()),
            )
            .is_err()
            {
                break;
            }
        }
        if wr.write_all(&out_buf).await.is_err() || wr.flush().await.is_err() {
            break;
        }
    }
    debug!(conn_id, "connection closed");
}

/// Runs one command through faults, delays and step-down, then dispatches it.
pub(crate) async fn execute(shared: &Shared, conn_id: i64, body: Document) -> Reply {
    let name = body.keys().next().cloned().unwrap_or_default();
    let db = body.get_str("$db").unwrap_or("admin").to_string();
    let (injected, delay, stepped_down) = {
        let mut f = shared.faults();
        *f.counts.entry(name.clone()).or_insert(0) += 1;
        let injected = f
            .rules
            .iter_mut()
            .find(|r| r.command == name && r.remaining > 0)
            .map(|r| {
                r.remaining -= 1;
                r.error.clone()
            });
        f.rules.retain(|r| r.remaining > 0);
        let delay = f.delays.get(&name).copied().or(f.delay_all);
        (injected, delay, f.stepped_down)
    };
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let in_txn = body.contains_key("autocommit");
    let ends_txn = matches!(name.as_str(), "commitTransaction" | "abortTransaction");
    let result = if let Some(err) = injected {
        debug!(command = %name, code = err.code, "injected failure");
        if in_txn {
            commands::abort_after_injected(&mut shared.state(), &body, &err);
        }
        Err(err)
    } else if stepped_down && !ALWAYS_ALLOWED.contains(&name.as_str()) {
        let mut err = CommandError::not_writable_primary();
        if name == "getMore" && commands::is_change_cursor(&shared.state(), &body) {
            err = err.with_label("ResumableChangeStreamError");
        }
        if (WRITES.contains(&name.as_str()) && body.contains_key("txnNumber") && !in_txn)
            || ends_txn
        {
            err = err.with_label("RetryableWriteError");
        } else if in_txn {
            err = err.with_label(TRANSIENT_TRANSACTION_ERROR);
        }
        Err(err)
    } else {
        match name.as_str() {
            "hello" | "isMaster" | "ismaster" => {
                Ok(Reply::Doc(hello(shared, conn_id, stepped_down)))
            }
            "getMore" if !in_txn => get_more(shared, &body).await,
            _ => commands::run_sync(&mut shared.state(), &name, &db, &body),
        }
    };
    let result = if name == "commitTransaction" {
        fail_after_commit(shared, result)
    } else {
        result
    };
    let reply = result.unwrap_or_else(|e| Reply::Doc(e.to_document()));
    let ts = shared.state().data.head_ts;
    commands::finish(reply, ts)
}

/// Replaces the reply to a successful `commitTransaction` by the error of a pending
/// [`crate::Emulator::fail_commit_after_applying`] rule (the commit stays applied).
fn fail_after_commit(
    shared: &Shared,
    result: Result<Reply, CommandError>,
) -> Result<Reply, CommandError> {
    let succeeded = matches!(&result, Ok(Reply::Doc(d)) if d.get_f64("ok").is_ok_and(|v| v == 1.0));
    if !succeeded {
        return result;
    }
    let mut f = shared.faults();
    let Some(rule) = f.commit_after.as_mut() else {
        return result;
    };
    rule.remaining = rule.remaining.saturating_sub(1);
    let err = rule.error.clone();
    if rule.remaining == 0 {
        f.commit_after = None;
    }
    debug!(code = err.code, "commit applied, injected failure replied");
    Err(err)
}

fn hello(shared: &Shared, conn_id: i64, stepped_down: bool) -> Document {
    let (ts, wall) = {
        let st = shared.state();
        (
            st.data.head_ts,
            st.data
                .oplog
                .back()
                .map_or_else(bson::DateTime::now, |e| e.wall),
        )
    };
    let mut d = doc! {
        "helloOk": true,
        "isWritablePrimary": !stepped_down,
        "ismaster": !stepped_down,
        "secondary": stepped_down,
        "setName": "rs0",
        "setVersion": 1,
        "hosts": [shared.me.clone()],
        "me": shared.me.clone(),
    };
    if !stepped_down {
        d.insert("primary", shared.me.clone());
        d.insert(
            "electionId",
            Bson::ObjectId(ObjectId::from_bytes([
                0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1,
            ])),
        );
    }
    d.extend(doc! {
        "lastWrite": {
            "opTime": {"ts": ts, "t": 1i64},
            "lastWriteDate": wall,
            "majorityOpTime": {"ts": ts, "t": 1i64},
            "majorityWriteDate": wall,
        },
        "maxBsonObjectSize": 16_777_216,
        "maxMessageSizeBytes": 48_000_000,
        "maxWriteBatchSize": 100_000,
        "localTime": bson::DateTime::now(),
        "logicalSessionTimeoutMinutes": 30,
        "connectionId": i32::try_from(conn_id).unwrap_or(i32::MAX),
        "minWireVersion": 0,
        "maxWireVersion": 21,
        "readOnly": false,
        "emulator": "flowwarden mongo-emulator: test infrastructure, not MongoDB",
        "ok": 1.0,
    });
    d
}

async fn get_more(shared: &Shared, body: &Document) -> Result<Reply, CommandError> {
    let max_time = match body.get("maxTimeMS") {
        Some(Bson::Int32(n)) => u64::try_from(*n).unwrap_or(0),
        Some(Bson::Int64(n)) => u64::try_from(*n).unwrap_or(0),
        _ => 1000,
    };
    let deadline = Instant::now() + Duration::from_millis(max_time);
    loop {
        let step = {
            let mut st = shared.state();
            commands::get_more_step(&mut st, body, Instant::now() >= deadline)?
        };
        match step {
            Ok(reply) => return Ok(reply),
            Err(mut rx) => {
                if let Ok(Err(_)) = tokio::time::timeout_at(deadline, rx.changed()).await {
                    tokio::time::sleep_until(deadline).await;
                }
            }
        }
    }
}
