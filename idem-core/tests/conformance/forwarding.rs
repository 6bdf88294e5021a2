use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use idem_core::conformance::Harness;
use idem_core::store::{Forward, Forwarding};
use idem_core::{ClaimOutcome, ClaimRequest, Error, Store};

/// A wrapper of one's own that overrides `start` only (it counts claims) and forwards the rest
/// through [`Forwarding`]: every rule, the steps' and the completer's among them, must hold
/// through it as on the store inside.
pub struct CountsClaims {
    inner: Arc<dyn Store>,
    starts: AtomicU64,
}

#[async_trait]
impl Forward for CountsClaims {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        self.starts.fetch_add(1, Ordering::Relaxed);
        self.inner.claim(request).await
    }
}

/// Harness `H`'s store behind a [`CountsClaims`] wrapper.
pub struct ForwardingHarness<H> {
    inner: H,
    store: Arc<Forwarding<CountsClaims>>,
}

#[async_trait]
impl<H: Harness> Harness for ForwardingHarness<H> {
    async fn new() -> Option<Self> {
        let inner = H::new().await?;
        let store = Arc::new(Forwarding(CountsClaims {
            inner: inner.store(),
            starts: AtomicU64::new(0),
        }));
        Some(ForwardingHarness { inner, store })
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn expires_by_itself(&self) -> bool {
        self.inner.expires_by_itself()
    }

    fn keeps_steps(&self) -> bool {
        self.inner.keeps_steps()
    }

    fn finds_abandoned(&self) -> bool {
        self.inner.finds_abandoned()
    }
}
