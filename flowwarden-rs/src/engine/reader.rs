//! The reader: the only place a cursor is read. It hands items to the processor over a
//! bounded channel, so no `next()` is ever raced against a timer or dropped mid-flight on a
//! cursor that is reused.
//!
//! Items are handed over in batches: what the cursor returns without waiting (the rest of the
//! batch the server sent) goes over together, so the processor is woken once per batch, not
//! once per event. The reader polls each `next()` once; when it is not ready, it first hands
//! over what it holds, then waits on that same read (never dropping it). The processor takes
//! the batch one item at a time ([`Inbox::recv`]), so a stop request or a heartbeat is still
//! noticed between any two events.
//!
//! Where the reader runs is the source's choice ([`ReadMode`]): on a task of its own for a
//! cursor that waits on a server, or alongside the processor on the stream's task
//! ([`super::alongside`]) for one that answers from memory, where a task of its own would only
//! move every event between threads.

use std::sync::{Arc, Mutex};
use std::task::Poll;

use tokio::sync::mpsc;

use crate::port::{ChangeCursor, ReadMode, SourceError, SourceItem};

/// The largest hand-over batch of a reader running alongside the processor
/// ([`ReadMode::InProcess`], `concurrency > 1`; a serial stream reads such a cursor itself,
/// without a hand-over): small enough that the events read ahead (at most three batches)
/// are still in the CPU cache when they are handled.
pub(crate) const IN_PROCESS_BATCH: usize = 32;

/// The largest hand-over batch for a cursor read in `mode` by a stream whose `batch_size` is
/// `batch_size`.
pub(crate) fn max_batch(mode: ReadMode, batch_size: u32) -> usize {
    let batch = batch_size.clamp(1, 4096) as usize;
    match mode {
        ReadMode::InProcess => batch.min(IN_PROCESS_BATCH),
        _ => batch,
    }
}

/// What the reader hands over: an item, the end of the cursor (`Ok(None)`), or an error.
pub(crate) type ReadResult = Result<Option<SourceItem>, SourceError>;

/// The channel between the reader and the processor: at most `capacity` batches in flight,
/// each at most `max_batch` items, so at most `(capacity + 2) * max_batch` items are read ahead
/// (the batches in the channel, the one the processor is taking apart, the one being filled).
pub(crate) fn hand_over(capacity: usize, max_batch: usize) -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let spares = Spares::default();
    (
        Outbox {
            tx,
            max_batch: max_batch.max(1),
            spares: spares.clone(),
        },
        Inbox {
            rx,
            batch: Vec::new(),
            next: 0,
            spares,
        },
    )
}

/// Emptied batches on their way back to the reader: a busy stream reuses a few allocations
/// instead of allocating (and growing) a batch for every handful of events. The lock is taken
/// once per batch on each side.
#[derive(Clone, Default)]
struct Spares(Arc<Mutex<Vec<Vec<ReadResult>>>>);

/// Spare batches kept at most (the read-ahead holds at most three batches).
const MAX_SPARES: usize = 2;

impl Spares {
    /// An empty batch: a spare one, or a new one with room for `room` items.
    fn take(&self, room: usize) -> Vec<ReadResult> {
        let spare = self.0.lock().ok().and_then(|mut spares| spares.pop());
        spare.unwrap_or_else(|| Vec::with_capacity(room))
    }

    /// Keeps an emptied batch for the reader (up to [`MAX_SPARES`]).
    fn give_back(&self, mut batch: Vec<ReadResult>) {
        if batch.capacity() == 0 {
            return;
        }
        batch.clear();
        if let Ok(mut spares) = self.0.lock() {
            if spares.len() < MAX_SPARES {
                spares.push(batch);
            }
        }
    }
}

/// The reader's end of the hand-over.
pub(crate) struct Outbox {
    tx: mpsc::Sender<Vec<ReadResult>>,
    max_batch: usize,
    spares: Spares,
}

impl Outbox {
    /// Takes the filled batch, leaving an empty one in its place.
    fn take_batch(&self, batch: &mut Vec<ReadResult>) -> Vec<ReadResult> {
        let room = batch.len();
        std::mem::replace(batch, self.spares.take(room))
    }

    /// Hands the filled batch over (waiting for room in the channel); `false` once the
    /// processor is gone.
    async fn send(&self, batch: &mut Vec<ReadResult>) -> bool {
        let full = self.take_batch(batch);
        self.tx.send(full).await.is_ok()
    }
}

