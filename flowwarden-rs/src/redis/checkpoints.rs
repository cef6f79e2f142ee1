//! The checkpoint store on Redis: one hash per stream, `<prefix>{<stream>}:checkpoint`, with
//! the checkpoint as its BSON document (`doc`, the very bytes MongoDB would store, written and
//! parsed by [`crate::port::codec`]) and the fencing fields beside it (`epoch`, `owner`, and
//! `claimedAt` after a claim) so the scripts can compare epochs without parsing BSON.

use std::collections::HashMap;

use async_trait::async_trait;
use bson::Document;
use tracing::{debug, warn};

use super::connection::RedisConnection;
use super::leases::corrupt_lease;
use super::scripts::{Reply, CLAIM_SCRIPT, SAVE_SCRIPT};
use crate::port::codec::{decode_checkpoint, encode_checkpoint};
use crate::port::{check_fence, Checkpoint, CheckpointStore, Fence, StoreError, StoreErrorKind};

/// Checkpoints in Redis (see the module docs of [`crate::redis`]). Fenced writes are checked
/// against the lease hash of the same connection and prefix, so a `SingleLeader` stream needs
/// the [`crate::redis::RedisLeaseStore`] of the same [`RedisConnection`] as its lease store.
#[derive(Debug, Clone)]
pub struct RedisCheckpointStore {
    redis: RedisConnection,
}

impl RedisCheckpointStore {
    /// A checkpoint store on `redis` (the connection is shared, not copied).
    pub fn new(redis: &RedisConnection) -> Self {
        Self {
            redis: redis.clone(),
        }
    }

    /// The Redis key of the checkpoint of `stream` (`<prefix>{<stream>}:checkpoint`), for
    /// operators: `redis-cli HGETALL` it to see the fencing fields.
    pub fn key(&self, stream: &str) -> String {
        self.redis.checkpoint_key(stream)
    }

    /// Runs a fenced script (save or claim) for `stream`; `Ok(())` when it wrote.
    async fn fenced(
        &self,
        what: &str,
        script: &::redis::Script,
        stream: &str,
        args: &[&[u8]],
        owner: Option<&str>,
        epoch: Option<i64>,
    ) -> Result<(), StoreError> {
        let cp_key = self.redis.checkpoint_key(stream);
        let lease_key = self.redis.lease_key(stream);
        let values = self
            .redis
            .eval(what, script, &[&cp_key, &lease_key], args)
            .await
            .map_err(|e| name_wrong_type(e, stream, &cp_key))?;
        let reply = Reply::parse(what, values)?;
        let epoch = epoch.unwrap_or_default();
        let refusal = match reply.status.as_str() {
            "ok" => return Ok(()),
            "no_lease" => check_fence(stream, None, owner, epoch).err(),
            "lease" => {
                let holder = reply.text(0)?;
                check_fence(stream, Some((&holder, reply.int(1)?)), owner, epoch).err()
            }
            "newer" => Some(StoreError::new(
                StoreErrorKind::Fenced,
                format!(
                    "checkpoint of stream '{stream}' was claimed or written with epoch {} > {epoch}",
                    reply.int(0)?
                ),
            )),
            "corrupt" => Some(corrupt(stream, &cp_key, &reply.text(0)?, "is malformed")),
            "corrupt_lease" => Some(corrupt_lease(stream, &lease_key, &reply.text(0)?)),
            _ => Some(reply.unexpected()),
        };
        let e = refusal.unwrap_or_else(|| {
            StoreError::new(
                StoreErrorKind::Other,
                format!(
                    "{what}: the script refused a write that check_fence accepts ({})",
                    reply.status
                ),
            )
        });
        debug!(stream, epoch, error = %e, "checkpoint write refused");
        Err(e)
    }
}

/// A `WRONGTYPE` error (something else than a hash at the key) as `Corrupt` naming the stream.
fn name_wrong_type(e: StoreError, stream: &str, key: &str) -> StoreError {
    if e.kind == StoreErrorKind::Corrupt {
        corrupt(stream, key, "(the key)", "is not a hash")
    } else {
        e
    }
}

fn corrupt(stream: &str, key: &str, field: &str, problem: &str) -> StoreError {
    let e = StoreError::new(
        StoreErrorKind::Corrupt,
        format!("checkpoint of stream '{stream}' at Redis key '{key}' is corrupt: field `{field}` {problem}"),
    );
    warn!(stream, key, error = %e, "corrupt checkpoint in Redis");
    e
}

/// Whether the hash records only a leader's claim (no document yet): no checkpoint.
fn is_claim_only(fields: &HashMap<String, Vec<u8>>) -> bool {
    fields.contains_key("claimedAt")
        && fields
            .keys()
            .all(|k| matches!(k.as_str(), "owner" | "epoch" | "claimedAt"))
}

