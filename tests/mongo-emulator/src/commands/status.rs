//! Server status: `replSetGetStatus` and `serverStatus`.

use bson::{doc, Document};

use super::{ok, truthy, CmdResult, State};
use crate::error::CommandError;

pub(super) fn repl_status(st: &mut State) -> CmdResult {
    let d = &st.data;
    let head = d.oplog.back();
    let optime = doc! {"ts": d.head_ts, "t": 1i64};
    let wall = head.map_or_else(bson::DateTime::now, |e| e.wall);
    let mut reply = doc! {
        "set": "rs0",
        "date": bson::DateTime::now(),
        "myState": 1,
        "term": 1i64,
        "members": [{
            "_id": 0,
            "name": st.me.clone(),
            "health": 1.0,
            "state": 1,
            "stateStr": "PRIMARY",
            "optime": optime.clone(),
            "optimeDate": wall,
            "self": true,
        }],
        "optimes": {
            "lastCommittedOpTime": optime.clone(),
            "appliedOpTime": optime.clone(),
            "durableOpTime": optime,
        },
    };
    if let Some(first) = d.oplog.front() {
        reply.insert(
            "oldestOplogEntry",
            doc! {"ts": first.ts, "wall": first.wall},
        );
    }
    reply.insert("ok", 1.0);
    ok(reply)
}

/// `serverStatus`: a few identifying fields, and with `oplog: 1` the `oplog` section
/// (`latestOptime`, `earliestOptime`) that a real `mongod` returns only when asked for it.
pub(super) fn server_status(st: &State, body: &Document) -> CmdResult {
    if st.deny_server_status {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            "not authorized on admin to execute command { serverStatus: 1 }",
        ));
    }
    let d = &st.data;
    let mut reply = doc! {
        "host": st.me.clone(),
        "version": "0.0.0-emulator",
        "process": "mongod",
        "localTime": st.now(),
    };
    if truthy(body.get("oplog")) {
        let mut oplog = doc! {"latestOptime": d.head_ts};
        if let Some(first) = d.oplog.front() {
            oplog.insert("earliestOptime", first.ts);
        }
        reply.insert("oplog", oplog);
    }
    reply.insert("ok", 1.0);
    ok(reply)
}
