//! The one way work that has started finishes: [`run_to_end`] polls a future in the caller's
//! task while the caller waits, and moves it to a task of its own once the caller drops it.
//! Detached calls, claim attempts, completions and releases all go through it
//! (docs/architecture.md, "Never twice").

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

pub(super) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Runs `fut` to its end even when the caller stops waiting: polled in place while the caller
/// polls, and when dropped unfinished, handed to `orphaned`, which returns what to spawn on the
/// runtime in its place. Costs one allocation, no task, while the caller stays.
pub(super) struct RunToEnd<T, O>
where
    O: FnOnce(BoxFuture<T>) -> BoxFuture<()>,
{
    fut: Option<BoxFuture<T>>,
    orphaned: Option<O>,
}

impl<T, O> RunToEnd<T, O>
where
    O: FnOnce(BoxFuture<T>) -> BoxFuture<()>,
{
    pub(super) fn new(fut: BoxFuture<T>, orphaned: O) -> Self {
        RunToEnd {
            fut: Some(fut),
            orphaned: Some(orphaned),
        }
    }
}

/// An answer a store gave at once (the memory store), or the future that gets it. A caller that
/// awaits it holds the answer alone when there is one, where the future of an `async fn` that
/// returns early would hold every argument it was given, moved into it on every call.
pub(super) enum NowOrLater<T, F> {
    /// Given before the future was made; taken by its first poll.
    Now(Option<T>),
    /// Still to get.
    Later(F),
}

impl<T: Unpin, F: Future<Output = T> + Unpin> Future for NowOrLater<T, F> {
    type Output = T;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.get_mut() {
            NowOrLater::Now(now) => match now.take() {
                Some(now) => Poll::Ready(now),
                // Only reachable by polling after completion, which a caller never does.
                None => Poll::Pending,
            },
            NowOrLater::Later(later) => Pin::new(later).poll(cx),
        }
    }
}

impl<T, O> Future for RunToEnd<T, O>
where
    O: FnOnce(BoxFuture<T>) -> BoxFuture<()> + Unpin,
{
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        let Some(fut) = this.fut.as_mut() else {
            // Only reachable by polling after completion, which a caller never does.
            return Poll::Pending;
        };
        // A panic inside leaves `fut` poisoned: it is dropped here, so that dropping this does
        // not hand a future that can only panic again to a task of its own, and resumed.
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx)));
        let out = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(out)) => out,
            Err(panic) => {
                this.fut = None;
                std::panic::resume_unwind(panic)
            }
        };
        this.fut = None;
        Poll::Ready(out)
    }
}

impl<T, O> Drop for RunToEnd<T, O>
where
    O: FnOnce(BoxFuture<T>) -> BoxFuture<()>,
{
    fn drop(&mut self) {
        if let (Some(fut), Some(orphaned)) = (self.fut.take(), self.orphaned.take()) {
            spawn_or_drop(orphaned(fut));
        }
    }
}

/// Runs `fut` to its end even if the caller goes away: in the caller's task while the caller
/// polls (no task of its own, so no other worker is woken to run it), and on a task of its own
/// from the moment the caller drops it unfinished. A panic in it is resumed in the caller. Like
/// every future, it only makes progress while it is polled: a caller that keeps it without
/// polling it stalls it (a tower service future is polled to its end or dropped).
pub(super) fn run_to_end<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
) -> impl Future<Output = T> {
    RunToEnd::new(Box::pin(fut), |rest: BoxFuture<T>| -> BoxFuture<()> {
        Box::pin(async move {
            let _ = rest.await;
        })
    })
}

/// Spawns `fut` on the current tokio runtime; without one it can only be dropped.
pub(super) fn spawn_or_drop(fut: BoxFuture<()>) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(fut);
        }
        Err(_) => tracing::warn!(
            "no tokio runtime to finish an idempotency store operation on; a claim it made frees \
             when its lease ends"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// Whether the orphaned future was handed over.
    fn watched<T: Send + 'static>(
        fut: BoxFuture<T>,
        handed: Arc<AtomicBool>,
    ) -> RunToEnd<T, impl FnOnce(BoxFuture<T>) -> BoxFuture<()> + Unpin> {
        RunToEnd::new(fut, move |rest: BoxFuture<T>| -> BoxFuture<()> {
            handed.store(true, Ordering::SeqCst);
            Box::pin(async move {
                let _ = rest.await;
            })
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panic_inside_is_resumed_and_nothing_is_left_to_run() {
        let handed = Arc::new(AtomicBool::new(false));
        let run = watched(
            Box::pin(async { panic!("the work panicked") }),
            handed.clone(),
        );
        // The task's harness catches the panic that reaches it, then drops the future.
        let ended = tokio::spawn(run).await;
        assert!(
            ended.is_err_and(|e| e.is_panic()),
            "the panic reaches the caller"
        );
        assert!(
            !handed.load(Ordering::SeqCst),
            "a poisoned future was handed on to run again"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn dropped_unfinished_it_runs_on_to_its_end() {
        let handed = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<u32>();
        let mut run = Box::pin(watched(
            Box::pin(async move {
                let _ = rx.await;
                let _ = done_tx.send(7);
            }),
            handed.clone(),
        ));
        // Polled once, in place: it waits for `tx`.
        assert!(tokio::time::timeout(Duration::ZERO, &mut run)
            .await
            .is_err());
        assert!(!handed.load(Ordering::SeqCst));
        drop(run);
        assert!(handed.load(Ordering::SeqCst), "handed on when dropped");
        tx.send(()).unwrap();
        assert_eq!(
            done_rx.await.unwrap(),
            7,
            "the rest ran on a task of its own"
        );
    }
}
