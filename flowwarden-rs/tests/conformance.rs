//! The backend conformance suite on the in-memory backend, and proof that the suite fails
//! for backends that break the contract.

use std::sync::Arc;

use async_trait::async_trait;
use bson::Document;
use flowwarden::port::{
    ChangeCursor, ChangeSource, Checkpoint, CheckpointStore, Fence, SourceError, SourceErrorKind,
    StartAt, StoreError, StoreErrorKind, WatchSpec,
};
use flowwarden::{Backend, MemoryBackend, ResumeToken};
use flowwarden_testkit::conformance::{self, ConformanceTarget, Fresh, Outcome, Report};

/// The in-memory backend: a new `MemoryBackend` per case.
struct MemoryTarget;

#[async_trait]
impl ConformanceTarget for MemoryTarget {
    type Env = MemoryBackend;

    async fn fresh(&self) -> Result<Fresh<MemoryBackend>, String> {
        let memory = MemoryBackend::new();
        Ok(Fresh {
            backend: Backend::from(memory.clone()),
            env: memory,
        })
    }

    async fn insert(
        &self,
        env: &MemoryBackend,
        db: &str,
        coll: &str,
        doc: Document,
    ) -> Result<(), String> {
        env.collection_in(db, coll)
            .insert_one(doc)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn update(
        &self,
        env: &MemoryBackend,
        db: &str,
        coll: &str,
        filter: Document,
        update: Document,
    ) -> Result<(), String> {
        match env.collection_in(db, coll).update_one(filter, update) {
            Ok(o) if o.modified == 1 => Ok(()),
            Ok(o) => Err(format!("update changed {} document(s)", o.modified)),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn delete(
        &self,
        env: &MemoryBackend,
        db: &str,
        coll: &str,
        filter: Document,
    ) -> Result<(), String> {
        match env.collection_in(db, coll).delete_one(filter) {
            Ok(1) => Ok(()),
            Ok(n) => Err(format!("delete removed {n} document(s)")),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn lose_history(
        &self,
        env: &MemoryBackend,
        through: &ResumeToken,
    ) -> Result<bool, String> {
        // The in-memory backend's event tokens are `{_data: <oplog sequence, 16 hex digits>}`.
        let seq = through
            .data()
            .and_then(|d| u64::from_str_radix(d, 16).ok())
            .ok_or_else(|| format!("not an in-memory event token: {through}"))?;
        let keep = env.oplog_head().saturating_sub(seq);
        env.faults()
            .truncate_history(usize::try_from(keep).map_err(|e| e.to_string())?);
        Ok(true)
    }

    async fn plant_checkpoint(
        &self,
        env: &MemoryBackend,
        key: &str,
        doc: Document,
    ) -> Result<bool, String> {
        env.put_checkpoint_document(key, doc);
        Ok(true)
    }
}

#[tokio::test]
async fn the_memory_backend_conforms() {
    let report = conformance::run(&MemoryTarget).await;
    assert_eq!(report.passed(), conformance::CASES.to_vec(), "{report}");
    assert!(report.not_applicable().is_empty(), "{report}");
}

/// The memory target with its backend altered by `alter`. It cannot plant checkpoint
/// documents (it does not delegate that), so the corrupt-checkpoint case is not applicable.
struct Altered<F>(F);

#[async_trait]
impl<F: Fn(Backend) -> Backend + Send + Sync> ConformanceTarget for Altered<F> {
    type Env = MemoryBackend;

    async fn fresh(&self) -> Result<Fresh<MemoryBackend>, String> {
        let fresh = MemoryTarget.fresh().await?;
        Ok(Fresh {
            backend: (self.0)(fresh.backend),
            env: fresh.env,
        })
    }

    async fn insert(
        &self,
        env: &MemoryBackend,
        db: &str,
        coll: &str,
        doc: Document,
    ) -> Result<(), String> {
        MemoryTarget.insert(env, db, coll, doc).await
    }

    async fn update(
        &self,
        env: &MemoryBackend,
        db: &str,
        coll: &str,
        filter: Document,
        update: Document,
    ) -> Result<(), String> {
        MemoryTarget.update(env, db, coll, filter, update).await
    }

    async fn delete(
        &self,
        env: &MemoryBackend,
        db: &str,
        coll: &str,
        filter: Document,
    ) -> Result<(), String> {
        MemoryTarget.delete(env, db, coll, filter).await
    }

    async fn lose_history(
        &self,
        env: &MemoryBackend,
        through: &ResumeToken,
    ) -> Result<bool, String> {
        MemoryTarget.lose_history(env, through).await
    }
}

/// A checkpoint store whose save ignores the fence: a fenced write that the real store
/// rejects is written again without its epoch, and reported as a success.
struct SaveIgnoresFence(Arc<dyn CheckpointStore>);

#[async_trait]
impl CheckpointStore for SaveIgnoresFence {
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.0.load(stream).await
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        match self.0.save(checkpoint).await {
            Err(e) if e.kind == StoreErrorKind::Fenced => {
                let unfenced = Checkpoint {
                    owner: None,
                    epoch: None,
                    ..checkpoint.clone()
                };
                self.0.save(&unfenced).await
            }
            other => other,
        }
    }

    async fn claim(&self, key: &str, fence: &Fence) -> Result<(), StoreError> {
        self.0.claim(key, fence).await
    }
}

/// A checkpoint store whose claim records nothing and checks nothing.
struct ClaimIgnoresFence(Arc<dyn CheckpointStore>);

#[async_trait]
impl CheckpointStore for ClaimIgnoresFence {
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.0.load(stream).await
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.0.save(checkpoint).await
    }

    async fn claim(&self, _key: &str, _fence: &Fence) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A change source that silently restarts at "now" when the requested position is older
/// than the retained history, the gap the engine must never take without saying so.
struct RestartsAtNowOnLostHistory(Arc<dyn ChangeSource>);

#[async_trait]
impl ChangeSource for RestartsAtNowOnLostHistory {
    async fn open(
        &self,
        spec: &WatchSpec,
        at: StartAt,
    ) -> Result<Box<dyn ChangeCursor>, SourceError> {
        match self.0.open(spec, at).await {
            Err(e) if e.kind == SourceErrorKind::HistoryLost => {
                self.0.open(spec, StartAt::Now).await
            }
            other => other,
        }
    }

    fn describe(&self) -> String {
        self.0.describe()
    }
}

fn failure_of<'r>(report: &'r Report, case: &str) -> &'r str {
    match report.outcome(case) {
        Some(Outcome::Failed(why)) => why,
        other => panic!("{case}: expected a failure, found {other:?}\n{report}"),
    }
}

#[tokio::test]
async fn a_save_that_ignores_the_fence_fails_exactly_the_save_fencing_cases() {
    let target = Altered(|mut b: Backend| {
        b.checkpoints = Arc::new(SaveIgnoresFence(b.checkpoints.clone()));
        b
    });
    let report = conformance::run_report(&target).await;
    println!("{report}");
    assert_eq!(
        report.failed(),
        vec![
            "checkpoint.save_after_newer_claim_is_fenced",
            "checkpoint.save_fenced_by_current_lease",
        ],
        "{report}"
    );
    assert!(
        failure_of(&report, "checkpoint.save_after_newer_claim_is_fenced")
            .contains("expected a Fenced error, the write was accepted"),
        "{report}"
    );
    assert_eq!(
        report.not_applicable(),
        vec!["checkpoint.corrupt_document_is_corrupt"],
        "{report}"
    );
}

#[tokio::test]
async fn a_claim_that_ignores_the_fence_fails_exactly_the_claim_case() {
    let target = Altered(|mut b: Backend| {
        b.checkpoints = Arc::new(ClaimIgnoresFence(b.checkpoints.clone()));
        b
    });
    let report = conformance::run_report(&target).await;
    println!("{report}");
    assert_eq!(
        report.failed(),
        vec!["checkpoint.claim_with_older_epoch_is_fenced"],
        "{report}"
    );
}

#[tokio::test]
async fn a_source_that_restarts_at_now_on_lost_history_fails_exactly_the_history_case() {
    let target = Altered(|mut b: Backend| {
        b.source = Arc::new(RestartsAtNowOnLostHistory(b.source.clone()));
        b
    });
    let report = conformance::run_report(&target).await;
    println!("{report}");
    assert_eq!(
        report.failed(),
        vec!["source.lost_history_is_history_lost"],
        "{report}"
    );
    assert!(
        failure_of(&report, "source.lost_history_is_history_lost").contains("no HistoryLost"),
        "{report}"
    );
}

#[tokio::test]
async fn a_backend_without_leases_reports_the_fencing_cases_not_applicable() {
    let target = Altered(|mut b: Backend| {
        b.leases = None;
        b
    });
    let report = conformance::run(&target).await;
    let mut expected: Vec<&str> = conformance::CASES
        .iter()
        .copied()
        .filter(|c| c.starts_with("lease."))
        .collect();
    expected.extend([
        "checkpoint.fenced_save_by_current_leader_round_trips",
        "checkpoint.save_after_newer_claim_is_fenced",
        "checkpoint.claim_with_older_epoch_is_fenced",
        "checkpoint.claim_alone_is_no_checkpoint",
        "checkpoint.save_fenced_by_current_lease",
        "checkpoint.corrupt_document_is_corrupt",
        "dead_letter.put_with_stale_epoch_is_fenced",
    ]);
    let mut found = report.not_applicable();
    found.sort_unstable();
    expected.sort_unstable();
    assert_eq!(found, expected, "{report}");
}

#[test]
fn every_case_has_a_distinct_name() {
    let mut names = conformance::CASES.to_vec();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), conformance::CASES.len());
}
