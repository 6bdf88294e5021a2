//! A store for tests that sits in front of other stores: [`Forwarding`] sends each operation to
//! the store its [`Forward`] picks, after the [`Forward::gate`] lets it through. A test writes
//! only what its store does differently (fail while "down", route one key elsewhere, count the
//! pruner's calls) instead of a whole `Store` impl that forwards seven methods.
//!
//! A `Forwarding` store never says it answers at once ([`Store::immediate`] is `None`), so the
//! engine reaches it through the `Store` trait's futures, as it does a store that does I/O.

use std::ops::Deref;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Claim, Completion, Error, Key, Record, Start, StartRequest, StepLog, StepWrite, Store,
};

/// Which [`Store`] operation is about to run, for [`Forward::gate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// [`Store::start`].
    Start,
    /// [`Store::complete`].
    Complete,
    /// [`Store::abort`].
    Abort,
    /// [`Store::renew`].
    Renew,
    /// [`Store::get`].
    Get,
    /// [`Store::evict`].
    Evict,
    /// [`Store::prune_expired`].
    Prune,
    /// [`Store::begin_steps`].
    BeginSteps,
    /// [`Store::write_step`].
    WriteStep,
}

/// What a [`Forwarding`] store does differently from the stores behind it.
///
/// ```
/// use idem_core::{Error, Idempotency, Key, MemoryStore, Store};
/// use idem_test_support::forward::{Forward, Forwarding, Op};
///
/// /// A memory store whose completions always fail.
/// struct NoCompletions(MemoryStore);
///
/// impl Forward for NoCompletions {
///     fn records(&self) -> &dyn Store {
///         &self.0
///     }
///     fn gate(&self, op: Op) -> Result<(), Error> {
///         match op {
///             Op::Complete => Err(Error::Store(idem_core::StoreError::new(
///                 idem_core::StoreErrorKind::Unavailable,
///                 "injected",
///             ))),
///             _ => Ok(()),
///         }
///     }
/// }
///
/// let store = Forwarding(NoCompletions(MemoryStore::new()));
/// assert!(store.immediate().is_none());
/// let _engine = Idempotency::new(store);
/// ```
#[async_trait]
pub trait Forward: Send + Sync + 'static {
    /// The store that holds the records (and that `prune_expired` prunes).
    fn records(&self) -> &dyn Store;

    /// The store an operation on `key` goes to: [`records`](Self::records) unless a test keeps
    /// some keys elsewhere.
    fn route(&self, key: &Key) -> &dyn Store {
        let _ = key;
        self.records()
    }

    /// Runs before every operation; an error fails the operation without reaching a store.
    fn gate(&self, op: Op) -> Result<(), Error> {
        let _ = op;
        Ok(())
    }

    /// [`Store::prune_expired`] (after the gate): the records' store's, unless a test counts,
    /// slows or fails it.
    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        self.records().prune_expired(limit).await
    }

    /// [`Store::prune_batch_size`]: the records' store's.
    fn prune_batch_size(&self) -> u32 {
        self.records().prune_batch_size()
    }
}

/// A [`Store`] made of a [`Forward`]; derefs to it, so a test reaches its switches and counters
/// through the store it hands the engine. Every operation is forwarded, an operation's steps
/// included, so a store in front of one that keeps steps keeps them too.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Key, MemoryStore, Start, StartRequest, Store};
/// use idem_test_support::forward::{Forward, Forwarding};
///
/// struct Plain(MemoryStore);
/// impl Forward for Plain {
///     fn records(&self) -> &dyn Store {
///         &self.0
///     }
/// }
///
/// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// runtime.block_on(async {
///     let store = Forwarding(Plain(MemoryStore::new()));
///     let key = Key::derive("ride", "", "r-1").unwrap();
///     let Ok(Start::Started(claim)) = store.start(StartRequest::new(&key, Duration::from_secs(30))).await else {
///         unreachable!("a new key is claimed");
///     };
///     let steps = store.begin_steps(&claim, Duration::from_secs(60)).await.unwrap();
///     assert_eq!(steps.attempt, 1);
/// });
/// ```
pub struct Forwarding<F>(pub F);

impl<F> Deref for Forwarding<F> {
    type Target = F;

    fn deref(&self) -> &F {
        &self.0
    }
}

/// Writes `impl Store for Forwarding<F>`: each operation listed passes the gate as its [`Op`],
/// then goes with the same arguments to the store [`Forward::route`] picks for the key given
/// after `by`; the items after the `routed` list are the impl's other methods.
macro_rules! forward {
    (
        routed { $($op:ident: fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty, by $key:expr;)* }
        $($other:item)*
    ) => {
        #[async_trait]
        impl<F: Forward> Store for Forwarding<F> {
            $(
                async fn $name(&self, $($arg: $ty),*) -> $ret {
                    self.0.gate(Op::$op)?;
                    self.0.route($key).$name($($arg),*).await
                }
            )*
            $($other)*
        }
    };
}

forward! {
    routed {
        Start: fn start(request: StartRequest<'_>) -> Result<Start, Error>, by request.key;
        Complete: fn complete(claim: &Claim, completion: Completion<'_>) -> Result<(), Error>, by claim.key();
        Abort: fn abort(claim: &Claim) -> Result<(), Error>, by claim.key();
        Renew: fn renew(claim: &Claim, lease: Duration) -> Result<(), Error>, by claim.key();
        Get: fn get(key: &Key) -> Result<Option<Record>, Error>, by key;
        Evict: fn evict(key: &Key) -> Result<bool, Error>, by key;
        BeginSteps: fn begin_steps(claim: &Claim, retention: Duration) -> Result<StepLog, Error>, by claim.key();
        WriteStep: fn write_step(claim: &Claim, step: StepWrite<'_>) -> Result<(), Error>, by claim.key();
    }

    /// The records' store's prune, through [`Forward::prune_expired`].
    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        self.0.gate(Op::Prune)?;
        self.0.prune_expired(limit).await
    }

    fn prune_batch_size(&self) -> u32 {
        self.0.prune_batch_size()
    }
}
