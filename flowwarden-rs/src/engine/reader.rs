//! The reader task: the only place a cursor is read. It hands items to the processor over a
//! bounded channel, so no `next()` is ever raced against a timer or dropped mid-flight on a
//! cursor that is reused.

use tokio::sync::mpsc;

use crate::port::{ChangeCursor, SourceError, SourceItem};

/// What the reader hands over: an item, the end of the cursor (`Ok(None)`), or an error.
pub(crate) type ReadResult = Result<Option<SourceItem>, SourceError>;

pub(crate) async fn read_loop(mut cursor: Box<dyn ChangeCursor>, tx: mpsc::Sender<ReadResult>) {
    loop {
        let item = cursor.next().await;
        let last = !matches!(item, Ok(Some(_)));
        if tx.send(item).await.is_err() || last {
            return;
        }
    }
}
