//! The recording lease store: the exact mirror of the stream's lease, injected partitions and
//! slow calls, and the lease sabotages.

use super::*;

/// The in-memory lease store of one runtime: keeps the harness's lease mirror exact, cuts off
/// identities (acquisitions fail too, as across a partition), and applies the lease sabotages.
pub(crate) struct RecLeases {
    pub(crate) world: Arc<World>,
    pub(crate) memory: MemoryBackend,
    pub(crate) inc: u32,
}

pub(crate) fn unreachable_lease_store() -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        "lease store unreachable (simulated partition)",
    )
}

impl RecLeases {
    /// An injected slow call of `owner`: waits, then tells whether the call fails (a partition)
    /// instead of reaching the store.
    async fn slow(&self, owner: &str, what: &str) -> bool {
        let slow = self.world.lock().slow_lease.get(owner).copied();
        let Some((d, fail)) = slow else { return false };
        if fail {
            self.world
                .lock()
                .busy_until
                .insert(self.inc, Instant::now() + d);
            tokio::time::sleep(d).await;
            let mut w = self.world.lock();
            let tag = w.tag(self.inc);
            w.log(format!(
                "{tag}lease {what}: no answer for {}ms, then an error",
                d.as_millis()
            ));
        }
        fail
    }

    /// An injected slow answer (the store acted at once; the answer arrives `d` later).
    async fn late_answer(&self, owner: &str) {
        let slow = self.world.lock().slow_lease.get(owner).copied();
        if let Some((d, false)) = slow {
            self.world
                .lock()
                .busy_until
                .insert(self.inc, Instant::now() + d);
            tokio::time::sleep(d).await;
        }
    }
}

/// The guard a sabotaged store grants without looking: every instance "holds" it.
fn fake_guard(stream: &str, owner: &str, ttl: Duration) -> Lease {
    Lease {
        stream: stream.to_owned(),
        owner: owner.to_owned(),
        epoch: 1,
        expires_at: bson::DateTime::from_millis(
            bson::DateTime::now().timestamp_millis() + ttl.as_millis() as i64,
        ),
    }
}

#[async_trait]
impl LeaseStore for RecLeases {
    async fn try_acquire(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        if self.slow(owner, "acquisition").await {
            return Err(unreachable_lease_store());
        }
        {
            let w = self.world.lock();
            if w.cut_off.contains(owner) {
                return Err(unreachable_lease_store());
            }
            if w.sabotage == Some(Sabotage::NoTakeover)
                && w.lease.as_ref().is_some_and(|l| l.owner != owner)
            {
                return Ok(None);
            }
            if w.sabotage == Some(Sabotage::GuardForEveryone) && stream.ends_with("#checkpoint") {
                return Ok(Some(fake_guard(stream, owner, ttl)));
            }
        }
        let r = LeaseStore::try_acquire(&self.memory, stream, owner, ttl).await;
        if let Ok(Some(l)) = &r {
            self.world.lock().on_acquire(self.inc, owner, l.epoch, ttl);
        }
        self.late_answer(owner).await;
        r
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        if self.slow(&lease.owner, "renewal").await {
            return Err(unreachable_lease_store());
        }
        {
            let w = self.world.lock();
            if w.cut_off.contains(&lease.owner) {
                return Err(unreachable_lease_store());
            }
            if w.sabotage == Some(Sabotage::GuardForEveryone)
                && lease.stream.ends_with("#checkpoint")
            {
                return Ok(Some(fake_guard(&lease.stream, &lease.owner, ttl)));
            }
            if w.sabotage == Some(Sabotage::LyingRenewals) && w.frozen.contains(&lease.owner) {
                // A broken store: the renewal "succeeds" but the lease is not extended.
                let mut fake = lease.clone();
                fake.expires_at = bson::DateTime::from_millis(
                    lease.expires_at.timestamp_millis() + ttl.as_millis() as i64,
                );
                return Ok(Some(fake));
            }
        }
        let r = LeaseStore::renew(&self.memory, lease, ttl).await;
        {
            let mut w = self.world.lock();
            let tag = w.tag(self.inc);
            match &r {
                Ok(Some(l)) => {
                    let now = Instant::now();
                    let renewed = w
                        .lease
                        .as_mut()
                        .filter(|m| m.epoch == l.epoch && m.owner == l.owner)
                        .map(|m| m.expires = now + ttl)
                        .is_some();
                    if renewed {
                        w.on_renewed(self.inc);
                    }
                }
                Ok(None) => w.log(format!("{tag}lease renewal: lost (epoch {})", lease.epoch)),
                Err(e) => w.log(format!(
                    "{tag}lease renewal failed (epoch {}): {}",
                    lease.epoch, e.message
                )),
            }
        }
        self.late_answer(&lease.owner).await;
        r
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let r = LeaseStore::release(&self.memory, lease).await;
        let mut w = self.world.lock();
        let tag = w.tag(self.inc);
        if r.is_ok() {
            let now = Instant::now();
            if let Some(m) = w.lease.as_mut() {
                if m.epoch == lease.epoch && m.owner == lease.owner && m.expires > now {
                    m.expires = now;
                }
            }
            w.log(format!("{tag}releases the lease (epoch {})", lease.epoch));
        }
        r
    }

    async fn current(&self, stream: &str) -> Result<Option<Lease>, StoreError> {
        LeaseStore::current(&self.memory, stream).await
    }
}