/// The processor's end of the hand-over.
pub(crate) struct Inbox {
    rx: mpsc::Receiver<Vec<ReadResult>>,
    /// The batch being taken apart, in place: `batch[next..]` are still to be taken; the items
    /// before `next` were taken (each replaced by an empty `Ok(None)`).
    batch: Vec<ReadResult>,
    next: usize,
    spares: Spares,
}

impl Inbox {
    /// Whether an item is at hand (taking it does not wait).
    pub(crate) fn has_buffered(&self) -> bool {
        self.next < self.batch.len()
    }

    /// The item at hand, when [`Inbox::has_buffered`].
    pub(crate) fn take_buffered(&mut self) -> Option<ReadResult> {
        let item = self.batch.get_mut(self.next)?;
        self.next += 1;
        Some(std::mem::replace(item, Ok(None)))
    }

    /// The next item: from the batch at hand without waiting, else from the next batch;
    /// `None` once the reader ended and everything it handed over was taken. Cancel-safe:
    /// nothing is awaited after a batch is received.
    pub(crate) async fn recv(&mut self) -> Option<ReadResult> {
        if let Some(item) = self.take_buffered() {
            return Some(item);
        }
        let batch = self.rx.recv().await?;
        let spent = std::mem::replace(&mut self.batch, batch);
        self.next = 0;
        self.spares.give_back(spent);
        self.take_buffered()
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
                    if !batch.is_empty() && !out.send(&mut batch).await {
                        return;
                    }
                    next.await
                }
            }
        };
        let last = !matches!(item, Ok(Some(_)));
        batch.push(item);
        if last || batch.len() >= out.max_batch {
            let sent = out.send(&mut batch).await;
            if !sent || last {
                return;
            }
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
    async fn a_reader_alongside_the_processor_hands_over_every_item_on_the_same_task() {
        let (out, mut inbox) = hand_over(1, 3);
        let reader = read_loop(
            Box::new(Scripted {
                ready: 5,
                waited: false,
            }),
            out,
        );
        // No task is spawned: the reader only advances because `alongside` polls it.
        let got = crate::engine::alongside::alongside(
            async {
                let mut got = Vec::new();
                while let Some(item) = inbox.recv().await {
                    got.push(item);
                }
                got
            },
            reader,
        )
        .await;
        let events = got
            .iter()
            .filter(|i| matches!(i, Ok(Some(SourceItem::Event(_)))))
            .count();
        assert_eq!(events, 5);
        assert!(matches!(got.last(), Some(Ok(None))));
        assert_eq!(got.len(), 7);
    }

    #[tokio::test]
    async fn a_batch_taken_apart_goes_back_to_the_reader_and_is_filled_again() {
        let (out, mut inbox) = hand_over(2, 4);
        let event = |n: i32| Ok(Some(SourceItem::Event(doc! {"n": n})));
        let mut filling: Vec<ReadResult> = vec![event(1), event(2)];
        let first = out.take_batch(&mut filling);
        let first_ptr = first.as_ptr();
        out.tx.send(first).await.expect("open");
        filling.push(event(3));
        out.tx
            .send(out.take_batch(&mut filling))
            .await
            .expect("open");
        // The first batch is taken apart; receiving the second gives the first back.
        assert!(inbox.recv().await.is_some());
        assert!(inbox.recv().await.is_some());
        assert!(!inbox.has_buffered());
        assert!(
            matches!(inbox.recv().await, Some(Ok(Some(SourceItem::Event(d)))) if d.get_i32("n") == Ok(3))
        );
        let refilled = out.take_batch(&mut filling);
        assert!(refilled.is_empty());
        assert_eq!(filling.as_ptr(), first_ptr, "the spent batch is reused");
        assert!(filling.is_empty() && filling.capacity() >= 2);
    }

    #[test]
    fn a_cursor_read_in_process_hands_over_small_batches() {
        assert_eq!(max_batch(ReadMode::ReadAhead, 1_000), 1_000);
        assert_eq!(max_batch(ReadMode::ReadAhead, 10_000), 4_096);
        assert_eq!(max_batch(ReadMode::InProcess, 1_000), IN_PROCESS_BATCH);
        assert_eq!(max_batch(ReadMode::InProcess, 8), 8);
        assert_eq!(max_batch(ReadMode::InProcess, 0), 1);
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
