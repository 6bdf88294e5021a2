//! The lease a background job runs under, so that one node runs it at a time: a claim of a
//! reserved key in the store itself ([`RecordsLease`]), taken, renewed and released through the
//! store's own operations, so every store can hold one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Error;
use crate::key::Key;
use crate::record::{Claim, ClaimOutcome, ClaimRequest};
use crate::store::Store;

/// The lease of one run of a background job, so that one node runs it at a time.
#[async_trait]
pub trait Lease: Send {
    /// Takes the lease if it is free or expired, or extends it if this run holds it; `false`
    /// when another holder has it.
    async fn acquire(&mut self) -> Result<bool, Error>;

    /// Gives the lease up, so the next holder may run at once.
    async fn release(&mut self) -> Result<(), Error>;
}

/// The reserved key of the records pruner's lease, a record of the store itself (which the
/// store's operator views leave out).
pub fn records_lease_key() -> Result<Key, Error> {
    Ok(Key::derive("idem.pruner", "", "records")?)
}

/// A claim of a reserved lease key in the store itself: the records pruner's, and the
/// [`Completer`](crate::Completer)'s.
pub(crate) struct RecordsLease {
    store: Arc<dyn Store>,
    /// The reserved key.
    key: Arc<dyn Fn() -> Result<Key, Error> + Send + Sync>,
    length: Duration,
    claim: Option<Claim>,
}

impl RecordsLease {
    /// A lease of `length` on the record `key` of `store`, not yet taken.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        key: impl Fn() -> Result<Key, Error> + Send + Sync + 'static,
        length: Duration,
    ) -> RecordsLease {
        RecordsLease {
            store,
            key: Arc::new(key),
            length,
            claim: None,
        }
    }
}

#[async_trait]
impl Lease for RecordsLease {
    async fn acquire(&mut self) -> Result<bool, Error> {
        if let Some(claim) = &self.claim {
            return match self.store.renew(claim, self.length).await {
                Ok(()) => Ok(true),
                Err(Error::LeaseLost) => {
                    self.claim = None;
                    Ok(false)
                }
                Err(e) => Err(e),
            };
        }
        let key = (self.key)()?;
        match self
            .store
            .claim(ClaimRequest::new(&key, self.length))
            .await?
        {
            ClaimOutcome::Claimed(claim) => {
                self.claim = Some(claim);
                Ok(true)
            }
            // A live lease elsewhere; a completed record cannot be a pruner's, but it holds
            // the key as firmly until its retention ends.
            // (Nor can an uncertain claim or a tombstone: a lease is claimed as `Release`, and
            // never completed.)
            ClaimOutcome::Locked { .. }
            | ClaimOutcome::Completed(_)
            | ClaimOutcome::Uncertain { .. }
            | ClaimOutcome::Expired { .. } => Ok(false),
        }
    }

    async fn release(&mut self) -> Result<(), Error> {
        match self.claim.take() {
            // Lost already: another pruner holds it now, which is all a release wants.
            Some(claim) => match self.store.abort(&claim).await {
                Ok(()) | Err(Error::LeaseLost) => Ok(()),
                Err(e) => Err(e),
            },
            None => Ok(()),
        }
    }
}
