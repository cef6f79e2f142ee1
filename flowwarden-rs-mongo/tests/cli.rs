//! The `flowwarden` command-line tool (feature `cli`) against the wire-level emulator, through
//! the real driver: each command's output (text and `--json`), the refusals of
//! `checkpoint reset` and `lease release`, where the runtime resumes after a reset, dead-letter
//! replay through a runtime's admin API, and the exit codes. Most tests call
//! `flowwarden_rs_mongo::cli::invoke` in process (the code the binary runs); the last ones run
//! the built binary.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, DateTime, Document};
use flowwarden::port::{
    DeadLetterRecord, DeadLetterStatus, DeadLetterStore, LeaseStore, StoredPosition,
};
use flowwarden::{HandlerError, ResumeToken};
use flowwarden_rs_mongo::cli::{exit, invoke, Outcome, CLI_OWNER};
use flowwarden_rs_mongo::LeaseDocument;
use futures::FutureExt;
use serde_json::Value;
use support::*;

/// Runs the tool on the target's server and database.
async fn fw(t: &Target, args: &[&str]) -> Outcome {
    let mut all = vec!["flowwarden", "--uri", &t.uri, "--database", &t.db];
    all.extend_from_slice(args);
    invoke(all).await
}

/// Runs the tool with `--json`; the exit code and the parsed stdout.
async fn fw_json(t: &Target, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = fw(t, &all).await;
    let v = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is JSON ({e}): {out:?}"));
    (out.code, v)
}

fn ms_ago(ms: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() - ms)
}

/// A lease document held by `owner` for another `secs` seconds (negative: expired).
async fn put_lease(t: &Target, name: &str, owner: &str, epoch: i64, secs: i64) {
    let d = LeaseDocument {
        stream: name.into(),
        owner: owner.into(),
        epoch,
        expires_at: DateTime::from_millis(DateTime::now().timestamp_millis() + secs * 1000),
    };
    t.coll("_fw_locks")
        .replace_one(doc! {"_id": name}, d.to_document())
        .upsert(true)
        .await
        .expect("lease written");
}

/// A sound checkpoint of `name` at token `_data` = `data`, written `age_ms` ago.
async fn put_checkpoint(t: &Target, name: &str, data: &str, age_ms: i64) {
    let pos = StoredPosition {
        token: ResumeToken::from_document(doc! {"_data": data}),
        cluster_time: None,
        wall_time: None,
        start_after: false,
    };
    let cp = flowwarden::port::Checkpoint {
        stream: name.into(),
        last_processed: Some(pos.clone()),
        last_seen: Some(pos),
        owner: Some("host-1".into()),
        epoch: None,
        updated_at: ms_ago(age_ms),
        snapshot: None,
    };
    t.coll("_fw_checkpoints")
        .replace_one(
            doc! {"_id": name},
            flowwarden::port::codec::encode_checkpoint(&cp),
        )
        .upsert(true)
        .await
        .expect("checkpoint written");
}

async fn raw_checkpoint(t: &Target, name: &str) -> Document {
    t.coll("_fw_checkpoints")
        .find_one(doc! {"_id": name})
        .await
        .expect("read")
        .expect("a checkpoint")
}

fn dead_letter(stream: &str, data: &str, first_ms: i64) -> DeadLetterRecord {
    let token = ResumeToken::from_document(doc! {"_data": data});
    DeadLetterRecord {
        id: DeadLetterRecord::id_for(stream, &token),
        stream: stream.into(),
        event: doc! {"_id": {"_data": data}, "operationType": "insert", "documentKey": {"_id": 1}},
        truncated: false,
        token,
        operation_type: "insert".into(),
        document_key: Some(doc! {"_id": 1}),
        error_chain: vec!["boom".into(), "caused by: the payment service".into()],
        error_kind: "Failed".into(),
        attempts: 3,
        first_failed_at: DateTime::from_millis(first_ms),
        last_failed_at: DateTime::from_millis(first_ms),
        status: DeadLetterStatus::Pending,
        owner: None,
        epoch: None,
    }
}

fn stream_entry<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["streams"]
        .as_array()
        .expect("streams array")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("stream {name} listed: {v:#}"))
}

