//! The oplog's retained history, for lag and headroom: the times of its first and last
//! entries, read from `local.oplog.rs` or, without that privilege, from `serverStatus`.

use bson::{doc, Bson, Document, Timestamp};
use flowwarden::port::{timestamp_time, HistoryBounds, HistoryUnknown};

use crate::{short_error, MongoBackend};

impl MongoBackend {
    /// The `ts` of the first (`natural = 1`) or last (`natural = -1`) entry of
    /// `local.oplog.rs` (needs `find` on the `local` database); `None` when it returns
    /// nothing (an empty oplog, or a `mongos`).
    pub(crate) async fn oplog_entry_time(
        &self,
        natural: i32,
    ) -> Result<Option<Timestamp>, mongodb::error::Error> {
        let entry = self
            .client
            .database("local")
            .collection::<Document>("oplog.rs")
            .find_one(doc! {})
            .sort(doc! { "$natural": natural })
            .projection(doc! { "ts": 1 })
            .await?;
        Ok(entry.and_then(|d| match d.get("ts") {
            Some(Bson::Timestamp(ts)) => Some(*ts),
            _ => None,
        }))
    }

    /// `serverStatus`'s `oplog` section (`{serverStatus: 1, oplog: 1}`): the earliest and
    /// latest optimes, when the reply has them (it needs the `serverStatus` action, granted by
    /// `clusterMonitor`; a `mongos` or a standalone has no such section).
    pub(crate) async fn server_status_optimes(
        &self,
    ) -> Result<(Option<Timestamp>, Option<Timestamp>), mongodb::error::Error> {
        let reply = self
            .client
            .database("admin")
            .run_command(doc! { "serverStatus": 1, "oplog": 1 })
            .await?;
        let field = |name: &str| match reply.get_document("oplog").map(|o| o.get(name)) {
            Ok(Some(Bson::Timestamp(ts))) => Some(*ts),
            _ => None,
        };
        Ok((field("earliestOptime"), field("latestOptime")))
    }

    /// The oplog's first and last entry times: `local.oplog.rs` first, then `serverStatus`.
    /// When neither answers, the error says what each attempt returned and which privilege
    /// would help (docs/mongodb.md, Privileges).
    pub(crate) async fn oplog_bounds(&self) -> Result<HistoryBounds, HistoryUnknown> {
        let from_oplog = async {
            let oldest = self.oplog_entry_time(1).await?;
            let newest = self.oplog_entry_time(-1).await?;
            Ok::<_, mongodb::error::Error>(oldest.zip(newest))
        };
        let oplog = match from_oplog.await {
            Ok(Some((oldest, newest))) => return Ok(bounds(oldest, newest)),
            Ok(None) => "local.oplog.rs returned no entry (an empty oplog, or a mongos)".to_owned(),
            Err(e) => format!(
                "reading local.oplog.rs failed ({}; it needs `find` on the local database)",
                short_error(&e)
            ),
        };
        let status = match self.server_status_optimes().await {
            Ok((Some(oldest), Some(newest))) => return Ok(bounds(oldest, newest)),
            Ok(_) => {
                "serverStatus has no oplog section with both optimes (a mongos or a standalone)"
                    .to_owned()
            }
            Err(e) => format!(
                "serverStatus failed ({}; it needs the serverStatus action, role clusterMonitor)",
                short_error(&e)
            ),
        };
        Err(HistoryUnknown(format!(
            "the oplog window cannot be read: {oplog}; {status}. Grant one of these privileges (docs/mongodb.md, Privileges) to see lag and headroom"
        )))
    }
}

fn bounds(oldest: Timestamp, newest: Timestamp) -> HistoryBounds {
    HistoryBounds {
        oldest: timestamp_time(oldest),
        newest: timestamp_time(newest),
    }
}
