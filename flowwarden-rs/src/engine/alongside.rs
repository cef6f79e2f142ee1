//! Two futures on one task: the processor, and the reader of a cursor that answers from memory
//! ([`crate::port::ReadMode::InProcess`]).
//!
//! They talk through the hand-over channel, so each wakes the other: the reader's send wakes
//! the processor, the processor taking a batch wakes the reader. Both wakers would be the
//! task's own, and a task woken while it runs goes back to the scheduler's queue as if it had
//! yielded, which wakes an idle worker thread that may then take the task to another core. So
//! [`alongside`] hands both futures a waker of its own: a wake that comes while it polls them is
//! noted and served by polling again at once; only a wake from elsewhere (a timer, a handler's
//! I/O, a blocking handler finishing) reaches the task.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// Rounds of one poll at most. A poll goes on while one future woke the other and Tokio's
/// cooperative budget lasts (the hand-over's channel spends it, one unit per batch sent or
/// taken), then the task yields, as any Tokio task does once its budget is spent. This bound
/// ends the poll of futures that keep waking each other without spending the budget.
///
/// A yield is not free on a multi-threaded runtime: the task goes back to the queue, an idle
/// worker is woken to steal it, and the stream then runs on another core with cold caches.
/// Ending every poll after 8 rounds (256 events) moved a busy stream between the cores about
/// 4,000 times per million events (docs/performance.md).
const MAX_ROUNDS: usize = 256;

/// The waker [`alongside`] gives its two futures.
#[derive(Default)]
struct Deferred {
    /// The task's waker, as of the latest poll.
    task: Mutex<Option<Waker>>,
    /// Set while [`alongside`] polls its futures: a wake then is served by another round.
    polling: AtomicBool,
    /// A wake came since the flag was last taken.
    woken: AtomicBool,
}

impl Deferred {
    fn wake_task(&self) {
        let task = match self.task.lock() {
            Ok(task) => task.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        if let Some(task) = task {
            task.wake();
        }
    }

    fn set_task(&self, waker: &Waker) {
        let mut task = match self.task.lock() {
            Ok(task) => task,
            Err(poisoned) => poisoned.into_inner(),
        };
        if !task.as_ref().is_some_and(|t| t.will_wake(waker)) {
            *task = Some(waker.clone());
        }
    }
}

impl Wake for Deferred {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Stored before `polling` is read; `alongside` clears `polling` before it reads `woken`
        // (all sequentially consistent): one of the two sees the other, so no wake is lost.
        self.woken.store(true, SeqCst);
        if !self.polling.load(SeqCst) {
            self.wake_task();
        }
    }
}

/// Runs `main` to completion while also driving `side` (the read loop) on the same task, until
/// `side` ends or `main` does; `side` is then dropped with `main`, as an aborted reader task
/// would be. `side` is polled whenever `main` waits, so it fills the hand-over while the
/// processor waits for it; a wake of one by the other is served within the same poll.
pub(crate) async fn alongside<T>(
    main: impl Future<Output = T>,
    side: impl Future<Output = ()>,
) -> T {
    let mut main = std::pin::pin!(main);
    let mut side = std::pin::pin!(side);
    let mut side_done = false;
    let deferred = Arc::new(Deferred::default());
    let waker = Waker::from(deferred.clone());
    std::future::poll_fn(|cx| {
        deferred.set_task(cx.waker());
        let out = poll_rounds(
            &deferred,
            &waker,
            main.as_mut(),
            side.as_mut(),
            &mut side_done,
        );
        if out.is_pending() && deferred.woken.swap(false, SeqCst) {
            // A wake came after the last round looked (or every round was woken): the task
            // serves it on its next poll.
            cx.waker().wake_by_ref();
        }
        out
    })
    .await
}

