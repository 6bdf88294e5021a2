//! How a claimed call ends: the lease is renewed while the work runs, the claim is completed
//! (run to its end even if the caller goes away) or released, and a completion that fails for a
//! passing reason is retried in the background while calls of this process replay its result.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::detach::{spawn_or_drop, BoxFuture, NowOrLater, RunToEnd};
use super::underway::Releasing;
use super::Shared;
use crate::error::Error;
use crate::key::Fingerprint;
use crate::record::{Claim, Completion, OnLapse, StoredResult};
use crate::store::{Store, LAPSED_CLAIMS_KEPT};

/// Polls `work` to completion while renewing the claim's lease every third of the lease, in the
/// same task (so cancelling the call stops both). A renewal that fails for a passing reason is
/// retried sooner, with backoff, for as long as the lease lasts.
pub(crate) async fn renewing<F: Future>(
    store: &dyn Store,
    claim: &Claim,
    lease: Duration,
    work: F,
) -> F::Output {
    // The work first, then the heartbeat, as a biased `select!` would poll them; the heartbeat
    // is made only once the work awaits: work done in its first poll (most, on the memory
    // store) builds none.
    let mut work = std::pin::pin!(work);
    let mut beating = std::pin::pin!(None);
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(out) = work.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        if beating.is_none() {
            beating.set(Some(heartbeat(store, claim, lease)));
        }
        match beating.as_mut().as_pin_mut().map(|beat| beat.poll(cx)) {
            Some(Poll::Ready(never)) => match never {},
            Some(Poll::Pending) | None => Poll::Pending,
        }
    })
    .await
}

/// Renews the claim's lease every third of the lease, for as long as it is polled; never ends.
async fn heartbeat(store: &dyn Store, claim: &Claim, lease: Duration) -> Infallible {
    let period = lease / 3;
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
}

/// The first pause before a failed renewal or completion is tried again; it doubles each time.
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest pause between two tries of a completion that keeps failing.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// When a call that met a completion this process retries in the background should try again:
/// the longest pause between two of its tries (at most 2 s, and a third of the lease), after
/// which the result has landed if the store answers again.
pub(super) fn pending_retry_after(lease: Duration) -> Duration {
    RETRY_MAX.min(lease / 3).max(Duration::from_millis(1))
}

/// Owns a claim until it is completed or released; dropping it armed (cancellation, panic)
/// releases the claim on a task of its own, and a retry in this process waits for that.
pub(super) struct ClaimGuard {
    shared: Arc<Shared>,
    claim: Option<Claim>,
    /// What the claim becomes if the guard is dropped holding it (the caller went away, the
    /// work panicked): released, or, for work whose effect must not repeat, left to lapse
    /// uncertain at once, as if its holder had died.
    on_lapse: OnLapse,
}

impl ClaimGuard {
    pub(super) fn new(shared: Arc<Shared>, claim: Claim, on_lapse: OnLapse) -> ClaimGuard {
        ClaimGuard {
            shared,
            claim: Some(claim),
            on_lapse,
        }
    }

    /// Stores the sealed result. From here on the work has run, so this is finished even if the
    /// caller goes away, and a failure that passes is retried in the background: `Ok` says
    /// whether the result is in the store already or still on its way there. The key is kept
    /// as a tombstone for `key_retention` after `retention`.
    ///
    /// Not an `async fn`: on a store that answers at once (the memory store) the result is
    /// stored before this returns, and the future given back holds only the answer, where an
    /// `async fn`'s would hold every argument (moved into it on every call).
    pub(super) fn complete(
        mut self,
        sealed: Vec<u8>,
        is_error: bool,
        fingerprint: Option<Fingerprint>,
        retention: Duration,
        key_retention: Tombstone,
        lease: Duration,
    ) -> NowOrLater<Result<Stored, Error>, impl Future<Output = Result<Stored, Error>> + Unpin>
    {
        let Some(claim) = self.claim.take() else {
            return NowOrLater::Now(Some(Ok(Stored::Landed)));
        };
        let completing = Completing {
            shared: self.shared.clone(),
            claim,
            sealed,
            is_error,
            fingerprint,
            retention,
            key_retention,
            lease,
        };
        if let Some(now) = self.shared.store.immediate() {
            // Done before this returns, so finished whatever the caller does next.
            let stored = now.complete_now(&completing.claim, completing.completion());
            return NowOrLater::Now(Some(completing.settle(stored)));
        }
        NowOrLater::Later(RunToEnd::new(
            Box::pin(completing.first_try()),
            |rest: BoxFuture<Result<Stored, Error>>| -> BoxFuture<()> {
                Box::pin(async move {
                    let _ = rest.await;
                })
            },
        ))
    }

