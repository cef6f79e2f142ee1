//! The reader task: the only place a cursor is read. It hands items to the processor over a
//! bounded channel, so no `next()` is ever raced against a timer or dropped mid-flight on a
//! cursor that is reused.
//!
//! Items are handed over in batches: what the cursor returns without waiting (the rest of the
//! batch the server sent) goes over together, so the processor is woken once per batch, not
//! once per event. The reader polls each `next()` once; when it is not ready, it first hands
//! over what it holds, then waits on that same read (never dropping it). The processor takes
//! the batch one item at a time ([`Inbox::recv`]), so a stop request or a heartbeat is still
//! noticed between any two events.

use std::collections::VecDeque;
use std::task::Poll;

use tokio::sync::mpsc;

use crate::port::{ChangeCursor, SourceError, SourceItem};

/// What the reader hands over: an item, the end of the cursor (`Ok(None)`), or an error.
pub(crate) type ReadResult = Result<Option<SourceItem>, SourceError>;

/// The channel between the reader and the processor: at most `capacity` batches in flight,
/// each at most `max_batch` items, so at most `(capacity + 2) * max_batch` items are read ahead
/// (the batches in the channel, the one the processor is taking apart, the one being filled).
pub(crate) fn hand_over(capacity: usize, max_batch: usize) -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (
        Outbox {
            tx,
            max_batch: max_batch.max(1),
        },
        Inbox {
            rx,
            buffer: VecDeque::new(),
        },
    )
}

/// The reader's end of the hand-over.
pub(crate) struct Outbox {
    tx: mpsc::Sender<Vec<ReadResult>>,
    max_batch: usize,
}

/// The processor's end of the hand-over.
pub(crate) struct Inbox {
    rx: mpsc::Receiver<Vec<ReadResult>>,
    buffer: VecDeque<ReadResult>,
}

impl Inbox {
    /// Whether an item is at hand (taking it does not wait).
    pub(crate) fn has_buffered(&self) -> bool {
        !self.buffer.is_empty()
    }

    /// The item at hand, when [`Inbox::has_buffered`].
    pub(crate) fn take_buffered(&mut self) -> Option<ReadResult> {
        self.buffer.pop_front()
    }

    /// The next item: from the batch at hand without waiting, else from the next batch;
    /// `None` once the reader ended and everything it handed over was taken. Cancel-safe:
    /// nothing is awaited after a batch is received.
    pub(crate) async fn recv(&mut self) -> Option<ReadResult> {
        if let Some(item) = self.buffer.pop_front() {
            return Some(item);
        }
        let batch = self.rx.recv().await?;
        self.buffer.extend(batch);
        self.buffer.pop_front()
    }
}

pub(crate) async fn read_loop(mut cursor: Box<dyn ChangeCursor>, out: Outbox) {
    let mut batch: Vec<ReadResult> = Vec::new();
    loop {
        let item = {
            let mut next = cursor.next();
            match futures::poll!(&mut next) {
                Poll::Ready(item) => item,
                Poll::Pending => {
                    // The cursor must wait (for the server, or for new changes): hand over
                    // what is read so far, then wait on the same read.
                    if !batch.is_empty() && out.tx.send(std::mem::take(&mut batch)).await.is_err() {
                        return;
                    }
                    next.await
                }
            }
        };
        let last = !matches!(item, Ok(Some(_)));
        batch.push(item);
        let full = last || batch.len() >= out.max_batch;
        if full && (out.tx.send(std::mem::take(&mut batch)).await.is_err() || last) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use bson::doc;

    /// A cursor with `ready` events at hand, then one that needs a wait, then the end.
    struct Scripted {
        ready: u32,
        waited: bool,
    }

    #[async_trait]
    impl ChangeCursor for Scripted {
        async fn next(&mut self) -> Result<Option<SourceItem>, SourceError> {
            if self.ready > 0 {
                self.ready -= 1;
                return Ok(Some(SourceItem::Event(doc! {"n": self.ready})));
            }
            if !self.waited {
                self.waited = true;
                tokio::task::yield_now().await;
                return Ok(Some(SourceItem::Idle(None)));
            }
            Ok(None)
        }
    }

    #[tokio::test]
    async fn what_the_cursor_has_at_hand_goes_over_in_batches_of_at_most_max_batch() {
        let (out, mut inbox) = hand_over(8, 4);
        let reader = tokio::spawn(read_loop(
            Box::new(Scripted {
                ready: 10,
                waited: false,
            }),
            out,
        ));
        reader.await.expect("reader ends");
        let mut sizes = Vec::new();
        while let Some(batch) = inbox.rx.recv().await {
            sizes.push(batch.len());
        }
        // 10 at hand: 4 + 4 + 2 (handed over before the wait); the idle tick and the end go
        // together after it.
        assert_eq!(sizes, vec![4, 4, 2, 2]);
    }

    #[tokio::test]
    async fn the_inbox_gives_every_item_in_order_then_none() {
        let (out, mut inbox) = hand_over(1, 3);
        tokio::spawn(read_loop(
            Box::new(Scripted {
                ready: 5,
                waited: false,
            }),
            out,
        ));
        let mut got = Vec::new();
        while let Some(item) = inbox.recv().await {
            got.push(item);
        }
        let events: Vec<i32> = got
            .iter()
            .filter_map(|i| match i {
                Ok(Some(SourceItem::Event(d))) => d.get_i32("n").ok(),
                _ => None,
            })
            .collect();
        assert_eq!(events, vec![4, 3, 2, 1, 0]);
        assert!(matches!(got[5], Ok(Some(SourceItem::Idle(None)))));
        assert!(matches!(got[6], Ok(None)));
        assert_eq!(got.len(), 7);
    }
}
