//! The lease store on `_fw_locks` and the fencing of checkpoint and dead-letter writes, through
//! the real `mongodb` driver against the wire-level emulator, whose clock the tests move to
//! expire leases by the server's time.

mod common;

use std::time::Duration;

use bson::{doc, DateTime, Document};
use common::*;
use flowwarden::port::PutOutcome;
use flowwarden::port::{
    Checkpoint, CheckpointStore, DeadLetterRecord, DeadLetterStore, Fence, LeaseStore,
    StoreErrorKind, StoredPosition,
};
use flowwarden::ResumeToken;

const LEASE: Duration = Duration::from_secs(30);

fn checkpoint(stream: &str, data: &str, epoch: i64) -> Checkpoint {
    let pos = StoredPosition {
        token: ResumeToken::from_document(doc! {"_data": data}),
        cluster_time: None,
        wall_time: None,
        start_after: false,
    };
    Checkpoint {
        stream: stream.into(),
        last_processed: Some(pos.clone()),
        last_seen: Some(pos),
        owner: Some(format!("owner-{epoch}")),
        epoch: Some(epoch),
        updated_at: DateTime::now(),
        snapshot: None,
    }
}

fn fence(owner: &str, epoch: i64) -> Fence {
    Fence {
        owner: owner.into(),
        epoch,
    }
}

#[tokio::test]
async fn leases_are_taken_renewed_and_released_by_the_servers_clock() {
    bounded(async {
        let (emu, backend) = emulator().await;
        let before = emu.server_time();
        let a = backend
            .try_acquire("orders", "a", LEASE)
            .await
            .expect("store")
            .expect("free: taken");
        assert_eq!((a.owner.as_str(), a.epoch), ("a", 1));
        let ms = a.expires_at.timestamp_millis() - before.timestamp_millis();
        assert!((30_000..31_000).contains(&ms), "server time + lease: {ms}");
        assert_eq!(
            backend.try_acquire("orders", "b", LEASE).await,
            Ok(None),
            "held by a"
        );
        assert_eq!(
            backend.current("orders").await.expect("current"),
            Some(a.clone())
        );

        // Time passes on the server only: a's lease lapses although a's own clock did not move.
        emu.advance_clock(Duration::from_secs(20));
        let renewed = backend
            .renew(&a, LEASE)
            .await
            .expect("store")
            .expect("still a's");
        assert_eq!(renewed.epoch, 1, "a renewal keeps the epoch");
        assert!(renewed.expires_at > a.expires_at);
        emu.advance_clock(Duration::from_secs(31));
        let b = backend
            .try_acquire("orders", "b", LEASE)
            .await
            .expect("store")
            .expect("expired: taken over");
        assert_eq!((b.owner.as_str(), b.epoch), ("b", 2));
        assert_eq!(
            backend.renew(&renewed, LEASE).await,
            Ok(None),
            "a's lease is gone"
        );

        // Releasing frees at once and keeps the epoch growing.
        backend.release(&renewed).await.expect("a stale release");
        assert_eq!(backend.try_acquire("orders", "a", LEASE).await, Ok(None));
        backend.release(&b).await.expect("release");
        let again = backend
            .try_acquire("orders", "a", LEASE)
            .await
            .expect("store")
            .expect("released: free");
        assert_eq!(again.epoch, 3);
        // Streams are independent.
        let other = backend
            .try_acquire("payments", "b", LEASE)
            .await
            .expect("store")
            .expect("free");
        assert_eq!(other.epoch, 1);
    })
    .await;
}

/// Takes `stream`'s lease for `owner` once the previous holder's has lapsed on the server.
async fn take_over(
    emu: &mongo_emulator::Emulator,
    backend: &flowwarden_rs_mongo::MongoBackend,
    stream: &str,
    owner: &str,
) -> i64 {
    emu.advance_clock(Duration::from_secs(31));
    backend
        .try_acquire(stream, owner, LEASE)
        .await
        .expect("store")
        .expect("expired: taken over")
        .epoch
}

