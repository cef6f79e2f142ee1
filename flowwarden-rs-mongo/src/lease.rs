//! The lease document of `_fw_locks`, ready for leader election (the election itself is not
//! implemented yet).

use bson::{doc, Bson, DateTime, Document};
use flowwarden::{StoreError, StoreErrorKind};

/// One lease: which instance owns a stream, with which fencing epoch, until when.
///
/// Stored in `_fw_locks` as `{_id: stream, owner, epoch, expiresAt}`; a TTL index on
/// `expiresAt` (`expireAfterSeconds: 0`) lets the server delete expired leases. Correctness
/// never depends on the TTL monitor (it runs about once a minute): a lease is held only while
/// `expiresAt` is in the future, and writes are fenced by `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseDocument {
    /// The stream (`_id`).
    pub stream: String,
    /// The instance holding the lease.
    pub owner: String,
    /// The fencing epoch: increases on every change of owner.
    pub epoch: i64,
    /// When the lease lapses unless renewed.
    pub expires_at: DateTime,
}

impl LeaseDocument {
    /// The stored document.
    pub fn to_document(&self) -> Document {
        doc! {
            "_id": &self.stream,
            "owner": &self.owner,
            "epoch": self.epoch,
            "expiresAt": self.expires_at,
        }
    }

    /// Parses a stored document; a malformed one is `Corrupt`, naming the stream and field.
    pub fn from_document(d: &Document) -> Result<Self, StoreError> {
        let stream = d
            .get_str("_id")
            .map_err(|_| corrupt("?", "_id"))?
            .to_owned();
        let owner = d
            .get_str("owner")
            .map_err(|_| corrupt(&stream, "owner"))?
            .to_owned();
        let epoch = match d.get("epoch") {
            Some(Bson::Int64(e)) => *e,
            Some(Bson::Int32(e)) => i64::from(*e),
            _ => return Err(corrupt(&stream, "epoch")),
        };
        let expires_at = *d
            .get_datetime("expiresAt")
            .map_err(|_| corrupt(&stream, "expiresAt"))?;
        Ok(Self {
            stream,
            owner,
            epoch,
            expires_at,
        })
    }

    /// Whether the lease is still held at `now`.
    pub fn is_held_at(&self, now: DateTime) -> bool {
        self.expires_at > now
    }
}

fn corrupt(stream: &str, field: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        format!("lease of stream '{stream}' in _fw_locks: field `{field}` is missing or malformed"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let l = LeaseDocument {
            stream: "orders".into(),
            owner: "host-1".into(),
            epoch: 4,
            expires_at: DateTime::from_millis(10_000),
        };
        assert_eq!(
            LeaseDocument::from_document(&l.to_document()),
            Ok(l.clone())
        );
        assert!(l.is_held_at(DateTime::from_millis(9_999)));
        assert!(!l.is_held_at(DateTime::from_millis(10_000)));
        let mut d = l.to_document();
        d.insert("epoch", "four");
        let e = LeaseDocument::from_document(&d).unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Corrupt);
        assert!(e.message.contains("orders") && e.message.contains("epoch"));
    }
}