/// The checkpoint stored in `fields` (the hash of `stream` at `key`), parsed strictly.
fn decode(
    stream: &str,
    key: &str,
    fields: &HashMap<String, Vec<u8>>,
) -> Result<Option<Checkpoint>, StoreError> {
    if fields.is_empty() || is_claim_only(fields) {
        return Ok(None);
    }
    let Some(bytes) = fields.get("doc") else {
        return Err(corrupt(stream, key, "doc", "is missing"));
    };
    let doc = Document::from_reader(bytes.as_slice())
        .map_err(|e| corrupt(stream, key, "doc", &format!("is not a BSON document ({e})")))?;
    let mut checkpoint = decode_checkpoint(&doc).map_err(|e| {
        StoreError::new(
            StoreErrorKind::Corrupt,
            format!("checkpoint of stream '{stream}' at Redis key '{key}': {e}"),
        )
    })?;
    if checkpoint.stream != stream {
        return Err(corrupt(
            stream,
            key,
            "doc._id",
            &format!("names stream '{}'", checkpoint.stream),
        ));
    }
    // A claim after the write updates only these fields: they are the stream's current ones.
    if let Some(epoch) = fields.get("epoch") {
        let epoch = std::str::from_utf8(epoch)
            .ok()
            .and_then(|e| e.parse::<i64>().ok())
            .ok_or_else(|| corrupt(stream, key, "epoch", "is not an integer"))?;
        checkpoint.epoch = Some(epoch);
    }
    if let Some(owner) = fields.get("owner") {
        let owner = String::from_utf8(owner.clone())
            .map_err(|_| corrupt(stream, key, "owner", "is not UTF-8 text"))?;
        checkpoint.owner = Some(owner);
    }
    Ok(Some(checkpoint))
}

#[async_trait]
impl CheckpointStore for RedisCheckpointStore {
    async fn load(&self, stream: &str) -> Result<Option<Checkpoint>, StoreError> {
        let key = self.redis.checkpoint_key(stream);
        let fields: HashMap<String, Vec<u8>> = self
            .redis
            .query(
                &format!("loading the checkpoint of stream '{stream}'"),
                ::redis::cmd("HGETALL").arg(&key),
            )
            .await
            .map_err(|e| name_wrong_type(e, stream, &key))?;
        decode(stream, &key, &fields)
    }

    async fn save(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let stream = &checkpoint.stream;
        let mut doc = Vec::new();
        encode_checkpoint(checkpoint)
            .to_writer(&mut doc)
            .map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Other,
                    format!("encoding the checkpoint of stream '{stream}': {e}"),
                )
            })?;
        let epoch = checkpoint.epoch.map(|e| e.to_string()).unwrap_or_default();
        let owner = checkpoint.owner.as_deref().unwrap_or_default();
        let has_owner: &[u8] = if checkpoint.owner.is_some() {
            b"1"
        } else {
            b"0"
        };
        self.fenced(
            &format!("writing the checkpoint of stream '{stream}'"),
            &SAVE_SCRIPT,
            stream,
            &[&doc, epoch.as_bytes(), owner.as_bytes(), has_owner],
            checkpoint.owner.as_deref(),
            checkpoint.epoch,
        )
        .await
    }

    async fn claim(&self, key: &str, fence: &Fence) -> Result<(), StoreError> {
        let epoch = fence.epoch.to_string();
        self.fenced(
            &format!("claiming the checkpoint of stream '{key}'"),
            &CLAIM_SCRIPT,
            key,
            &[fence.owner.as_bytes(), epoch.as_bytes()],
            Some(&fence.owner),
            Some(fence.epoch),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &[u8])]) -> HashMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
            .collect()
    }

    #[test]
    fn a_claim_alone_is_no_checkpoint() {
        let f = fields(&[("owner", b"a"), ("epoch", b"2"), ("claimedAt", b"1")]);
        assert_eq!(decode("s", "k", &f), Ok(None));
        assert_eq!(decode("s", "k", &HashMap::new()), Ok(None));
    }

    #[test]
    fn garbage_is_corrupt_naming_the_stream() {
        for f in [
            fields(&[("doc", b"not bson")]),
            fields(&[("epoch", b"2")]),
            fields(&[("doc", b"\x05\x00\x00\x00\x00"), ("epoch", b"x")]),
        ] {
            let e = decode("orders", "k", &f).unwrap_err();
            assert_eq!(e.kind, StoreErrorKind::Corrupt, "{e}");
            assert!(e.message.contains("'orders'"), "{e}");
        }
    }
}
