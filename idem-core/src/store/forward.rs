//! A store that wraps another: [`Forward`] says what the wrapper does differently, and
//! [`Forwarding`] makes it a [`Store`] whose every operation goes to the inner store unless the
//! wrapper overrides it.

use std::ops::Deref;
use std::time::Duration;

use async_trait::async_trait;

use super::{Immediate, Store};
use crate::error::Error;
use crate::key::{Key, Token};
use crate::record::{Claim, ClaimOutcome, ClaimRequest, Completion, Record, UncertainOperation};
use crate::step::{Abandoned, AbandonedQuery, StepLog, StepWrite};

/// A [`Store`] made of a [`Forward`]: each operation passes [`Forward::gate`], then goes to the
/// wrapper's method of the same name, which forwards it to [`Forward::inner`] unless the
/// wrapper overrides it. It derefs to the wrapper, so its switches and counters stay in reach
/// through the store handed to the engine.
///
/// ```
/// use idem::store::{Forward, Forwarding};
/// use idem::{Idempotency, MemoryStore, Store};
///
/// /// Forwards everything: what the memory store keeps and finds, this store does too.
/// struct Plain {
///     memory: MemoryStore,
/// }
///
/// impl Forward for Plain {
///     fn inner(&self) -> &dyn Store {
///         &self.memory
///     }
/// }
///
/// let store = Forwarding(Plain { memory: MemoryStore::new() });
/// assert_eq!(store.prune_batch_size(), MemoryStore::new().prune_batch_size());
/// assert_eq!(store.memory.len(), 0); // the wrapper's field, through Deref
/// let _engine = Idempotency::new(store);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Forwarding<F>(pub F);

impl<F> Deref for Forwarding<F> {
    type Target = F;

    fn deref(&self) -> &F {
        &self.0
    }
}

/// Writes [`Operation`], [`Forward`] and `impl Store for Forwarding<F>` from the list of the
/// [`Store`]'s async methods that `store_methods!` passes, so that a method the trait gains is
/// forwarded everywhere at once.
macro_rules! forwarding {
    ($($op:ident: fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        /// Which [`Store`] operation a [`Forwarding`] store is about to run, for
        /// [`Forward::gate`]. New operations may be added: match with a `_` arm.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Operation {
            $(
                #[doc = concat!("[`Store::", stringify!($name), "`].")]
                $op,
            )*
        }

        /// What a store that wraps another does differently from it; [`Forwarding`] makes it a
        /// [`Store`].
        ///
        /// Write a wrapper this way rather than as a `Store` of its own. A `Store` impl that
        /// forwards only the methods it must write (`start`, `complete`, …) keeps the trait's
        /// defaults for the others, and these do not forward: its steps fail with
        /// [`Error::StepsUnsupported`], a [`Completer`](crate::Completer) on it with
        /// [`Error::CompleterUnsupported`], and its pruner takes the default batch size. A
        /// `Forward` forwards every method it does not override, [`Store::begin_steps`],
        /// [`Store::write_step`], [`Store::find_abandoned`], [`Store::prune_batch_size`] and
        /// [`Store::max_response_bytes`] included, and a method the `Store` trait gains later is
        /// forwarded too. [`Store::claim_steps`] is the one exception: it keeps the trait's
        /// default, which claims through the wrapper's own `claim`, so a wrapper that changes
        /// claims or steps is never passed by.
        ///
        /// Override what the wrapper changes: any operation (it then forwards to
        /// [`inner`](Self::inner) itself, or answers on its own), or [`gate`](Self::gate), which
        /// runs before every operation and fails it without reaching the method (to inject a
        /// fault, or refuse writes). [`immediate`](Self::immediate) is `None` unless overridden,
        /// so the engine always reaches the wrapper's `start` and `complete`.
        ///
        /// A wrapper that counts claims and overrides nothing else; the steps of a call run
        /// through it on the memory store's:
        ///
        /// ```
        /// use std::sync::atomic::{AtomicU64, Ordering};
        /// use async_trait::async_trait;
        /// use idem::store::{Forward, Forwarding};
        /// use idem::{Error, Idempotency, Key, MemoryStore, ClaimOutcome, ClaimRequest, Store};
        ///
        /// struct Counted {
        ///     inner: MemoryStore,
        ///     claims: AtomicU64,
        /// }
        ///
        /// #[async_trait]
        /// impl Forward for Counted {
        ///     fn inner(&self) -> &dyn Store {
        ///         &self.inner
        ///     }
        ///
        ///     async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        ///         self.claims.fetch_add(1, Ordering::Relaxed);
        ///         self.inner.claim(request).await
        ///     }
        /// }
        ///
        /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
        /// let store = std::sync::Arc::new(Forwarding(Counted {
        ///     inner: MemoryStore::new(),
        ///     claims: AtomicU64::new(0),
        /// }));
        /// let engine = Idempotency::new(store.clone());
        /// let key = Key::derive("ride", "", "r-1")?;
        /// let fare = engine
        ///     .call(key)
        ///     .run_steps(|steps| async move {
        ///         let fare: u32 = steps.run("quote", || async { Ok::<_, Error>(7) }).await?;
        ///         Ok::<_, Error>(fare)
        ///     })
        ///     .await?;
        /// assert_eq!(fare.into_inner(), 7);
        /// assert_eq!(store.claims.load(Ordering::Relaxed), 1);
        /// # Ok(()) }
        /// ```
        #[async_trait]
        pub trait Forward: Send + Sync + 'static {
            /// The store this one wraps: where every operation the wrapper does not override
            /// goes.
            fn inner(&self) -> &dyn Store;

            /// Runs before every operation (not [`prune_batch_size`](Self::prune_batch_size)
            /// nor [`immediate`](Self::immediate)); an error fails the operation without calling
            /// the wrapper's method. `Ok` unless overridden.
            ///
            /// ```
            /// use idem::store::{Forward, Forwarding, Operation};
            /// use idem::{Error, MemoryStore, Store, StoreError, StoreErrorKind};
            ///
            /// /// A memory store whose completions fail, as a store that goes down would.
            /// struct NoCompletions(MemoryStore);
            ///
            /// impl Forward for NoCompletions {
            ///     fn inner(&self) -> &dyn Store {
            ///         &self.0
            ///     }
            ///     fn gate(&self, op: Operation) -> Result<(), Error> {
            ///         match op {
            ///             Operation::Complete => Err(Error::Store(StoreError::new(
            ///                 StoreErrorKind::Unavailable,
            ///                 "injected",
            ///             ))),
            ///             _ => Ok(()),
            ///         }
            ///     }
            /// }
            ///
            /// let store = Forwarding(NoCompletions(MemoryStore::new()));
            /// assert!(store.gate(Operation::Claim).is_ok());
            /// assert!(store.gate(Operation::Complete).is_err());
            /// ```
            fn gate(&self, op: Operation) -> Result<(), Error> {
                let _ = op;
                Ok(())
            }

            $(
                #[doc = concat!(
                    "[`Store::", stringify!($name), "`]: the inner store's unless overridden."
                )]
                async fn $name(&self, $($arg: $ty),*) -> $ret {
                    self.inner().$name($($arg),*).await
                }
            )*

            /// [`Store::prune_batch_size`]: the inner store's unless overridden.
            fn prune_batch_size(&self) -> u32 {
                self.inner().prune_batch_size()
            }

            /// [`Store::max_response_bytes`]: the inner store's unless overridden.
            fn max_response_bytes(&self) -> Option<usize> {
                self.inner().max_response_bytes()
            }

            /// [`Store::immediate`]: `None` unless overridden, so the engine reaches the
            /// wrapper's [`claim`](Self::claim) and [`complete`](Self::complete) (and its
            /// [`gate`](Self::gate)) through their futures. A wrapper that changes neither, and
            /// gates neither, may return `self.inner().immediate()` to keep the inner store's
            /// direct calls; one that changes either and returns the inner store's would be
            /// bypassed.
            fn immediate(&self) -> Option<&dyn Immediate> {
                None
            }
        }

        #[async_trait]
        impl<F: Forward> Store for Forwarding<F> {
            $(
                async fn $name(&self, $($arg: $ty),*) -> $ret {
                    self.0.gate(Operation::$op)?;
                    self.0.$name($($arg),*).await
                }
            )*

            fn prune_batch_size(&self) -> u32 {
                self.0.prune_batch_size()
            }

            fn max_response_bytes(&self) -> Option<usize> {
                self.0.max_response_bytes()
            }

            fn immediate(&self) -> Option<&dyn Immediate> {
                self.0.immediate()
            }
        }
    };
}

