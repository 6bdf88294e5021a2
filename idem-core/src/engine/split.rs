//! A call split across requests: the claim in one ([`Call::claim`]), the completion, release or
//! renewal in a later one, fenced by the claim's token ([`Idempotency::finish`],
//! [`Idempotency::release`], [`Idempotency::renew`]). For transports whose work runs in another
//! process than the engine: a service that takes `start` and `complete` as two requests
//! (idem-server). The claim goes through the engine's claim path (its policy, waiting, pending
//! completions, observer and metrics), the completion through its completion path (sealing,
//! background retry of a passing failure), so nothing is re-implemented in the transport.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::detach::run_to_end;
use super::finish::{ClaimGuard, Stored, Tombstone};
use super::steps::check_written_step_name;
use super::underway::Releasing;
use super::{Call, Claimed, Encoded, Errors, Format, Idempotency};
use crate::codec::Codec;
use crate::error::{BoxError, Error};
use crate::key::Key;
use crate::observe::{Probe, Scope, Stage};
use crate::record::{Claim, OnLapse, Record, RecordState};
use crate::step::{StepLog, StepWrite};
use crate::store::check_duration;

/// What [`Call::claim`] came to when it did not fail.
///
/// ```
/// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let key = Key::derive("charge", "", "order-1")?;
/// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
/// engine.finish("charge", &claim, b"paid".to_vec()).await?;
/// assert_eq!(engine.call(key).claim().await?, CallClaim::Completed(b"paid".to_vec()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallClaim {
    /// This caller holds the key until the lease ends: it runs the work, then
    /// [`finish`](Idempotency::finish)es or [`release`](Idempotency::release)s the claim,
    /// [`renew`](Idempotency::renew)ing it meanwhile if the work is long.
    Claimed(Claim),
    /// The key completed earlier: the bytes [`finish`](Idempotency::finish) stored.
    Completed(Vec<u8>),
}

/// A completion of a claim taken by [`Call::claim`], made by [`Idempotency::finish`]: it stores
/// its result once awaited, and may first set how long the result is kept and whether a
/// passing store failure is reported.
///
/// ```
/// use std::time::Duration;
/// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let key = Key::derive("charge", "", "order-1")?;
/// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
/// let finish = engine.finish("charge", &claim, b"paid".to_vec());
/// finish.retention(Duration::from_secs(3600)).observed(true).await?;
/// assert_eq!(engine.call(key).claim().await?, CallClaim::Completed(b"paid".to_vec()));
/// # Ok(()) }
/// ```
#[must_use = "a finish stores nothing until it is awaited"]
pub struct Finish<'a, C> {
    engine: &'a Idempotency<C>,
    scope: &'a str,
    claim: &'a Claim,
    result: Vec<u8>,
    retention: Option<Duration>,
    key_retention: Option<Duration>,
    observed: bool,
}

impl<C> Finish<'_, C> {
    /// Keeps the result for `retention` instead of the engine policy's retention.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "order-1")?;
    /// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
    /// let week = Duration::from_secs(7 * 24 * 3600);
    /// engine.finish("charge", &claim, b"paid".to_vec()).retention(week).await?;
    /// # Ok(()) }
    /// ```
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Keeps the key as a tombstone for `key_retention` after the result's retention ends
    /// (zero for none) instead of the engine policy's
    /// [`key_retention`](crate::Policy::key_retention): for a transport whose client says how
    /// long (idem-server's `complete` with `key_retention_ms`, which `RemoteStore` sends from
    /// its engine's policy). One out of range is [`Error::InvalidConfig`], nothing stored.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "order-1")?;
    /// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
    /// engine.finish("charge", &claim, b"paid".to_vec()).key_retention(Duration::ZERO).await?;
    /// # Ok(()) }
    /// ```
    pub fn key_retention(mut self, key_retention: Duration) -> Self {
        self.key_retention = Some(key_retention);
        self
    }

    /// With `true`, a store failure that passes is reported, not retried in the background:
    /// `Ok` only once the result is in the store. For a transport whose client retries the
    /// completion itself and must not be told it landed before it did (idem-server's `complete`
    /// with `observed`, which `RemoteStore` sends, so that the store rule "observed commits"
    /// holds through the network). The claim stays held after such a failure: finish it again.
    ///
    /// ```
    /// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "order-1")?;
    /// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
    /// engine.finish("charge", &claim, b"paid".to_vec()).observed(true).await?;
    /// assert_eq!(engine.call(key).claim().await?, CallClaim::Completed(b"paid".to_vec()));
    /// # Ok(()) }
    /// ```
    pub fn observed(mut self, observed: bool) -> Self {
        self.observed = observed;
        self
    }
}