/// Polls `main`, then `side` if `main` waits, again while one of them woke the other.
fn poll_rounds<T>(
    deferred: &Deferred,
    waker: &Waker,
    mut main: Pin<&mut impl Future<Output = T>>,
    mut side: Pin<&mut impl Future<Output = ()>>,
    side_done: &mut bool,
) -> Poll<T> {
    let mut cx = Context::from_waker(waker);
    deferred.polling.store(true, SeqCst);
    deferred.woken.store(false, SeqCst);
    let mut rounds = 0;
    let out = loop {
        rounds += 1;
        if let Poll::Ready(out) = main.as_mut().poll(&mut cx) {
            break Poll::Ready(out);
        }
        if !*side_done && side.as_mut().poll(&mut cx).is_ready() {
            *side_done = true;
        }
        if !deferred.woken.swap(false, SeqCst) {
            // Neither woke the other: both wait for something else.
            break Poll::Pending;
        }
        if rounds == MAX_ROUNDS || !tokio::task::coop::has_budget_remaining() {
            // Still woken: the wake is left for the task's next poll.
            deferred.woken.store(true, SeqCst);
            break Poll::Pending;
        }
    };
    deferred.polling.store(false, SeqCst);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes of the task.
    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    fn poll_once<F: Future>(fut: Pin<&mut F>, counter: &Arc<CountingWaker>) -> Poll<F::Output> {
        let waker = Waker::from(counter.clone());
        fut.poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_wake_of_one_future_by_the_other_is_served_in_the_same_poll_without_waking_the_task() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let fut = alongside(async { rx.await.unwrap_or(0) }, async move {
            let _ = tx.send(7);
        });
        let mut fut = std::pin::pin!(fut);
        let counter = Arc::new(CountingWaker::default());
        // The processor waits, the reader sends, the processor is polled again: done at once.
        assert_eq!(poll_once(fut.as_mut(), &counter), Poll::Ready(7));
        assert_eq!(counter.0.load(SeqCst), 0, "the task was not woken");
    }

    #[test]
    fn a_wake_from_elsewhere_reaches_the_task() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let fut = alongside(async { rx.await.unwrap_or(0) }, std::future::pending());
        let mut fut = std::pin::pin!(fut);
        let counter = Arc::new(CountingWaker::default());
        assert!(poll_once(fut.as_mut(), &counter).is_pending());
        assert_eq!(counter.0.load(SeqCst), 0);
        // From another thread, while nothing polls.
        std::thread::spawn(move || tx.send(3))
            .join()
            .expect("sender thread")
            .expect("receiver alive");
        assert_eq!(counter.0.load(SeqCst), 1, "the task was woken once");
        assert_eq!(poll_once(fut.as_mut(), &counter), Poll::Ready(3));
    }

    #[test]
    fn futures_that_keep_waking_each_other_end_the_poll_and_wake_the_task() {
        // A future that is never ready and wakes itself on every poll (as tokio's cooperative
        // budget does once spent): the poll ends after MAX_ROUNDS and the task is woken.
        let polls = Arc::new(AtomicUsize::new(0));
        let seen = polls.clone();
        let main = std::future::poll_fn(move |cx: &mut Context<'_>| {
            seen.fetch_add(1, SeqCst);
            cx.waker().wake_by_ref();
            Poll::<()>::Pending
        });
        let fut = alongside(main, std::future::pending());
        let mut fut = std::pin::pin!(fut);
        let counter = Arc::new(CountingWaker::default());
        assert!(poll_once(fut.as_mut(), &counter).is_pending());
        assert_eq!(polls.load(SeqCst), MAX_ROUNDS);
        assert_eq!(counter.0.load(SeqCst), 1);
    }

    #[tokio::test]
    async fn a_poll_ends_once_tokios_budget_is_spent_and_the_task_goes_on_later() {
        // The reader keeps sending over a channel of one; the processor keeps taking. Each
        // send and each take spends a unit of the task's budget (128 per poll of a task).
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(1);
        let taken = Arc::new(AtomicUsize::new(0));
        let count = taken.clone();
        let main = async move {
            while rx.recv().await.is_some() {
                count.fetch_add(1, SeqCst);
            }
        };
        let side = async move { while tx.send(1).await.is_ok() {} };
        let fut = alongside(main, side);
        let mut fut = std::pin::pin!(fut);
        let counter = Arc::new(CountingWaker::default());
        assert!(poll_once(fut.as_mut(), &counter).is_pending());
        let first = taken.load(SeqCst);
        assert!(
            (8..=128).contains(&first),
            "the poll went on while the budget lasted, and no further: {first} taken"
        );
        // The task was woken (now or once this poll of the test's task ends): it goes on.
        tokio::task::yield_now().await;
        assert!(counter.0.load(SeqCst) >= 1, "the task was woken");
        assert!(poll_once(fut.as_mut(), &counter).is_pending());
        assert!(taken.load(SeqCst) > first, "the next poll goes on");
    }

    #[tokio::test]
    async fn alongside_ends_with_the_processor_and_drops_the_reader() {
        struct Dropped(Arc<AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, SeqCst);
            }
        }
        let flag = Arc::new(AtomicBool::new(false));
        let guard = Dropped(flag.clone());
        let side = async move {
            let _guard = guard;
            std::future::pending::<()>().await
        };
        let out = alongside(
            async {
                tokio::task::yield_now().await;
                7
            },
            side,
        )
        .await;
        assert_eq!(out, 7);
        assert!(flag.load(SeqCst));
    }
}