store_methods!(forwarding);

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::{MemoryStore, StoreError, StoreErrorKind};

    /// Overrides nothing but `prune_batch_size`'s source: a memory store that says 7.
    struct Seven(MemoryStore);

    impl Forward for Seven {
        fn inner(&self) -> &dyn Store {
            &self.0
        }
        fn prune_batch_size(&self) -> u32 {
            7
        }
    }

    /// Every operation of the gate's counted, and `Evict` refused.
    struct Gated {
        inner: MemoryStore,
        gated: AtomicU32,
    }

    impl Forward for Gated {
        fn inner(&self) -> &dyn Store {
            &self.inner
        }
        fn gate(&self, op: Operation) -> Result<(), Error> {
            self.gated.fetch_add(1, Ordering::SeqCst);
            match op {
                Operation::Evict => Err(Error::Store(StoreError::new(
                    StoreErrorKind::ReadOnly,
                    "no",
                ))),
                _ => Ok(()),
            }
        }
    }

    #[test]
    fn the_wrappers_answers_reach_the_engine_and_immediate_stays_off() {
        let store = Forwarding(Seven(MemoryStore::new()));
        assert_eq!(Store::prune_batch_size(&store), 7);
        assert!(
            store.0 .0.immediate().is_some(),
            "the inner store answers at once"
        );
        assert!(
            store.immediate().is_none(),
            "the wrapper does not, by default"
        );
    }

    #[tokio::test]
    async fn every_operation_passes_the_gate_first() {
        let store = Forwarding(Gated {
            inner: MemoryStore::new(),
            gated: AtomicU32::new(0),
        });
        let key = Key::derive("s", "", "k").unwrap();
        let lease = Duration::from_secs(30);
        let ClaimOutcome::Claimed(claim) =
            store.claim(ClaimRequest::new(&key, lease)).await.unwrap()
        else {
            panic!("a new key is claimed");
        };
        store.begin_steps(&claim, lease).await.unwrap();
        store.renew(&claim, lease).await.unwrap();
        assert!(store.get(&key).await.unwrap().is_some());
        store
            .find_abandoned(AbandonedQuery::first(1))
            .await
            .unwrap();
        let refused = store.evict(&key).await;
        assert!(
            matches!(&refused, Err(Error::Store(e)) if e.kind() == StoreErrorKind::ReadOnly),
            "{refused:?}"
        );
        assert!(store.get(&key).await.unwrap().is_some(), "the gate kept it");
        assert_eq!(store.gated.load(Ordering::SeqCst), 7);
    }
}
