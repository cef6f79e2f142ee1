//! The backend conformance suite on the MongoDB backend, through the real `mongodb` driver
//! against the wire-level emulator (a new emulator per case), and proof that the suite fails
//! for a lease store that breaks the contract.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, Document};
use flowwarden::port::{Lease, LeaseStore, StoreError, StoreErrorKind};
use flowwarden::{Backend, ResumeToken};
use flowwarden_rs_mongo::{MongoBackend, CHECKPOINTS, LOCKS};
use flowwarden_testkit::conformance::{self, ConformanceTarget, Fresh};
use mongo_emulator::Emulator;
use mongodb::Collection;

/// The database of the `_fw_` collections and of the suite's collection.
const DB: &str = "fwconformance";

/// One case's emulator and the backend connected to it.
struct MongoEnv {
    emu: Emulator,
    backend: MongoBackend,
}

impl MongoEnv {
    fn coll(&self, db: &str, coll: &str) -> Collection<Document> {
        self.backend.client().database(db).collection(coll)
    }
}

/// The MongoDB backend on a fresh emulator per case.
struct MongoTarget;

#[async_trait]
impl ConformanceTarget for MongoTarget {
    type Env = MongoEnv;

    async fn fresh(&self) -> Result<Fresh<MongoEnv>, String> {
        let emu = Emulator::start().await.map_err(|e| e.to_string())?;
        let backend = MongoBackend::connect(&emu.uri(), DB)
            .await
            .map_err(|p| p.join("; "))?;
        Ok(Fresh {
            backend: Backend::from(backend.clone()),
            env: MongoEnv { emu, backend },
        })
    }

    async fn insert(
        &self,
        env: &MongoEnv,
        db: &str,
        coll: &str,
        doc: Document,
    ) -> Result<(), String> {
        env.coll(db, coll)
            .insert_one(doc)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn update(
        &self,
        env: &MongoEnv,
        db: &str,
        coll: &str,
        filter: Document,
        update: Document,
    ) -> Result<(), String> {
        match env.coll(db, coll).update_one(filter, update).await {
            Ok(r) if r.modified_count == 1 => Ok(()),
            Ok(r) => Err(format!("update changed {} document(s)", r.modified_count)),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn delete(
        &self,
        env: &MongoEnv,
        db: &str,
        coll: &str,
        filter: Document,
    ) -> Result<(), String> {
        match env.coll(db, coll).delete_one(filter).await {
            Ok(r) if r.deleted_count == 1 => Ok(()),
            Ok(r) => Err(format!("delete removed {} document(s)", r.deleted_count)),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn lose_history(&self, env: &MongoEnv, through: &ResumeToken) -> Result<bool, String> {
        env.emu
            .truncate_oplog_through(through.as_document())
            .map_err(|e| e.to_string())?;
        Ok(true)
    }

    async fn plant_checkpoint(
        &self,
        env: &MongoEnv,
        key: &str,
        doc: Document,
    ) -> Result<bool, String> {
        env.coll(DB, CHECKPOINTS)
            .replace_one(doc! { "_id": key }, doc)
            .upsert(true)
            .await
            .map_err(|e| e.to_string())?;
        Ok(true)
    }
}

#[tokio::test]
async fn the_mongodb_backend_conforms_on_the_emulator() {
    let report = conformance::run(&MongoTarget).await;
    assert_eq!(report.passed(), conformance::CASES.to_vec(), "{report}");
    assert!(report.not_applicable().is_empty(), "{report}");
}

/// A lease store that deletes the lease document on release (as a TTL index on `_fw_locks`
/// would once it lapses): the next acquisition starts again at epoch 1.
struct ReleaseDeletes {
    inner: Arc<dyn LeaseStore>,
    locks: Collection<Document>,
}

#[async_trait]
impl LeaseStore for ReleaseDeletes {
    async fn try_acquire(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        self.inner.try_acquire(stream, owner, ttl).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        self.inner.renew(lease, ttl).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.inner.release(lease).await?;
        self.locks
            .delete_one(doc! { "_id": &lease.stream, "owner": &lease.owner, "epoch": lease.epoch })
            .await
            .map(|_| ())
            .map_err(|e| StoreError::new(StoreErrorKind::Unavailable, e.to_string()))
    }

    async fn current(&self, stream: &str) -> Result<Option<Lease>, StoreError> {
        self.inner.current(stream).await
    }
}

/// The MongoDB target with [`ReleaseDeletes`] as its lease store.
struct ReleaseDeletesTarget;

#[async_trait]
impl ConformanceTarget for ReleaseDeletesTarget {
    type Env = MongoEnv;

    async fn fresh(&self) -> Result<Fresh<MongoEnv>, String> {
        let mut fresh = MongoTarget.fresh().await?;
        let inner = fresh
            .backend
            .leases
            .clone()
            .ok_or("the MongoDB backend has no lease store")?;
        fresh.backend.leases = Some(Arc::new(ReleaseDeletes {
            inner,
            locks: fresh.env.coll(DB, LOCKS),
        }));
        Ok(fresh)
    }

    async fn insert(
        &self,
        env: &MongoEnv,
        db: &str,
        coll: &str,
        doc: Document,
    ) -> Result<(), String> {
        MongoTarget.insert(env, db, coll, doc).await
    }

    async fn update(
        &self,
        env: &MongoEnv,
        db: &str,
        coll: &str,
        filter: Document,
        update: Document,
    ) -> Result<(), String> {
        MongoTarget.update(env, db, coll, filter, update).await
    }

    async fn delete(
        &self,
        env: &MongoEnv,
        db: &str,
        coll: &str,
        filter: Document,
    ) -> Result<(), String> {
        MongoTarget.delete(env, db, coll, filter).await
    }

    async fn lose_history(&self, env: &MongoEnv, through: &ResumeToken) -> Result<bool, String> {
        MongoTarget.lose_history(env, through).await
    }

    async fn plant_checkpoint(
        &self,
        env: &MongoEnv,
        key: &str,
        doc: Document,
    ) -> Result<bool, String> {
        MongoTarget.plant_checkpoint(env, key, doc).await
    }
}

#[tokio::test]
async fn a_lease_store_whose_epochs_restart_after_release_fails_exactly_its_cases() {
    let report = conformance::run_report(&ReleaseDeletesTarget).await;
    println!("{report}");
    assert_eq!(
        report.failed(),
        vec!["lease.epochs_never_restart", "lease.current_reports_holder"],
        "{report}"
    );
    assert!(report.not_applicable().is_empty(), "{report}");
}