impl<C> fmt::Debug for Finish<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Finish")
            .field("scope", &self.scope)
            .field("claim", self.claim)
            .field("result_len", &self.result.len())
            .field("retention", &self.retention)
            .field("key_retention", &self.key_retention)
            .field("observed", &self.observed)
            .finish()
    }
}

impl<'a, C: Codec> IntoFuture for Finish<'a, C> {
    type Output = Result<(), Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        let engine = self.engine;
        Box::pin(engine.finish_as(self))
    }
}

/// Who holds a key, as [`Idempotency::holder`] reads it.
///
/// ```
/// use idem::{CallClaim, Error, Holder, Idempotency, Key, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let key = Key::derive("charge", "", "order-1")?;
/// assert_eq!(engine.holder(&key).await?, Holder::Absent);
/// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
/// assert_eq!(engine.holder(&key).await?, Holder::Claimed(claim));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// No live record: never claimed, released, or its lease or retention has ended.
    Absent,
    /// A live claim, with its token.
    Claimed(Claim),
    /// A completed record, with the bytes [`finish`](Idempotency::finish) stored.
    Completed(Vec<u8>),
    /// A claim made with [`OnLapse::Uncertain`](crate::OnLapse::Uncertain) lapsed with no
    /// completion: nobody may act on it but a resolution ([`Idempotency::resolve`]).
    Uncertain {
        /// When its lease ended.
        since: std::time::SystemTime,
    },
    /// The result's retention ended at `since`; the key is a tombstone.
    Expired {
        /// When the result's retention ended.
        since: std::time::SystemTime,
    },
}

/// The stored bytes as they are: what [`Idempotency::finish`] stores, [`Call::claim`] replays.
struct Raw;

impl Format<Vec<u8>> for Raw {
    fn encode(&self, value: &Vec<u8>) -> Encoded {
        Encoded::Bytes(value.clone())
    }

    fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, BoxError> {
        Ok(bytes.to_vec())
    }
}

/// Errors are never stored through the split API.
struct NoErrors;

impl Errors<Error> for NoErrors {
    fn encode(&self, _: &Error) -> Option<Encoded> {
        None
    }

    fn replay(&self, bytes: Vec<u8>) -> Error {
        Error::StoredError(bytes)
    }
}

impl<'e, C: Codec> Call<'e, Idempotency<C>> {
    /// The first half of a call whose work runs elsewhere: claims the key (with the call's
    /// fingerprint, lease and waiting policy) and returns the claim, or the stored result. The
    /// claim is the caller's until its lease ends: it must [`finish`](Idempotency::finish),
    /// [`release`](Idempotency::release) or [`renew`](Idempotency::renew) it, fenced by its
    /// token, possibly from another process. The observer sees [`Stage::Claimed`] here and the
    /// call's end where it is finished or released.
    ///
    /// Errors are the engine's: [`Error::Locked`] (another claim is live), [`Error::KeyReused`]
    /// (another fingerprint), [`Error::ResultNotRetained`], [`Error::InvalidConfig`] (a lease out
    /// of range), [`Error::Store`]. A call without a key is refused with
    /// [`Error::InvalidConfig`]: there is nothing to claim.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "order-1")?;
    /// let first = engine.call(key).lease(Duration::from_secs(15)).claim().await?;
    /// assert!(matches!(first, CallClaim::Claimed(_)));
    /// assert!(matches!(engine.call(key).claim().await, Err(Error::Locked { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn claim(self) -> Result<CallClaim, Error> {
        let Some(key) = self.key else {
            return Err(Error::InvalidConfig(
                "a split call needs a key to claim".into(),
            ));
        };
        let core = &self.engine.inner.core;
        let mut probe = Probe::new(core.observer.as_deref(), &core.meters, &self.scope, key);
        let span = probe.span().clone();
        let claimed = self
            .engine
            .claim_half(
                &mut probe,
                key,
                self.fingerprint,
                &self.overrides,
                super::Plain,
                &Raw,
                &NoErrors,
            )
            .instrument(span)
            .await;
        match claimed {
            Claimed::Ended(out) => out.map(|replayed| CallClaim::Completed(replayed.into_inner())),
            Claimed::Holding(holding, _) => {
                // The call goes on in a later request: its end is reported there.
                drop(probe.suspend());
                Ok(CallClaim::Claimed(holding.claim))
            }
        }
    }
}

