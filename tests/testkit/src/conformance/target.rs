//! The backend under test, as the suite sees it.

use async_trait::async_trait;
use bson::Document;
use flowwarden::{Backend, ResumeToken};

/// One isolated instance of the backend under test, made by [`ConformanceTarget::fresh`].
pub struct Fresh<E> {
    /// The backend: its source and stores are what the suite checks.
    pub backend: Backend,
    /// Whatever the target needs to write to this instance (a client, a server handle...);
    /// handed back to every other method of the target. Dropped when the case ends.
    pub env: E,
}

/// A backend the conformance suite can run against. Implement it in the backend's test file
/// and call [`crate::conformance::run`] with it.
///
/// Every method returns `Err(message)` when the target itself fails (a write refused, a
/// server gone): the case is then reported as failed with that message.
#[async_trait]
pub trait ConformanceTarget: Send + Sync {
    /// The per-instance handle of [`Fresh::env`].
    type Env: Send + Sync;

    /// A new instance with nothing in it: no checkpoints, no dead letters, no leases, no
    /// documents, and a change history that no other case writes to or truncates. The suite
    /// calls it once per case, so cases never see each other's data.
    async fn fresh(&self) -> Result<Fresh<Self::Env>, String>;

    /// Inserts `doc` (it has an `_id`) into `db.coll` as an application would, so that the
    /// source reports an `insert` event.
    async fn insert(
        &self,
        env: &Self::Env,
        db: &str,
        coll: &str,
        doc: Document,
    ) -> Result<(), String>;

    /// Applies the operator update `update` to the one document of `db.coll` matching
    /// `filter`, so that the source reports an `update` event.
    async fn update(
        &self,
        env: &Self::Env,
        db: &str,
        coll: &str,
        filter: Document,
        update: Document,
    ) -> Result<(), String>;

    /// Deletes the one document of `db.coll` matching `filter`, so that the source reports a
    /// `delete` event.
    async fn delete(
        &self,
        env: &Self::Env,
        db: &str,
        coll: &str,
        filter: Document,
    ) -> Result<(), String>;

    /// Discards the change history up to and including the event whose token is `through`
    /// (the target may discard more, but must keep at least one later entry when there is
    /// one), so that resuming after any event *before* `through` is history lost. `Ok(false)`
    /// when the target cannot do that (a live server): the cases that need it are reported as
    /// not applicable.
    async fn lose_history(&self, env: &Self::Env, through: &ResumeToken) -> Result<bool, String> {
        let _ = (env, through);
        Ok(false)
    }

    /// Stores `doc` as the raw checkpoint document of `key`, bypassing the checkpoint store
    /// (to plant one that does not parse). `Ok(false)` when the target cannot: the case is
    /// reported as not applicable.
    async fn plant_checkpoint(
        &self,
        env: &Self::Env,
        key: &str,
        doc: Document,
    ) -> Result<bool, String> {
        let _ = (env, key, doc);
        Ok(false)
    }
}
