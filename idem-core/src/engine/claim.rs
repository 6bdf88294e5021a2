//! The claim attempt: one `start` that is finished even if its caller goes away.

use std::sync::Arc;
use std::time::Duration;

use super::detach::{BoxFuture, RunToEnd};
use super::finish::release;
use super::underway::Releasing;
use super::Shared;
use crate::error::Error;
use crate::record::{ClaimOutcome, ClaimRequest};
use crate::step::StepLog;

/// One claim attempt that is finished even if its caller goes away: a claim statement in flight
/// (waiting on a lock, say) may still commit, so an orphaned attempt runs on to its end on a task
/// of its own, and whatever it claimed is released. A retry in this process waits for that.
///
/// With `steps` (a retention), the claim begins the operation's steps too where the store can
/// ([`Store::claim_steps`](crate::Store::claim_steps)); the step log comes back beside a won
/// claim, or `None` for the caller to begin them.
pub(super) async fn attempt(
    shared: &Arc<Shared>,
    request: ClaimRequest<'_>,
    steps: Option<Duration>,
) -> Result<(ClaimOutcome, Option<StepLog>), Error> {
    if let Some(now) = shared.store.immediate() {
        // Done before this returns: nothing to run on after a caller that goes away.
        return Ok((now.claim_now(request)?, None));
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
            match steps {
                Some(retention) => (*store).claim_steps(request, retention).await,
                None => Ok(((*store).claim(request).await?, None)),
            }
        })
    };
    let shared = shared.clone();
    let key = *request.key;
    RunToEnd::new(
        attempt,
        move |attempt: BoxFuture<Result<(ClaimOutcome, Option<StepLog>), Error>>| {
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