impl<C: Codec> Idempotency<C> {
    /// The second half of a [`claim`](Call::claim)'s claim: stores `result` (sealed in the
    /// engine's checksummed envelope, within [`Policy::max_response_bytes`](crate::Policy)),
    /// fenced by the claim's token, once the returned [`Finish`] is awaited (for the policy's
    /// retention unless [`Finish::retention`] says otherwise). Finished even if the caller goes
    /// away; a passing store failure is retried in the background, as for every call (unless
    /// [`Finish::observed`]). [`Error::LeaseLost`] when the key is no longer this claim's (its
    /// lease ran out and another caller claimed it, or it was released): nothing is changed.
    /// Finishing a claim that already finished is `Ok` and keeps the first result. `scope`
    /// labels the call in metrics and the observer, as [`Call::scope_named`].
    ///
    /// ```
    /// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "order-1")?;
    /// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
    /// engine.finish("charge", &claim, b"paid".to_vec()).await?;
    /// engine.finish("charge", &claim, b"other".to_vec()).await?; // the first stands
    /// assert_eq!(engine.call(key).claim().await?, CallClaim::Completed(b"paid".to_vec()));
    /// # Ok(()) }
    /// ```
    pub fn finish<'a>(
        &'a self,
        scope: &'a str,
        claim: &'a Claim,
        result: Vec<u8>,
    ) -> Finish<'a, C> {
        Finish {
            engine: self,
            scope,
            claim,
            result,
            retention: None,
            key_retention: None,
            observed: false,
        }
    }

    /// What an awaited [`Finish`] does.
    async fn finish_as(&self, finish: Finish<'_, C>) -> Result<(), Error> {
        let Finish {
            scope,
            claim,
            result,
            retention,
            key_retention,
            observed,
            ..
        } = finish;
        let policy = &self.inner.core.policy;
        let retention = retention.unwrap_or(policy.retention);
        check_duration("retention", retention)?;
        let key_retention = key_retention.unwrap_or(policy.key_retention);
        if !key_retention.is_zero() {
            check_duration("key_retention", key_retention)?;
        }
        let scope = Scope::Shared(Arc::from(scope));
        let (engine, claim, lease) = (self.clone(), claim.clone(), policy.lease);
        run_to_end(async move {
            let core = &engine.inner.core;
            let mut probe =
                Probe::held(core.observer.as_deref(), &core.meters, &scope, *claim.key());
            let sealed = core.seal_encoded(Encoded::Bytes(result), claim.key());
            let kept = if sealed.retained {
                Stage::Completed
            } else {
                Stage::NotRetained
            };
            let guard = ClaimGuard::new(engine.inner.shared.clone(), claim, OnLapse::Release);
            let stored = if observed {
                guard
                    .complete_once(sealed.bytes, retention, Tombstone::of(key_retention), lease)
                    .await
            } else {
                guard
                    .complete(
                        sealed.bytes,
                        false,
                        None,
                        retention,
                        Tombstone::of(key_retention),
                        lease,
                    )
                    .await
                    .map(|_: Stored| ())
            };
            probe.end_with(&stored, kept);
            stored
        })
        .await
    }

    /// Releases a [`claim`](Call::claim)'s claim so a retry runs the work again, fenced by the
    /// claim's token; visible at once to calls of this process. [`Error::LeaseLost`] when the
    /// key is no longer this claim's, including when it has completed (a completed result is
    /// never deleted by a release).
    ///
    /// ```
    /// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "order-1")?;
    /// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
    /// engine.release("charge", &claim).await?;
    /// assert!(matches!(engine.call(key).claim().await?, CallClaim::Claimed(_)));
    /// assert!(matches!(engine.release("charge", &claim).await, Err(Error::LeaseLost)));
    /// # Ok(()) }
    /// ```
    pub async fn release(&self, scope: &str, claim: &Claim) -> Result<(), Error> {
        let scope = Scope::Shared(Arc::from(scope));
        let (engine, claim) = (self.clone(), claim.clone());
        run_to_end(async move {
            let core = &engine.inner.core;
            let mut probe =
                Probe::held(core.observer.as_deref(), &core.meters, &scope, *claim.key());
            let releasing = Releasing::begin(&engine.inner.shared, *claim.key());
            let released = releasing.store().abort(&claim).await;
            drop(releasing);
            probe.end_with(&released, Stage::Released);
            released
        })
        .await
    }

    /// Extends a [`claim`](Call::claim)'s claim to `lease` from now (the heartbeat of long
    /// work), fenced by its token: [`Error::LeaseLost`] when the key is no longer this claim's;
    /// [`Error::InvalidConfig`] for a lease out of range.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("report", "", "2026-11")?;
    /// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
    /// engine.renew(&claim, Duration::from_secs(60)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
        check_duration("lease", lease)?;
        self.inner.shared.store.renew(claim, lease).await
    }

    /// Takes over the uncertain operation of `key` whose lapsed claim carried `token`, for
    /// `lease` from now: [`Store::take_uncertain`](crate::Store::take_uncertain) through the
    /// engine, for a transport that serves a store's takeover (idem-server's `uncertain.take`
    /// route) without reaching around the engine. [`Error::NotUncertain`] when the key is not
    /// uncertain under that token (nothing changed); [`Error::InvalidConfig`] for a lease out
    /// of range. [`resolve`](Self::resolve) is the whole resolution in one call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Error, Idempotency, Key, MemoryStore, Token};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "c-1")?;
    /// let refused = engine.take_uncertain(&key, Token::random(), Duration::from_secs(30)).await;
    /// assert!(matches!(refused, Err(Error::NotUncertain { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn take_uncertain(
        &self,
        key: &Key,
        token: crate::key::Token,
        lease: Duration,
    ) -> Result<Claim, Error> {
        check_duration("lease", lease)?;
        self.inner
            .shared
            .store
            .take_uncertain(key, token, lease)
            .await
    }

    /// The record of `key` as the store keeps it (expired reads as `None`), its result still
    /// sealed in the engine's envelope ([`StoredResult::result`](crate::StoredResult::result)
    /// opens it): [`Store::get`](crate::Store::get) through the engine, for a transport that
    /// serves a store's reads (idem-server's `get` route) without reaching around the engine.
    ///
    /// ```
    /// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore, RecordState};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "order-1")?;
    /// assert!(engine.record(&key).await?.is_none());
    /// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
    /// let record = engine.record(&key).await?.expect("claimed");
    /// assert!(matches!(record.state, RecordState::InProgress { token, .. } if token == claim.token()));
    /// # Ok(()) }
    /// ```
    pub async fn record(&self, key: &Key) -> Result<Option<Record>, Error> {
        self.inner.shared.store.get(key).await
    }

    /// Deletes up to `limit` records whose lease or retention has ended, and the ended steps
    /// after them: [`Store::prune_expired`](crate::Store::prune_expired) through the engine,
    /// for a transport that offers pruning (idem-server's `prune` route). A
    /// [`Pruner`](crate::Pruner) does this in the background for a process that owns its store.
    ///
    /// ```
    /// use idem::{Error, Idempotency, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// assert_eq!(engine.prune_expired(100).await?, 0);
    /// # Ok(()) }
    /// ```
    pub async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        self.inner.shared.store.prune_expired(limit).await
    }

    /// Begins (or resumes) the steps of a [`claim`](Call::claim)'s claim, whose work runs
    /// elsewhere: [`Store::begin_steps`](crate::Store::begin_steps) through the engine, fenced
    /// by the claim's token. [`Error::InvalidConfig`] for a retention out of range, nothing
    /// read; [`Error::LeaseLost`], [`Error::StepsUnsupported`] as the store says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore, StepWrite};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("ride", "", "r-1")?;
    /// let day = Duration::from_secs(86_400);
    /// let CallClaim::Claimed(claim) = engine.call(key).claim().await? else { unreachable!() };
    /// assert_eq!(engine.begin_steps(&claim, day).await?.attempt, 1);
    /// engine.write_step(&claim, StepWrite { name: "charge", position: 0, result: Some(b"7"), retention: day, on_lapse: None }).await?;
    /// assert_eq!(engine.begin_steps(&claim, day).await?.steps.len(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn begin_steps(&self, claim: &Claim, retention: Duration) -> Result<StepLog, Error> {
        check_duration("retention", retention)?;
        self.inner.shared.store.begin_steps(claim, retention).await
    }

    /// Stores that a step of a [`claim`](Call::claim)'s claim begins, or its result:
    /// [`Store::write_step`](crate::Store::write_step) through the engine, fenced by the
    /// claim's token (see [`begin_steps`](Self::begin_steps) for an example). A step name of
    /// 0 or over [`MAX_STEP_NAME_LEN`](crate::MAX_STEP_NAME_LEN) bytes, or one of idem's own
    /// prefix `idem.` other than the records an engine writes itself (the input, an attempt's
    /// failure, a failed resolution's rerun, which a transport relaying another engine's store
    /// calls passes on), is [`Error::InvalidStep`], a retention out of range
    /// [`Error::InvalidConfig`]; either writes nothing. A step that has its result keeps it
    /// (`Ok`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{CallClaim, Error, Idempotency, Key, MemoryStore, StepWrite};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let CallClaim::Claimed(claim) = engine.call(Key::derive("ride", "", "r-2")?).claim().await? else { unreachable!() };
    /// let unnamed = StepWrite { name: "", position: 0, result: None, retention: Duration::from_secs(60), on_lapse: None };
    /// let refused = engine.write_step(&claim, unnamed).await;
    /// assert!(matches!(refused, Err(Error::InvalidStep(_))));
    /// # Ok(()) }
    /// ```
    pub async fn write_step(&self, claim: &Claim, step: StepWrite<'_>) -> Result<(), Error> {
        step.check()?;
        check_written_step_name(step.name)?;
        self.inner.shared.store.write_step(claim, step).await
    }

    /// Who holds `key` now, read without claiming it: for transports whose clients complete
    /// or release a key without the claim's token (they then act on whichever claim is live),
    /// or read a record they must not claim. A completed record's result is checked as a
    /// replay's is ([`Error::ResultNotRetained`], a corrupt envelope).
    pub async fn holder(&self, key: &Key) -> Result<Holder, Error> {
        Ok(match self.inner.shared.store.get(key).await? {
            None => Holder::Absent,
            Some(record) => match record.state {
                RecordState::InProgress { token, .. } => Holder::Claimed(Claim::new(*key, token)),
                RecordState::Completed(stored) => Holder::Completed(stored.result()?.to_vec()),
                RecordState::Uncertain { since, .. } => Holder::Uncertain { since },
                RecordState::Expired { since } => Holder::Expired { since },
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::clock::ManualClock;
    use crate::observe::{CallEvent, Observer};
    use crate::store::memory::MemoryStore;
    use crate::Fingerprint;

    #[derive(Default, Clone)]
    struct Seen(Arc<Mutex<Vec<Stage>>>);

    impl Observer for Seen {
        fn observe(&self, event: &CallEvent<'_>) {
            self.0.lock().unwrap().push(event.stage());
        }
    }

    fn key(k: &str) -> Key {
        Key::derive("split", "", k).unwrap()
    }

    async fn claimed(engine: &Idempotency, k: &str) -> Claim {
        match engine.call(key(k)).claim().await.unwrap() {
            CallClaim::Claimed(claim) => claim,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn claim_then_finish_replays_and_reports_one_call() {
        let seen = Seen::default();
        let engine = Idempotency::builder(MemoryStore::new())
            .observer(seen.clone())
            .build()
            .unwrap();
        let claim = claimed(&engine, "a").await;
        assert!(matches!(
            engine.call(key("a")).claim().await,
            Err(Error::Locked { .. })
        ));
        engine.finish("split", &claim, b"r".to_vec()).await.unwrap();
        assert_eq!(
            engine.call(key("a")).claim().await.unwrap(),
            CallClaim::Completed(b"r".to_vec())
        );
        assert_eq!(
            *seen.0.lock().unwrap(),
            [
                Stage::Claimed,
                Stage::Locked,
                Stage::Completed,
                Stage::Replayed
            ]
        );
    }

    #[tokio::test]
    async fn a_stale_holder_changes_nothing() {
        let clock = ManualClock::new();
        let engine = Idempotency::new(MemoryStore::with_clock(clock.clone()));
        let stale = match engine
            .call(key("b"))
            .lease(Duration::from_secs(1))
            .claim()
            .await
            .unwrap()
        {
            CallClaim::Claimed(claim) => claim,
            other => panic!("{other:?}"),
        };
        clock.advance(Duration::from_secs(2));
        let fresh = claimed(&engine, "b").await;
        assert_ne!(stale.token(), fresh.token());
        for refused in [
            engine.finish("split", &stale, b"old".to_vec()).await,
            engine.release("split", &stale).await,
            engine.renew(&stale, Duration::from_secs(5)).await,
        ] {
            assert!(matches!(refused, Err(Error::LeaseLost)), "{refused:?}");
        }
        assert_eq!(
            engine.holder(&key("b")).await.unwrap(),
            Holder::Claimed(fresh.clone())
        );
        engine
            .finish("split", &fresh, b"new".to_vec())
            .await
            .unwrap();
        assert_eq!(
            engine.call(key("b")).claim().await.unwrap(),
            CallClaim::Completed(b"new".to_vec())
        );
        assert!(matches!(
            engine.release("split", &fresh).await,
            Err(Error::LeaseLost)
        ));
        assert_eq!(
            engine.holder(&key("b")).await.unwrap(),
            Holder::Completed(b"new".to_vec())
        );
    }

    #[tokio::test]
    async fn release_frees_the_key_and_a_fingerprint_is_kept() {
        let engine = Idempotency::new(MemoryStore::new());
        let fp = Fingerprint::of_bytes(b"one");
        let CallClaim::Claimed(claim) =
            engine.call(key("c")).fingerprint(fp).claim().await.unwrap()
        else {
            panic!("not claimed")
        };
        assert!(matches!(
            engine
                .call(key("c"))
                .fingerprint(Fingerprint::of_bytes(b"two"))
                .claim()
                .await,
            Err(Error::KeyReused)
        ));
        engine.release("split", &claim).await.unwrap();
        assert_eq!(engine.holder(&key("c")).await.unwrap(), Holder::Absent);
        assert!(matches!(
            engine.call(key("c")).claim().await.unwrap(),
            CallClaim::Claimed(_)
        ));
    }

    #[tokio::test]
    async fn out_of_range_durations_change_nothing() {
        let engine = Idempotency::new(MemoryStore::new());
        assert!(matches!(
            engine.call(key("d")).lease(Duration::ZERO).claim().await,
            Err(Error::InvalidConfig(_))
        ));
        assert_eq!(engine.holder(&key("d")).await.unwrap(), Holder::Absent);
        let claim = claimed(&engine, "d").await;
        assert!(matches!(
            engine
                .finish("split", &claim, b"x".to_vec())
                .retention(Duration::ZERO)
                .await,
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            engine.renew(&claim, Duration::ZERO).await,
            Err(Error::InvalidConfig(_))
        ));
        assert_eq!(
            engine.holder(&key("d")).await.unwrap(),
            Holder::Claimed(claim)
        );
    }

    #[tokio::test]
    async fn a_result_over_the_limit_is_kept_as_not_retained() {
        let engine = Idempotency::builder(MemoryStore::new())
            .max_response_bytes(4)
            .build()
            .unwrap();
        let claim = claimed(&engine, "e").await;
        engine
            .finish("split", &claim, b"too long".to_vec())
            .await
            .unwrap();
        assert!(matches!(
            engine.call(key("e")).claim().await,
            Err(Error::ResultNotRetained { .. })
        ));
    }

    /// A memory store that keeps responses of at most `limit` bytes, and counts what it is
    /// handed over that.
    struct Small {
        records: MemoryStore,
        limit: usize,
        handed_over: std::sync::atomic::AtomicUsize,
    }

    impl Small {
        fn engine(limit: usize) -> (Arc<crate::store::Forwarding<Small>>, Idempotency) {
            let store = Arc::new(crate::store::Forwarding(Small {
                records: MemoryStore::new(),
                limit,
                handed_over: Default::default(),
            }));
            (store.clone(), Idempotency::from_arc(store))
        }
    }

    #[async_trait::async_trait]
    impl crate::store::Forward for Small {
        fn inner(&self) -> &dyn crate::Store {
            &self.records
        }

        fn max_response_bytes(&self) -> Option<usize> {
            Some(self.limit)
        }

        async fn complete(
            &self,
            claim: &crate::Claim,
            completion: crate::Completion<'_>,
        ) -> Result<(), Error> {
            if completion.response.is_some_and(|r| r.len() > self.limit) {
                self.handed_over
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            crate::Store::complete(&self.records, claim, completion).await
        }
    }

    /// **The engine seals "not retained", the store never does.** Over a store with a limit of
    /// its own, a result whose stored form (the result and the envelope's 6-byte head) is
    /// over it is kept as not retained by the engine, with the store's limit as the reason,
    /// and the store is never handed more than it keeps (not even the note: a reason that
    /// would not fit is cut); one that fits exactly replays.
    #[tokio::test]
    async fn a_result_over_the_stores_own_limit_is_sealed_by_the_engine() {
        let (store, engine) = Small::engine(80);
        let claim = claimed(&engine, "f").await;
        engine
            .finish("split", &claim, vec![b'x'; 75])
            .await
            .unwrap();
        let again = engine.call(key("f")).claim().await;
        assert!(
            matches!(&again, Err(Error::ResultNotRetained { reason })
                if reason == "stored, it is 81 bytes, more than the store keeps in a record (80)"),
            "{again:?}"
        );
        let claim = claimed(&engine, "g").await;
        engine
            .finish("split", &claim, vec![b'y'; 74])
            .await
            .unwrap();
        assert!(matches!(
            engine.call(key("g")).claim().await,
            Ok(CallClaim::Completed(bytes)) if bytes == vec![b'y'; 74]
        ));
        // A store too small for the whole reason keeps the note with its reason cut.
        let (tiny, engine) = Small::engine(30);
        let claim = claimed(&engine, "h").await;
        engine
            .finish("split", &claim, vec![b'z'; 40])
            .await
            .unwrap();
        assert!(matches!(
            engine.call(key("h")).claim().await,
            Err(Error::ResultNotRetained { reason }) if reason == "stored, it is 46 bytes, "
        ));
        for store in [store, tiny] {
            assert_eq!(
                store.handed_over.load(std::sync::atomic::Ordering::SeqCst),
                0
            );
        }
    }

    /// **A store that keeps more raises the default, never a limit that was set.** An engine
    /// whose limit was not set takes a store's larger one (an offloading store's): a result
    /// over the 1 MiB default replays. A smaller store limit leaves the policy's default, and
    /// a limit set on the builder stays whatever the store says.
    #[tokio::test]
    async fn a_store_that_keeps_more_raises_the_default_limit() {
        let default = crate::Policy::default().max_response_bytes();
        let (_, engine) = Small::engine(4 << 20);
        assert_eq!(engine.policy().max_response_bytes(), 4 << 20);
        let claim = claimed(&engine, "i").await;
        let large = vec![b'l'; default + 1];
        engine.finish("split", &claim, large.clone()).await.unwrap();
        assert!(matches!(
            engine.call(key("i")).claim().await,
            Ok(CallClaim::Completed(bytes)) if bytes == large
        ));
        let (_, engine) = Small::engine(1000);
        assert_eq!(engine.policy().max_response_bytes(), default);
        let set = Idempotency::builder(crate::store::Forwarding(Small {
            records: MemoryStore::new(),
            limit: 4 << 20,
            handed_over: Default::default(),
        }))
        .max_response_bytes(1000)
        .build()
        .unwrap();
        assert_eq!(set.policy().max_response_bytes(), 1000);
    }
}