    /// Stores the sealed result once (the lease renewed meanwhile) and reports the store's
    /// answer as it is: a failure that passes is the caller's to retry with the same claim,
    /// which stays held; nothing goes on in the background.
    pub(super) async fn complete_once(
        mut self,
        sealed: Vec<u8>,
        retention: Duration,
        key_retention: Tombstone,
        lease: Duration,
    ) -> Result<(), Error> {
        let Some(claim) = self.claim.take() else {
            return Ok(());
        };
        let store = &*self.shared.store;
        let completion = Completion {
            response: Some(&sealed),
            is_error: false,
            retention,
            key_retention: key_retention.duration(),
        };
        let stored = renewing(store, &claim, lease, store.complete(&claim, completion)).await;
        self.shared.waiters.wake(claim.key());
        stored
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
            release(releasing.store(), &claim).await;
            drop(releasing);
        }))
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if self.on_lapse == OnLapse::Uncertain {
            // Stopped at an unknown point of work that must not repeat: its claim lapses now,
            // and the key is uncertain (docs/architecture.md, "Past the lease").
            if let Some(claim) = self.claim.take() {
                let store = self.shared.store.clone();
                spawn_or_drop(Box::pin(async move {
                    let _ = store.renew(&claim, Duration::from_millis(1)).await;
                }));
            }
            return;
        }
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
    key_retention: Tombstone,
    lease: Duration,
}

impl Completing {
    /// One try at storing the result; if it fails for a passing reason the result is the
    /// caller's anyway, and the completion goes on in the background.
    async fn first_try(self) -> Result<Stored, Error> {
        let store = &*self.shared.store;
        // The lease is still renewed while the completion waits (for a pooled connection taken by
        // other work, say), so the key cannot be taken over in the meantime.
        let completing = store.complete(&self.claim, self.completion());
        let stored = renewing(store, &self.claim, self.lease, completing).await;
        self.settle(stored)
    }

    fn completion(&self) -> Completion<'_> {
        Completion {
            response: Some(&self.sealed),
            is_error: self.is_error,
            retention: self.retention,
            key_retention: self.key_retention.duration(),
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
                    record: StoredResult {
                        response: Some(self.sealed),
                        is_error: self.is_error,
                        expires_at: SystemTime::now() + self.retention,
                        not_retained: None,
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
                    key_retention: self.key_retention,
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
    pub(super) record: StoredResult,
    /// The fingerprint the claim was made with.
    pub(super) fingerprint: Option<Fingerprint>,
}

/// How long a completion keeps its key as a tombstone, in whole seconds (rounded up, as every
/// store keeps it): four bytes where a `Duration` takes sixteen, in every call's future.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tombstone(u32);

impl Tombstone {
    pub(super) fn of(d: Duration) -> Tombstone {
        let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
        Tombstone(u32::try_from(secs).unwrap_or(u32::MAX))
    }

    fn duration(self) -> Duration {
        Duration::from_secs(u64::from(self.0))
    }
}

/// A completion retried in the background.
struct Retrying {
    shared: Arc<Shared>,
    claim: Claim,
    pending: Arc<PendingResult>,
    retention: Duration,
    key_retention: Tombstone,
    lease: Duration,
}

impl Retrying {
    /// Retries the completion until it lands, the key is taken over, a definite error says it
    /// never will, or the retention (after which the result would not be replayed anyway) or
    /// [`LAPSED_CLAIMS_KEPT`] (after which a store may delete the lapsed claim) has passed,
    /// whichever is sooner. The lease is renewed on its own schedule meanwhile (every third of it, whatever
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
            retention: self.retention,
            key_retention: self.key_retention.duration(),
        };
        let give_up = Instant::now() + self.retention.min(LAPSED_CLAIMS_KEPT);
        let longest = pending_retry_after(self.lease);
        let tries = async {
            let mut backoff = RETRY_FIRST.min(longest);
            // Bounded by `give_up`: every pass sleeps before its try.
            loop {
                let jitter = backoff.mul_f64(fastrand::f64() * 0.5);
                tokio::time::sleep((backoff + jitter).min(longest)).await;
                backoff = (backoff * 2).min(longest);
                match store.complete(&self.claim, done).await {
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
                            tracing::error!(%key, error = %e, "gave up storing the result: past its retention, or past the time a store keeps a lapsed claim");
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

pub(super) async fn release(store: &dyn Store, claim: &Claim) {
    match store.abort(claim).await {
        Ok(()) | Err(Error::LeaseLost) => {}
        Err(e) => {
            tracing::warn!(key = %claim.key(), error = %e, "releasing the claim failed; it frees when its lease ends")
        }
    }
}
