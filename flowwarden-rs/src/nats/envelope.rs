//! [`Envelope`]: the owned, versioned integration event the bridge publishes.

use bson::Bson;
use serde::{Deserialize, Serialize};

use crate::context::ChangeContext;

/// The envelope version this crate writes (`specversion`). A consumer that sees a higher
/// version than it knows should not guess.
pub const SPEC_VERSION: u32 = 1;

/// One change as an integration event: the identity and position of the change, and the
/// payload the user's mapping function made of it (`data`). Never the raw change event.
///
/// As JSON (see `docs/integrations/nats.md`):
///
/// ```json
/// { "specversion": 1, "id": "orders:8263..", "stream": "orders", "operation": "insert",
///   "key": { "_id": 42 }, "clusterTime": { "t": 1767225600, "i": 1 },
///   "wallTime": "2026-01-01T00:00:00Z", "data": { .. } }
/// ```
///
/// Consumers can deserialize it with the payload type they expect
/// (`Envelope<OrderPaid>`, or `Envelope<serde_json::Value>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Envelope<D> {
    /// The envelope version ([`SPEC_VERSION`]).
    pub specversion: u32,
    /// The event's stable identity ([`ChangeContext::event_id`]), the same on every
    /// redelivery; also the message's `Nats-Msg-Id`.
    pub id: String,
    /// The stream's name.
    pub stream: String,
    /// The operation type (`insert`, `update`, `replace`, `delete`, ...).
    pub operation: String,
    /// The event's `documentKey` as relaxed extended JSON (`{"_id": 42}`,
    /// `{"_id": {"$oid": ".."}}`); `null` for events without one (`drop`, `invalidate`).
    pub key: Option<serde_json::Value>,
    /// The event's cluster time (`clusterTime`), when the source reports it.
    pub cluster_time: Option<ClusterTime>,
    /// The event's wall time as RFC 3339 in UTC (to the millisecond; no fraction when it is
    /// zero), when the source reports it.
    pub wall_time: Option<String>,
    /// The payload the mapping function produced.
    pub data: D,
}

/// A MongoDB cluster time: seconds since the epoch and an ordinal within the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClusterTime {
    /// Seconds since the Unix epoch.
    pub t: u32,
    /// The ordinal of the operation within that second.
    pub i: u32,
}

impl<D> Envelope<D> {
    /// The envelope of the event of `ctx` carrying `data`.
    pub fn new<T>(ctx: &ChangeContext<T>, data: D) -> Self {
        Self {
            specversion: SPEC_VERSION,
            id: ctx.event_id().as_str().to_owned(),
            stream: ctx.stream_name().to_owned(),
            operation: ctx.operation_type().as_str().to_owned(),
            key: ctx
                .document_key()
                .map(|k| Bson::Document(k.clone()).into_relaxed_extjson()),
            cluster_time: ctx.cluster_time().map(|ts| ClusterTime {
                t: ts.time,
                i: ts.increment,
            }),
            wall_time: ctx.wall_time().and_then(|w| w.try_to_rfc3339_string().ok()),
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::ChangeContext;
    use crate::event::ChangeEvent;
    use bson::{doc, oid::ObjectId, DateTime, Document, Timestamp};

    fn ctx(raw: Document) -> ChangeContext<Document> {
        let event = ChangeEvent::from_raw(raw).expect("a valid event");
        ChangeContext::decode("orders", event).expect("decodes")
    }

    #[test]
    fn carries_identity_position_and_payload() {
        let oid = ObjectId::parse_str("65a1b2c3d4e5f60718293a4b").expect("oid");
        let c = ctx(doc! {
            "_id": {"_data": "82AB"},
            "operationType": "insert",
            "ns": {"db": "shop", "coll": "orders"},
            "documentKey": {"_id": oid},
            "clusterTime": Timestamp { time: 1_767_225_600, increment: 3 },
            "wallTime": DateTime::from_millis(1_767_225_600_250),
            "fullDocument": {"_id": oid, "total": 12},
        });
        let json = serde_json::to_value(Envelope::new(&c, serde_json::json!({"total": 12})))
            .expect("encodes");
        assert_eq!(
            json,
            serde_json::json!({
                "specversion": 1,
                "id": "orders:82AB",
                "stream": "orders",
                "operation": "insert",
                "key": {"_id": {"$oid": "65a1b2c3d4e5f60718293a4b"}},
                "clusterTime": {"t": 1_767_225_600u32, "i": 3},
                "wallTime": "2026-01-01T00:00:00.25Z",
                "data": {"total": 12},
            })
        );
    }

    #[test]
    fn events_without_a_key_or_times_have_nulls() {
        let c = ctx(doc! { "_id": {"_data": "01"}, "operationType": "invalidate" });
        let json = serde_json::to_value(Envelope::new(&c, ())).expect("encodes");
        assert_eq!(json["key"], serde_json::Value::Null);
        assert_eq!(json["clusterTime"], serde_json::Value::Null);
        assert_eq!(json["wallTime"], serde_json::Value::Null);
        assert_eq!(json["operation"], "invalidate");
    }
}
