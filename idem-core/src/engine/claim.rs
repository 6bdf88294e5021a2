//! The claim attempt: one `start` that is finished even if its caller goes away.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::detach::{BoxFuture, RunToEnd};
use super::finish::release;
use super::underway::Releasing;
use super::Shared;
use crate::error::Error;
use crate::record::{ClaimOutcome, ClaimRequest};
use crate::step::StepLog;
use crate::store::Store;

/// How a call claims its key: [`Plain`] (`Store::claim`), or [`WithSteps`], which lets the store
/// begin the operation's steps in the same round trip (`Store::claim_steps`). Generic, so that a
/// plain call carries nothing for the steps: its log is `()`.
pub(crate) trait ClaimMode: Copy + Send + Sync + 'static {
    /// What comes back beside a won claim.
    type Log: Send + 'static;

    /// This mode for a call whose results are kept for `retention` (the steps' retention).
    fn retained(self, retention: Duration) -> Self;

    /// The log of a claim the store made without beginning anything (an immediate store).
    fn nothing() -> Self::Log;

    /// The store's claim in this mode.
    fn claim<'a>(
        self,
        store: &'a dyn Store,
        request: ClaimRequest<'a>,
    ) -> impl Future<Output = Result<(ClaimOutcome, Self::Log), Error>> + Send + 'a;
}

/// A claim alone.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plain;

impl ClaimMode for Plain {
    type Log = ();

    fn retained(self, _: Duration) -> Self {
        self
    }

    fn nothing() {}

    fn claim<'a>(
        self,
        store: &'a dyn Store,
        request: ClaimRequest<'a>,
    ) -> impl Future<Output = Result<(ClaimOutcome, ()), Error>> + Send + 'a {
        let claimed = store.claim(request);
        async move { Ok((claimed.await?, ())) }
    }
}

/// A claim that may begin the claimed operation's steps, kept for the call's retention: their
/// log beside a won claim when the store began them, `None` for the caller to begin them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WithSteps(Duration);

impl WithSteps {
    /// Steps kept for the retention [`ClaimMode::retained`] sets.
    pub(crate) const fn new() -> WithSteps {
        WithSteps(Duration::ZERO)
    }
}

impl ClaimMode for WithSteps {
    type Log = Option<StepLog>;

    fn retained(self, retention: Duration) -> Self {
        WithSteps(retention)
    }

    fn nothing() -> Option<StepLog> {
        None
    }

    fn claim<'a>(
        self,
        store: &'a dyn Store,
        request: ClaimRequest<'a>,
    ) -> impl Future<Output = Result<(ClaimOutcome, Option<StepLog>), Error>> + Send + 'a {
        store.claim_steps(request, self.0)
    }
}

/// One claim attempt that is finished even if its caller goes away: a claim statement in flight
/// (waiting on a lock, say) may still commit, so an orphaned attempt runs on to its end on a task
/// of its own, and whatever it claimed is released. A retry in this process waits for that.
pub(super) async fn attempt<M: ClaimMode>(
    shared: &Arc<Shared>,
    request: ClaimRequest<'_>,
    mode: M,
) -> Result<(ClaimOutcome, M::Log), Error> {
    if let Some(now) = shared.store.immediate() {
        // Done before this returns: nothing to run on after a caller that goes away.
        return Ok((now.claim_now(request)?, M::nothing()));
    }
    let attempt = {
        let store = shared.store.clone();
        let (key, fingerprint) = (*request.key, request.fingerprint.copied());
        let (lease, on_lapse) = (request.lease, request.on_lapse);
        // Through `&dyn Store`: on the `Arc` itself, the call would go through `Arc`'s
        // forwarding impl and box its future twice.
        Box::pin(async move {
            let request = ClaimRequest::new(&key, lease)
                .fingerprint(fingerprint.as_ref())
                .on_lapse(on_lapse);
            mode.claim(&*store, request).await
        })
    };
    let shared = shared.clone();
    let key = *request.key;
    RunToEnd::new(
        attempt,
        move |attempt: BoxFuture<Result<(ClaimOutcome, M::Log), Error>>| {
            let releasing = Releasing::begin(&shared, key);
            Box::pin(async move {
                if let Ok((ClaimOutcome::Claimed(claim), _)) = attempt.await {
                    release(releasing.store(), &claim).await;
                }
                drop(releasing);
            })
        },
    )
    .await
}