#[tokio::test]
async fn a_deposed_leader_cannot_write_or_claim_the_checkpoint_even_before_the_new_one_claims() {
    bounded(async {
        let (emu, backend) = emulator().await;
        assert_eq!(take_over(&emu, &backend, "s", "owner-1").await, 1);
        backend
            .save(&checkpoint("s", "05", 1))
            .await
            .expect("leader 1 writes");
        assert_eq!(take_over(&emu, &backend, "s", "owner-2").await, 2);

        // Leader 2 holds the lease but has not claimed yet: leader 1 is out already.
        let err = backend
            .save(&checkpoint("s", "07", 1))
            .await
            .expect_err("a deposed leader's write");
        assert_eq!(err.kind, StoreErrorKind::Fenced, "{err}");
        let err = backend
            .claim("s", &fence("owner-1", 1))
            .await
            .expect_err("a deposed leader's claim");
        assert_eq!(err.kind, StoreErrorKind::Fenced, "{err}");
        let loaded = backend.load("s").await.expect("load").expect("kept");
        assert_eq!(loaded.last_seen.expect("seen").token.data(), Some("05"));

        // Leader 2 claims before it loads: the stored positions stay.
        backend
            .claim("s", &fence("owner-2", 2))
            .await
            .expect("claim");
        let loaded = backend.load("s").await.expect("load").expect("kept");
        assert_eq!(loaded.last_seen.expect("seen").token.data(), Some("05"));
        backend
            .save(&checkpoint("s", "06", 2))
            .await
            .expect("leader 2 writes");

        // A claim on a stream without a checkpoint is no checkpoint, but still fences.
        assert_eq!(take_over(&emu, &backend, "new", "owner-1").await, 1);
        assert_eq!(take_over(&emu, &backend, "new", "owner-2").await, 2);
        backend
            .claim("new", &fence("owner-2", 2))
            .await
            .expect("claim");
        assert_eq!(backend.load("new").await, Ok(None));
        let err = backend
            .save(&checkpoint("new", "01", 1))
            .await
            .expect_err("older epoch");
        assert_eq!(err.kind, StoreErrorKind::Fenced);
        backend
            .save(&checkpoint("new", "02", 2))
            .await
            .expect("the claimant writes");
        assert_eq!(
            backend
                .load("new")
                .await
                .expect("load")
                .expect("some")
                .epoch,
            Some(2)
        );
    })
    .await;
}

#[tokio::test]
async fn the_stored_epoch_fences_a_write_that_passed_the_lease_check() {
    // The lease check is a read before the write; the write's own filter is what is atomic.
    // Model the window between them: a newer leader's claim lands in the checkpoint document
    // while the lease still reads as the old leader's.
    bounded(async {
        let (emu, backend) = emulator().await;
        assert_eq!(take_over(&emu, &backend, "s", "owner-1").await, 1);
        backend
            .save(&checkpoint("s", "05", 1))
            .await
            .expect("leader 1 writes");
        backend
            .client()
            .database(backend.database())
            .collection::<Document>("_fw_checkpoints")
            .update_one(
                doc! {"_id": "s"},
                doc! {"$set": {"epoch": 2_i64, "owner": "owner-2"}},
            )
            .await
            .expect("a newer claim");
        let err = backend
            .save(&checkpoint("s", "09", 1))
            .await
            .expect_err("the stored epoch is newer");
        assert_eq!(err.kind, StoreErrorKind::Fenced, "{err}");
        let loaded = backend.load("s").await.expect("load").expect("kept");
        assert_eq!(loaded.last_seen.expect("seen").token.data(), Some("05"));
    })
    .await;
}

fn record(stream: &str, data: &str, owner: &str, epoch: i64) -> DeadLetterRecord {
    let mut r = dead_letter_record(stream, data, 1_000);
    r.attempts = 1;
    r.owner = Some(owner.into());
    r.epoch = Some(epoch);
    r
}

#[tokio::test]
async fn dead_letter_writes_of_a_deposed_leader_are_rejected() {
    bounded(async {
        let (emu, backend) = emulator().await;
        let a = backend
            .try_acquire("s", "a", LEASE)
            .await
            .expect("store")
            .expect("taken");
        assert_eq!(
            backend.put(&record("s", "0A", "a", a.epoch)).await,
            Ok(PutOutcome::Inserted)
        );
        emu.advance_clock(Duration::from_secs(31));
        let b = backend
            .try_acquire("s", "b", LEASE)
            .await
            .expect("store")
            .expect("taken over");

        let err = backend
            .put(&record("s", "0B", "a", a.epoch))
            .await
            .expect_err("a is deposed");
        assert_eq!(err.kind, StoreErrorKind::Fenced, "{err}");
        let id_b = record("s", "0B", "a", a.epoch).id;
        assert_eq!(backend.get(&id_b).await, Ok(None), "nothing written");

        // b merges into a's record; a can no longer merge into b's.
        assert_eq!(
            backend.put(&record("s", "0A", "b", b.epoch)).await,
            Ok(PutOutcome::AlreadyPresent)
        );
        assert_eq!(
            backend.put(&record("s", "0C", "b", b.epoch)).await,
            Ok(PutOutcome::Inserted)
        );
        let err = backend
            .put(&record("s", "0C", "a", a.epoch))
            .await
            .expect_err("a is deposed");
        assert_eq!(err.kind, StoreErrorKind::Fenced);
        let stored = backend
            .get(&record("s", "0C", "b", b.epoch).id)
            .await
            .expect("get")
            .expect("b's record");
        assert_eq!((stored.attempts, stored.epoch), (1, Some(b.epoch)));

        // Writes without a fence (AllInstances streams) are not subject to leases.
        let mut free = record("t", "0D", "x", 0);
        free.epoch = None;
        free.owner = None;
        assert_eq!(backend.put(&free).await, Ok(PutOutcome::Inserted));
        let _ = Document::new();
    })
    .await;
}