/// Handles `ids` on stream `name`, then shuts the runtime down (its guard is released).
async fn run_and_stop(t: &Target, name: &'static str, ids: &[i32]) -> Probe {
    let probe = Probe::default();
    let rt = start(t, &probe, def(name, |_| {})).await;
    t.insert_ids(ids.iter().copied()).await;
    wait_until("handled", || probe.successes().len() == ids.len()).await;
    rt.shutdown().await;
    probe
}

/// Starts stream `name`, waits for `expected` to be handled, waits a little longer for
/// anything else, and returns what it handled.
async fn resume_and_collect(
    t: &Target,
    name: &'static str,
    write: &[i32],
    expected: usize,
) -> Vec<bson::Bson> {
    let probe = Probe::default();
    let rt = start(t, &probe, def(name, |_| {})).await;
    t.insert_ids(write.iter().copied()).await;
    wait_until("handled", || probe.successes().len() >= expected).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    rt.shutdown().await;
    probe.handled_keys()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_checkpoint_show_report_positions_leases_and_dead_letters() {
    let t = Target::emulator().await;
    let probe = run_and_stop(&t, "listed", &[1, 2]).await;
    put_lease(&t, "leader-stream", "host-9", 4, 60).await;
    t.backend
        .put(&dead_letter("listed", "82AA", 1_000))
        .await
        .expect("put");
    t.backend
        .put(&dead_letter("listed", "82AB", 2_000))
        .await
        .expect("put");
    let discarded = DeadLetterRecord::id_for(
        "listed",
        &ResumeToken::from_document(doc! {"_data": "82AB"}),
    );
    t.backend
        .set_status(&discarded, DeadLetterStatus::Discarded)
        .await
        .expect("discard");

    let (code, v) = fw_json(&t, &["streams"]).await;
    assert_eq!(code, exit::OK, "{v:#}");
    assert_eq!(v["database"], t.db.as_str());
    let listed = stream_entry(&v, "listed");
    assert_eq!(listed["checkpoint"]["state"], "sound");
    let last = probe.token_for(2).expect("token of 2");
    assert_eq!(
        listed["checkpoint"]["last_processed"]["token"]["_data"],
        last.as_str()
    );
    assert!(listed["checkpoint"]["last_processed"]["cluster_time"]["t"].is_u64());
    assert!(listed["checkpoint"]["saved_secs_ago"]
        .as_i64()
        .is_some_and(|s| s < 60));
    // The graceful shutdown released the guard; the save just now still shows it running.
    let guard = &listed["leases"][0];
    assert_eq!(guard["name"], "listed#checkpoint");
    assert_eq!(guard["kind"], "checkpoint guard");
    assert_eq!(guard["held"], false);
    assert_eq!(listed["running"], true);
    assert!(listed["running_evidence"][0]
        .as_str()
        .is_some_and(|e| e.contains("saved")));
    assert_eq!(listed["dead_letters"]["pending"], 1);
    assert_eq!(listed["dead_letters"]["discarded"], 1);
    let leader = stream_entry(&v, "leader-stream");
    assert_eq!(leader["checkpoint"]["state"], "missing");
    assert_eq!(leader["leases"][0]["held"], true);
    assert_eq!(leader["leases"][0]["owner"], "host-9");
    assert_eq!(leader["leases"][0]["epoch"], 4);
    assert!(leader["leases"][0]["expires_in_secs"]
        .as_i64()
        .is_some_and(|s| s > 50));
    assert_eq!(leader["running"], true);

    // With saves not counted, the stopped stream shows no sign of running.
    let (_, v) = fw_json(&t, &["--stale-after", "0", "streams"]).await;
    assert_eq!(stream_entry(&v, "listed")["running"], false);

    let text = fw(&t, &["streams"]).await;
    assert_eq!(text.code, 0, "{text:?}");
    for needle in [
        "listed: RUNNING",
        "leader-stream",
        "HELD by 'host-9'",
        &last,
        "1 pending, 0 replayed, 1 discarded",
    ] {
        assert!(
            text.stdout.contains(needle),
            "{needle} in:\n{}",
            text.stdout
        );
    }

    let (code, v) = fw_json(&t, &["checkpoint", "show", "listed"]).await;
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["name"], "listed");
    assert_eq!(
        v["checkpoint"]["last_seen"]["token"]["_data"]
            .as_str()
            .map(|s| s >= last.as_str()),
        Some(true)
    );
    let text = fw(&t, &["checkpoint", "show", "listed"]).await;
    assert!(
        text.stdout.contains("lastProcessed") && text.stdout.contains(&last),
        "{}",
        text.stdout
    );
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_is_refused_while_a_lease_is_live_and_done_with_force() {
    let t = Target::emulator().await;
    put_checkpoint(
        &t,
        "leased",
        "8200000000000000010000000000000000000001",
        3_600_000,
    )
    .await;
    put_lease(&t, "leased", "host-2", 7, 60).await;
    let before = raw_checkpoint(&t, "leased").await;
    let to = r#"{"_data": "8200000000000000050000000000000000000001"}"#;
    let out = fw(&t, &["checkpoint", "reset", "leased", "--to-token", to]).await;
    assert_eq!(out.code, exit::REFUSED_RUNNING, "{out:?}");
    for needle in ["looks running", "held by 'host-2'", "--force"] {
        assert!(out.stderr.contains(needle), "{needle}: {}", out.stderr);
    }
    assert_eq!(
        raw_checkpoint(&t, "leased").await,
        before,
        "nothing written"
    );

    let (code, v) = fw_json(
        &t,
        &["checkpoint", "reset", "leased", "--to-token", to, "--force"],
    )
    .await;
    assert_eq!(code, exit::OK, "{v:#}");
    assert_eq!(v["forced"], true);
    assert_eq!(v["gaps"][0]["direction"], "skipped");
    let after = raw_checkpoint(&t, "leased").await;
    for f in ["lastProcessedToken", "lastSeenToken"] {
        assert_eq!(
            after.get_document(f).expect(f),
            &doc! {"_data": "8200000000000000050000000000000000000001"}
        );
    }
    assert_eq!(after.get_str("owner"), Ok(CLI_OWNER));
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_is_refused_after_a_recent_save_and_done_when_stale() {
    let t = Target::emulator().await;
    put_checkpoint(
        &t,
        "saved",
        "8200000000000000030000000000000000000001",
        30_000,
    )
    .await;
    // An expired lease is no sign of running.
    put_lease(&t, "saved#checkpoint", "host-3", 2, -5).await;
    let to = r#"{"_data": "8200000000000000010000000000000000000001"}"#;
    let out = fw(&t, &["checkpoint", "reset", "saved", "--to-token", to]).await;
    assert_eq!(out.code, exit::REFUSED_RUNNING, "{out:?}");
    assert!(
        out.stderr.contains("saved 30 s ago")
            || out.stderr.contains("saved 29 s ago")
            || out.stderr.contains("saved 31 s ago"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("--stale-after 60") && out.stderr.contains("--force"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("host-3"),
        "the expired lease is not evidence: {}",
        out.stderr
    );

    let out = fw(
        &t,
        &[
            "--stale-after",
            "20",
            "checkpoint",
            "reset",
            "saved",
            "--to-token",
            to,
        ],
    )
    .await;
    assert_eq!(out.code, exit::OK, "{out:?}");
    assert!(out.stdout.contains("REPLAYED"), "{}", out.stdout);
    // The tool's own save is no sign of running: a second reset is not refused.
    let out = fw(&t, &["checkpoint", "reset", "saved", "--to-token", to]).await;
    assert_eq!(out.code, exit::OK, "{out:?}");
    assert!(out.stdout.contains("no gap"), "{}", out.stdout);
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_stream_refuses_a_reset() {
    let t = Target::emulator().await;
    let probe = Probe::default();
    let rt = start(&t, &probe, def("live", |_| {})).await;
    t.insert_ids([1]).await;
    wait_until("handled", || probe.successes().len() == 1).await;
    let out = fw(
        &t,
        &[
            "--stale-after",
            "0",
            "checkpoint",
            "reset",
            "live",
            "--to-now",
        ],
    )
    .await;
    assert_eq!(out.code, exit::REFUSED_RUNNING, "{out:?}");
    assert!(
        out.stderr
            .contains("checkpoint guard lease 'live#checkpoint' is held"),
        "{}",
        out.stderr
    );
    rt.shutdown().await;
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_to_now_skips_what_was_written_while_down() {
    let t = Target::emulator().await;
    run_and_stop(&t, "to-now", &[1, 2]).await;
    t.insert_ids([3, 4]).await;
    let (code, v) = fw_json(
        &t,
        &[
            "--stale-after",
            "0",
            "checkpoint",
            "reset",
            "to-now",
            "--to-now",
        ],
    )
    .await;
    assert_eq!(code, exit::OK, "{v:#}");
    assert_eq!(v["mode"], "now");
    let directions: Vec<&Value> = v["gaps"]
        .as_array()
        .expect("gaps")
        .iter()
        .map(|g| &g["direction"])
        .collect();
    assert_eq!(directions, ["skipped", "skipped"], "{v:#}");
    let at = v["new"]["cluster_time"]["t"]
        .as_u64()
        .expect("a cluster time");
    assert!(
        at > 0 && at <= u64::from(t.emu().latest_oplog_time().time),
        "{v:#}"
    );
    let stored = raw_checkpoint(&t, "to-now").await;
    assert_eq!(
        stored.get("lastProcessedToken"),
        stored.get("lastSeenToken")
    );
    // Started afterwards, the runtime gets only what is written after the reset.
    let handled = resume_and_collect(&t, "to-now", &[5], 1).await;
    assert_eq!(handled, ids(&[5]));
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_to_time_replays_from_that_second() {
    let t = Target::emulator().await;
    t.insert_ids([1]).await;
    // The next writes land in a later second than 1.
    let next = DateTime::now().timestamp_millis() / 1000 + 1;
    while DateTime::now().timestamp_millis() < next * 1000 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let at = DateTime::from_millis(next * 1000)
        .try_to_rfc3339_string()
        .expect("rfc3339");
    let probe = Probe::default();
    let rt = start(&t, &probe, def("to-time", |_| {})).await;
    t.insert_ids([2, 3]).await;
    wait_until("handled", || probe.successes().len() == 2).await;
    rt.shutdown().await;

    let out = fw(
        &t,
        &[
            "--stale-after",
            "0",
            "checkpoint",
            "reset",
            "to-time",
            "--to-time",
            &at,
        ],
    )
    .await;
    assert_eq!(out.code, exit::OK, "{out:?}");
    assert!(out.stdout.contains("REPLAYED"), "{}", out.stdout);
    assert!(out.stdout.contains(&format!("at {at}")), "{}", out.stdout);
    let handled = resume_and_collect(&t, "to-time", &[], 2).await;
    assert_eq!(
        handled,
        ids(&[2, 3]),
        "every change from {at} on, nothing before"
    );

    // Outside the retained history, or in the future: refused, nothing written.
    let before = raw_checkpoint(&t, "to-time").await;
    t.emu().keep_last_oplog_entries(1);
    let out = fw(
        &t,
        &[
            "--stale-after",
            "0",
            "checkpoint",
            "reset",
            "to-time",
            "--to-time",
            "2001-01-01T00:00:00Z",
        ],
    )
    .await;
    assert_eq!(out.code, exit::HISTORY_LOST, "{out:?}");
    assert!(
        out.stderr.contains("older than the oldest change"),
        "{}",
        out.stderr
    );
    let out = fw(
        &t,
        &[
            "--stale-after",
            "0",
            "checkpoint",
            "reset",
            "to-time",
            "--to-time",
            "2099-01-01T00:00:00Z",
        ],
    )
    .await;
    assert_eq!(out.code, exit::USAGE, "{out:?}");
    assert!(out.stderr.contains("future"), "{}", out.stderr);
    let out = fw(
        &t,
        &[
            "--stale-after",
            "0",
            "checkpoint",
            "reset",
            "to-time",
            "--to-time",
            "yesterday",
        ],
    )
    .await;
    assert_eq!(out.code, exit::USAGE, "{out:?}");
    assert_eq!(raw_checkpoint(&t, "to-time").await, before);
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_to_token_resumes_just_after_that_change() {
    let t = Target::emulator().await;
    let probe = run_and_stop(&t, "to-token", &[1, 2, 3]).await;
    let token = format!(
        r#"{{"_data": "{}"}}"#,
        probe.token_for(1).expect("token of 1")
    );
    let (code, v) = fw_json(
        &t,
        &[
            "--stale-after",
            "0",
            "checkpoint",
            "reset",
            "to-token",
            "--to-token",
            &token,
        ],
    )
    .await;
    assert_eq!(code, exit::OK, "{v:#}");
    assert_eq!(v["gaps"][0]["from"], "lastProcessed");
    assert_eq!(v["gaps"][0]["direction"], "replayed");
    assert_eq!(
        v["old_positions"]["last_processed"]["token"]["_data"],
        probe.token_for(3).expect("3").as_str()
    );
    let handled = resume_and_collect(&t, "to-token", &[], 2).await;
    assert_eq!(handled, ids(&[2, 3]));
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_list_show_and_discard() {
    let t = Target::emulator().await;
    for (stream, data, at) in [
        ("a", "82A1", 1_000),
        ("a", "82A2", 2_000),
        ("b", "82B1", 3_000),
    ] {
        t.backend
            .put(&dead_letter(stream, data, at))
            .await
            .expect("put");
    }
    let first = dead_letter("a", "82A1", 1_000).id;
    let count = |v: &Value| v["dead_letters"].as_array().map(Vec::len);
    let (code, v) = fw_json(&t, &["dlq", "list"]).await;
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(count(&v), Some(3));
    assert_eq!(v["dead_letters"][0]["id"], first.as_str());
    assert_eq!(
        count(&fw_json(&t, &["dlq", "list", "--stream", "a"]).await.1),
        Some(2)
    );
    assert_eq!(
        count(&fw_json(&t, &["dlq", "list", "--limit", "1"]).await.1),
        Some(1)
    );
    assert_eq!(
        count(
            &fw_json(&t, &["dlq", "list", "--status", "discarded"])
                .await
                .1
        ),
        Some(0)
    );

    let (code, v) = fw_json(&t, &["dlq", "show", &first]).await;
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["stream"], "a");
    assert_eq!(v["status"], "pending");
    assert_eq!(v["error_chain"][1], "caused by: the payment service");
    assert_eq!(v["event"]["documentKey"]["_id"], 1);
    let text = fw(&t, &["dlq", "show", &first]).await;
    assert!(
        text.stdout.contains("boom") && text.stdout.contains("attempts: 3"),
        "{}",
        text.stdout
    );

    let (code, v) = fw_json(&t, &["dlq", "discard", &first]).await;
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["previous_status"], "pending");
    let stored = t.backend.get(&first).await.expect("get").expect("kept");
    assert_eq!(stored.status, DeadLetterStatus::Discarded);
    assert_eq!(
        count(
            &fw_json(&t, &["dlq", "list", "--status", "discarded"])
                .await
                .1
        ),
        Some(1)
    );

    for args in [["dlq", "show", "nope"], ["dlq", "discard", "nope"]] {
        let out = fw(&t, &args).await;
        assert_eq!(out.code, exit::NOT_FOUND, "{out:?}");
        assert!(out.stderr.contains("'nope'"), "{}", out.stderr);
    }
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_replay_goes_through_the_admin_api() {
    let t = Target::emulator().await;
    // Without --admin: refused, before any connection (no --uri needed).
    let out = invoke(["flowwarden", "dlq", "replay", "poison:82AA"]).await;
    assert_eq!(out.code, exit::NEEDS_SERVICE, "{out:?}");
    assert!(
        out.stderr.contains("--admin") && out.stderr.contains("handler"),
        "{}",
        out.stderr
    );

    let failing = Arc::new(AtomicBool::new(true));
    let f = failing.clone();
    let probe = Probe::new(move |ctx| {
        let fail = f.load(Ordering::SeqCst) && ctx.document_key() == Some(&doc! {"_id": 1});
        async move {
            if fail {
                Err(HandlerError::msg("payment service refused"))
            } else {
                Ok(())
            }
        }
        .boxed()
    });
    let d = def("replayed", |_| {});
    let rt = flowwarden::builder()
        .discover(false)
        .any_stream(flowwarden::AnyStream::with_definition(probe.clone(), d))
        .backend(t.backend.clone())
        .max_await(Duration::from_millis(150))
        .checkpoint_guard(SHORT_GUARD)
        .admin("127.0.0.1:0".parse().expect("addr"))
        .admin_token("s3cret")
        .start()
        .await
        .expect("runtime starts");
    wait_status(&rt, "replayed", |s| {
        s.state != flowwarden::StreamState::Starting
    })
    .await;
    t.insert_ids([1]).await;
    let mut id = None;
    for _ in 0..200 {
        if let Some(r) = t
            .backend
            .list(&Default::default())
            .await
            .expect("list")
            .first()
        {
            id = Some(r.id.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let id = id.expect("dead-lettered");
    let admin = format!("http://{}", rt.handle().admin_addr().expect("admin bound"));

    let out = fw(
        &t,
        &["dlq", "replay", &id, "--admin", &admin, "--token", "wrong"],
    )
    .await;
    assert_eq!(out.code, exit::ADMIN_API, "{out:?}");
    assert!(out.stderr.contains("HTTP 401"), "{}", out.stderr);
    let out = fw(
        &t,
        &[
            "dlq",
            "replay",
            "replayed:nope",
            "--admin",
            &admin,
            "--token",
            "s3cret",
        ],
    )
    .await;
    assert_eq!(out.code, exit::NOT_FOUND, "{out:?}");

    failing.store(false, Ordering::SeqCst);
    let (code, v) = fw_json(
        &t,
        &["dlq", "replay", &id, "--admin", &admin, "--token", "s3cret"],
    )
    .await;
    assert_eq!(code, exit::OK, "{v:#}");
    assert_eq!(v["status"], "replayed");
    let stored = t.backend.get(&id).await.expect("get").expect("kept");
    assert_eq!(stored.status, DeadLetterStatus::Replayed);
    assert_eq!(
        probe.handled_keys(),
        ids(&[1]),
        "the handler ran again and succeeded"
    );
    rt.shutdown().await;
    let out = fw(
        &t,
        &["dlq", "replay", &id, "--admin", &admin, "--token", "s3cret"],
    )
    .await;
    assert_eq!(out.code, exit::ADMIN_API, "service gone: {out:?}");
    assert!(
        out.stderr.contains("cannot reach the admin API"),
        "{}",
        out.stderr
    );
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_show_and_release() {
    let t = Target::emulator().await;
    put_lease(&t, "leader", "host-1", 4, 60).await;
    put_lease(&t, "guarded#checkpoint", "host-2", 1, -10).await;
    let (code, v) = fw_json(&t, &["lease", "show", "leader"]).await;
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["leases"][0]["name"], "leader");
    assert_eq!(v["leases"][0]["held"], true);
    assert_eq!(v["leases"][0]["owner"], "host-1");
    let (_, v) = fw_json(&t, &["lease", "show", "guarded"]).await;
    assert_eq!(v["leases"][0]["name"], "guarded#checkpoint");
    assert_eq!(v["leases"][0]["held"], false);

    let out = fw(&t, &["lease", "release", "leader"]).await;
    assert_eq!(out.code, exit::REFUSED_RUNNING, "{out:?}");
    assert!(
        out.stderr.contains("held by 'host-1'") && out.stderr.contains("--force"),
        "{}",
        out.stderr
    );
    assert!(
        t.backend
            .current("leader")
            .await
            .expect("read")
            .expect("kept")
            .expires_at
            > DateTime::now()
    );

    let (code, v) = fw_json(&t, &["lease", "release", "leader", "--force"]).await;
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["released"], true);
    let after = t
        .backend
        .current("leader")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(after.epoch, 4, "the epoch is kept");
    assert!(after.expires_at <= t.emu().server_time(), "free now");
    // A standby takes it at once, with the next epoch.
    let taken = t
        .backend
        .try_acquire("leader", "host-2", Duration::from_secs(10))
        .await
        .expect("acquire");
    assert_eq!(taken.map(|l| l.epoch), Some(5));

    let (code, v) = fw_json(&t, &["lease", "release", "guarded#checkpoint"]).await;
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["released"], false, "already free");
    let out = fw(&t, &["lease", "release", "guarded"]).await;
    assert_eq!(out.code, exit::NOT_FOUND, "{out:?}");
    assert!(
        out.stderr.contains("guarded#checkpoint"),
        "hint: {}",
        out.stderr
    );
    assert_eq!(
        fw(&t, &["lease", "show", "nope"]).await.code,
        exit::NOT_FOUND
    );
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_for_bad_uri_unreachable_unknown_stream_and_corrupt_checkpoint() {
    let t = Target::emulator().await;
    let out = invoke(["flowwarden", "--uri", "notmongo://h", "streams"]).await;
    assert_eq!(out.code, exit::BAD_CONFIG, "{out:?}");
    let out = invoke([
        "flowwarden",
        "--uri",
        &t.uri,
        "--database",
        "a.b",
        "streams",
    ])
    .await;
    assert_eq!(out.code, exit::BAD_CONFIG, "{out:?}");
    let out = invoke([
        "flowwarden",
        "--json",
        "--timeout",
        "1",
        "--uri",
        "mongodb://127.0.0.1:1/?directConnection=true",
        "streams",
    ])
    .await;
    assert_eq!(out.code, exit::UNREACHABLE, "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).expect("JSON error");
    assert_eq!(v["code"], "unreachable");
    assert_eq!(v["exit_code"], exit::UNREACHABLE);

    put_checkpoint(&t, "known", "82AA", 0).await;
    let out = fw(&t, &["checkpoint", "show", "nope"]).await;
    assert_eq!(out.code, exit::NOT_FOUND, "{out:?}");
    assert!(
        out.stderr.contains("'nope'") && out.stderr.contains("known"),
        "{}",
        out.stderr
    );
    let out = fw(&t, &["checkpoint", "reset", "nope", "--to-now"]).await;
    assert_eq!(out.code, exit::NOT_FOUND, "a typo creates nothing: {out:?}");

    t.coll("_fw_checkpoints")
        .insert_one(doc! {"_id": "broken", "v": 1, "lastSeenToken": "garbage", "updatedAt": ms_ago(3_600_000)})
        .await
        .expect("insert");
    let out = fw(&t, &["checkpoint", "show", "broken"]).await;
    assert_eq!(out.code, exit::CORRUPT, "{out:?}");
    for needle in [
        "'broken'",
        "lastSeenToken",
        "docs/runbooks/corrupt-checkpoint.md",
    ] {
        assert!(out.stderr.contains(needle), "{needle}: {}", out.stderr);
    }
    let (code, v) = fw_json(&t, &["checkpoint", "show", "broken"]).await;
    assert_eq!(
        (code, v["code"].as_str()),
        (exit::CORRUPT, Some("corrupt_checkpoint"))
    );
    // The listing still works and marks it; a reset repairs it.
    let (_, v) = fw_json(&t, &["streams"]).await;
    assert_eq!(stream_entry(&v, "broken")["checkpoint"]["state"], "corrupt");
    let out = fw(&t, &["checkpoint", "reset", "broken", "--to-now"]).await;
    assert_eq!(out.code, exit::OK, "{out:?}");
    assert!(out.stdout.contains("was corrupt"), "{}", out.stdout);
    assert_eq!(
        fw(&t, &["checkpoint", "show", "broken"]).await.code,
        exit::OK
    );
    t.finish().await;
}

/// Runs the built binary with the target in the environment.
async fn binary(t: &Target, args: &[&str]) -> std::process::Output {
    let (uri, db) = (t.uri.clone(), t.db.clone());
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_flowwarden"))
            .args(&args)
            .env(flowwarden_rs_mongo::ENV_URI, uri)
            .env(flowwarden_rs_mongo::ENV_DATABASE, db)
            .env_remove(flowwarden_rs_mongo::cli::ENV_ADMIN_URL)
            .output()
            .expect("the binary runs")
    })
    .await
    .expect("joined")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reads_the_environment_and_exits_with_the_documented_codes() {
    let t = Target::emulator().await;
    put_checkpoint(&t, "bin", "82AA", 3_600_000).await;
    let out = binary(&t, &["--json", "streams"]).await;
    assert_eq!(out.status.code(), Some(exit::OK), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(
        stream_entry(&v, "bin")["checkpoint"]["last_seen"]["token"]["_data"],
        "82AA"
    );

    let out = binary(&t, &["checkpoint", "show", "nope"]).await;
    assert_eq!(out.status.code(), Some(exit::NOT_FOUND), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no checkpoint named 'nope'"));
    let out = binary(&t, &["--uri", "bogus", "streams"]).await;
    assert_eq!(
        out.status.code(),
        Some(exit::BAD_CONFIG),
        "--uri wins over the environment: {out:?}"
    );
    let out = binary(&t, &["dlq", "replay", "x"]).await;
    assert_eq!(out.status.code(), Some(exit::NEEDS_SERVICE), "{out:?}");
    let out = binary(&t, &["checkpoint", "reset", "bin"]).await;
    assert_eq!(
        out.status.code(),
        Some(exit::USAGE),
        "a target is required: {out:?}"
    );
    let out = binary(&t, &["--help"]).await;
    assert_eq!(out.status.code(), Some(exit::OK));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Exit codes:"));
    t.finish().await;
}
