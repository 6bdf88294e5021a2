//! How a claimed call ends whatever its caller does: the claim attempt and the completion run to
//! their end on a task of their own when the caller goes away, the lease is renewed while the
//! work runs, a failed completion is retried in the background, and releases under way are
//! visible to retries in this process.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::Shared;
use crate::error::Error;
use crate::key::{Fingerprint, Key, KeyMap};
use crate::record::{Cached, Claim, Completion, Start};
use crate::store::Store;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Runs `fut` to its end even when the caller stops waiting: polled in place while the caller
/// polls, and when dropped unfinished, handed to `orphaned`, which returns what to spawn on the
/// runtime in its place. Costs one allocation, no task, while the caller stays.
struct RunToEnd<T, O>
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
    fn new(fut: BoxFuture<T>, orphaned: O) -> Self {
        RunToEnd {
            fut: Some(fut),
            orphaned: Some(orphaned),
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
fn spawn_or_drop(fut: BoxFuture<()>) {
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

/// One claim attempt that is finished even if its caller goes away: a claim statement in flight
/// (waiting on a lock, say) may still commit, so an orphaned attempt runs on to its end on a task
/// of its own, and whatever it claimed is released. A retry in this process waits for that.
pub(super) async fn start(
    shared: &Arc<Shared>,
    key: &Key,
    fingerprint: Option<&Fingerprint>,
    lease: Duration,
) -> Result<Start, Error> {
    if let Some(now) = shared.store.immediate() {
        // Done before this returns: nothing to run on after a caller that goes away.
        return now.start_now(key, fingerprint, lease);
    }
    let attempt = {
        let (store, key, fingerprint) = (shared.store.clone(), *key, fingerprint.copied());
        // Through `&dyn Store`: on the `Arc` itself, the call would go through `Arc`'s
        // forwarding impl and box its future twice.
        Box::pin(async move { (*store).start(&key, fingerprint.as_ref(), lease).await })
    };
    let shared = shared.clone();
    let key = *key;
    RunToEnd::new(attempt, move |attempt: BoxFuture<Result<Start, Error>>| {
        let releasing = Releasing::begin(&shared, key);
        Box::pin(async move {
            if let Ok(Start::Started(claim)) = attempt.await {
                release(&*releasing.shared.store, &claim).await;
            }
            drop(releasing);
        })
    })
    .await
}

/// Polls `work` to completion while renewing the claim's lease every third of the lease, in the
/// same task (so cancelling the call stops both). A renewal that fails for a passing reason is
/// retried sooner, with backoff, for as long as the lease lasts.
pub(super) async fn renewing<F: Future>(
    store: &dyn Store,
    claim: &Claim,
    lease: Duration,
    work: F,
) -> F::Output {
    let period = lease / 3;
    let heartbeat = async {
        let mut next = Instant::now() + period;
        let mut backoff = RETRY_FIRST.min(period);
        loop {
            tokio::time::sleep_until(next).await;
            match store.renew(claim, lease).await {
                Ok(()) => {
                    next += period;
                    backoff = RETRY_FIRST.min(period);
                }
                Err(Error::LeaseLost) => {
                    tracing::warn!(key = %claim.key(), "lease lost while the work runs; completion will fail");
                    return std::future::pending::<Infallible>().await;
                }
                Err(e) => {
                    tracing::warn!(key = %claim.key(), error = %e, "lease renewal failed; retrying");
                    next = Instant::now() + backoff;
                    backoff = (backoff * 2).min(period);
                }
            }
        }
    };
    tokio::select! {
        biased;
        out = work => out,
        never = heartbeat => match never {},
    }
}

/// The first pause before a failed renewal or completion is tried again; it doubles each time.
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest pause between two tries of a completion that keeps failing.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Owns a claim until it is completed or released; dropping it armed (cancellation, panic)
/// releases the claim on a task of its own, and a retry in this process waits for that.
pub(super) struct ClaimGuard {
    shared: Arc<Shared>,
    claim: Option<Claim>,
}

impl ClaimGuard {
    pub(super) fn new(shared: Arc<Shared>, claim: Claim) -> ClaimGuard {
        ClaimGuard {
            shared,
            claim: Some(claim),
        }
    }

    /// Stores the sealed result. From here on the work has run, so this is finished even if the
    /// caller goes away, and a failure that passes is retried in the background: `Ok` says
    /// whether the result is in the store already or still on its way there.
    pub(super) async fn complete(
        mut self,
        sealed: Vec<u8>,
        is_error: bool,
        fingerprint: Option<Fingerprint>,
        retention: Duration,
        lease: Duration,
    ) -> Result<Stored, Error> {
        let Some(claim) = self.claim.take() else {
            return Ok(Stored::Landed);
        };
        let completing = Completing {
            shared: self.shared.clone(),
            claim,
            sealed,
            is_error,
            fingerprint,
            retention,
            lease,
        };
        if let Some(now) = self.shared.store.immediate() {
            // Done before this returns, so finished whatever the caller does next.
            let stored = now.complete_now(&completing.claim, completing.completion(), retention);
            return completing.settle(stored);
        }
        RunToEnd::new(
            Box::pin(completing.first_try()),
            |rest: BoxFuture<Result<Stored, Error>>| {
                Box::pin(async move {
                    let _ = rest.await;
                })
            },
        )
        .await
    }

    /// Releases the claim so a retry runs again; visible at once to retries in this process.
    pub(super) async fn release(mut self) {
        if let Some(releasing) = self.releasing() {
            RunToEnd::new(releasing, |rest: BoxFuture<()>| rest).await;
        }
    }

    /// The release of the claim, if the guard still holds one; registered as under way at once.
    fn releasing(&mut self) -> Option<BoxFuture<()>> {
        let claim = self.claim.take()?;
        let releasing = Releasing::begin(&self.shared, *claim.key());
        Some(Box::pin(async move {
            release(&*releasing.shared.store, &claim).await;
            drop(releasing);
        }))
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if let Some(releasing) = self.releasing() {
            spawn_or_drop(releasing);
        }
    }
}

/// Where a completed call's result is when the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stored {
    /// In the store.
    Landed,
    /// On its way: the store failed for a passing reason and the completion is retried in the
    /// background (see [`Completions`]).
    Pending,
}

/// A result on its way into the store, with what storing it needs.
struct Completing {
    shared: Arc<Shared>,
    claim: Claim,
    sealed: Vec<u8>,
    is_error: bool,
    /// The fingerprint the claim was made with: a call here that meets the pending completion
    /// with another one is refused as the store would refuse it.
    fingerprint: Option<Fingerprint>,
    retention: Duration,
    lease: Duration,
}

impl Completing {
    /// One try at storing the result; if it fails for a passing reason the result is the
    /// caller's anyway, and the completion goes on in the background.
    async fn first_try(self) -> Result<Stored, Error> {
        let store = &*self.shared.store;
        // The lease is still renewed while the completion waits (for a pooled connection taken by
        // other work, say), so the key cannot be taken over in the meantime.
        let completing = store.complete(&self.claim, self.completion(), self.retention);
        let stored = renewing(store, &self.claim, self.lease, completing).await;
        self.settle(stored)
    }

    fn completion(&self) -> Completion<'_> {
        Completion {
            response: Some(&self.sealed),
            is_error: self.is_error,
        }
    }

    /// What the first try's outcome `stored` means for the caller: a passing store failure is
    /// retried in the background (the result is the caller's anyway), and until it lands, calls
    /// in this process meet the pending result instead of the store; otherwise calls waiting on
    /// the key are woken and the outcome is the caller's.
    fn settle(self, stored: Result<(), Error>) -> Result<Stored, Error> {
        match stored {
            Err(Error::Store(e)) if e.kind().is_transient() => {
                tracing::warn!(key = %self.claim.key(), error = %e, "storing the result failed; retrying in the background");
                let key = *self.claim.key();
                let pending = Arc::new(PendingResult {
                    record: Cached {
                        response: Some(self.sealed),
                        is_error: self.is_error,
                        expires_at: SystemTime::now() + self.retention,
                    },
                    fingerprint: self.fingerprint,
                });
                // Registered before this returns, so no call of this process that starts after
                // the caller has its result can miss it.
                self.shared.completions.begin(key, pending.clone());
                let retrying = Retrying {
                    shared: self.shared,
                    claim: self.claim,
                    pending,
                    retention: self.retention,
                    lease: self.lease,
                };
                spawn_or_drop(Box::pin(retrying.until_landed()));
                Ok(Stored::Pending)
            }
            other => {
                self.shared.waiters.wake(self.claim.key());
                other.map(|()| Stored::Landed)
            }
        }
    }
}

/// A result whose completion failed for a passing reason, as calls of this process replay it
/// while the completion is retried.
pub(super) struct PendingResult {
    /// The result as it will be stored.
    pub(super) record: Cached,
    /// The fingerprint the claim was made with.
    pub(super) fingerprint: Option<Fingerprint>,
}

/// A completion retried in the background.
struct Retrying {
    shared: Arc<Shared>,
    claim: Claim,
    pending: Arc<PendingResult>,
    retention: Duration,
    lease: Duration,
}

impl Retrying {
    /// Retries the completion until it lands, the key is taken over, a definite error says it
    /// never will, or the retention (after which the result would not be replayed anyway) has
    /// passed. The lease is renewed on its own schedule meanwhile (every third of it, whatever
    /// the pause between two tries), so while the store answers renewals the key stays this
    /// process's; and the pause between tries never exceeds a third of the lease, so once the
    /// store answers again the completion lands within that.
    async fn until_landed(self) {
        let key = *self.claim.key();
        let store = &*self.shared.store;
        let response = self.pending.record.response.as_deref();
        let done = Completion {
            response,
            is_error: self.pending.record.is_error,
        };
        let give_up = Instant::now() + self.retention;
        let longest = RETRY_MAX.min(self.lease / 3);
        let tries = async {
            let mut backoff = RETRY_FIRST.min(longest);
            // Bounded by `give_up`: every pass sleeps before its try.
            loop {
                let jitter = backoff.mul_f64(fastrand::f64() * 0.5);
                tokio::time::sleep((backoff + jitter).min(longest)).await;
                backoff = (backoff * 2).min(longest);
                match store.complete(&self.claim, done, self.retention).await {
                    Ok(()) => {
                        tracing::info!(%key, "the result was stored after a retry");
                        return;
                    }
                    Err(Error::LeaseLost) => {
                        tracing::error!(%key, "the key was taken over before its result could be stored (the store was unreachable for longer than the lease): the work may have run twice");
                        return;
                    }
                    Err(Error::Store(e)) if e.kind().is_transient() => {
                        if Instant::now() >= give_up {
                            tracing::error!(%key, error = %e, "gave up storing the result after its retention");
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::error!(%key, error = %e, "storing the result failed for good; the key frees when its lease ends");
                        return;
                    }
                }
            }
        };
        renewing(store, &self.claim, self.lease, tries).await;
        self.shared.completions.end(&key);
        self.shared.waiters.wake(&key);
    }
}

async fn release(store: &dyn Store, claim: &Claim) {
    match store.abort(claim).await {
        Ok(()) | Err(Error::LeaseLost) => {}
        Err(e) => {
            tracing::warn!(key = %claim.key(), error = %e, "releasing the claim failed; it frees when its lease ends")
        }
    }
}

/// Keys with something under way in this process that a call of the key must wait for instead
/// of meeting the key's claim in the store: a release ([`Releases`]), or a completion retried in
/// the background ([`Completions`]), each with what the call needs of it (`V`).
pub(super) struct Underway<V> {
    /// How many are under way: zero lets every call skip the map.
    count: AtomicUsize,
    keys: Mutex<KeyMap<Slot<V>>>,
}

/// The keys whose claims this process is releasing.
pub(super) type Releases = Underway<()>;

/// The keys whose completions this process retries in the background, with their results.
pub(super) type Completions = Underway<Arc<PendingResult>>;

struct Slot<V> {
    done: Arc<Notify>,
    count: usize,
    value: V,
}

impl<V> Default for Underway<V> {
    fn default() -> Self {
        Underway {
            count: AtomicUsize::new(0),
            keys: Mutex::new(KeyMap::default()),
        }
    }
}

impl<V: Clone> Underway<V> {
    fn lock(&self) -> std::sync::MutexGuard<'_, KeyMap<Slot<V>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more under way for `key` (the first one's `value` is the key's).
    fn begin(&self, key: Key, value: V) {
        self.count.fetch_add(1, Ordering::AcqRel);
        self.lock()
            .entry(key)
            .or_insert_with(|| Slot {
                done: Arc::new(Notify::new()),
                count: 0,
                value,
            })
            .count += 1;
    }

    /// One fewer under way for `key`; the last one wakes whoever waits.
    fn end(&self, key: &Key) {
        let ended = {
            let mut keys = self.lock();
            match keys.get_mut(key) {
                Some(slot) if slot.count > 1 => {
                    slot.count -= 1;
                    None
                }
                Some(_) => keys.remove(key).map(|slot| slot.done),
                None => None,
            }
        };
        self.count.fetch_sub(1, Ordering::AcqRel);
        if let Some(done) = ended {
            done.notify_waiters();
        }
    }

    /// Whether anything is under way in this process; if not, [`get`](Self::get) finds nothing
    /// and [`settled`](Self::settled) returns at once.
    pub(super) fn under_way(&self) -> bool {
        self.count.load(Ordering::Acquire) != 0
    }

    /// What is under way for `key`, if anything.
    pub(super) fn get(&self, key: &Key) -> Option<V> {
        if !self.under_way() {
            return None;
        }
        self.lock().get(key).map(|slot| slot.value.clone())
    }

    /// Waits until nothing is under way for `key` in this process, for at most `bound`.
    pub(super) async fn settled(&self, key: &Key, bound: Duration) {
        if !self.under_way() {
            return;
        }
        let _ = tokio::time::timeout(bound, async {
            // Bounded: each pass waits for one end of what is under way for the key.
            loop {
                let done = match self.lock().get(key) {
                    Some(slot) => slot.done.clone(),
                    None => return,
                };
                let mut ended = pin!(done.notified());
                ended.as_mut().enable();
                // It may have ended between the look-up and `enable`.
                if !self
                    .lock()
                    .get(key)
                    .is_some_and(|slot| Arc::ptr_eq(&slot.done, &done))
                {
                    continue;
                }
                ended.await;
            }
        })
        .await;
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A release under way; dropping it (done, or its task dropped) ends it and wakes whoever waits.
struct Releasing {
    shared: Arc<Shared>,
    key: Key,
}

impl Releasing {
    fn begin(shared: &Arc<Shared>, key: Key) -> Releasing {
        shared.releases.begin(key, ());
        Releasing {
            shared: shared.clone(),
            key,
        }
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        self.shared.releases.end(&self.key);
        self.shared.waiters.wake(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

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
