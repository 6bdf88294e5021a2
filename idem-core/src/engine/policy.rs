//! What both engines share: the policy, the builder, the outcome, and the core that resolves a
//! call's options and encodes, seals and replays its result.

use std::sync::Arc;
use std::time::Duration;

use super::cache::ReplayCache;
use super::stored::{seal, Encoded, Sealed};
use crate::codec::{Codec, JsonCodec};
use crate::error::Error;
use crate::key::Key;
use crate::observe::{Meters, Observer, DEFAULT_LATENCIES_ONE_IN};
use crate::record::OnLapse;
use crate::store::{check_duration, Store};

/// What a call does when another call holds a live claim on its key.
///
/// ```
/// use std::time::Duration;
/// use idem::OnLocked;
/// let wait = OnLocked::Wait { timeout: Duration::from_secs(5) };
/// assert_ne!(wait, OnLocked::FailFast);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLocked {
    /// Return [`Error::Locked`] at once with a hint of when to retry (the default).
    #[default]
    FailFast,
    /// Wait until the other call finishes, then replay its result (or run, if it failed), giving
    /// up with [`Error::Locked`] after `timeout`. Waiters in one process share one poller per key
    /// and are woken at once when a call in the same process finishes.
    Wait {
        /// How long to wait at most.
        timeout: Duration,
    },
}

/// How an engine treats every call, unless the call says otherwise (see
/// [`Call`](crate::Call)). Set it with the engine's [`EngineBuilder`]; read it with
/// [`Idempotency::policy`](crate::Idempotency::policy).
///
/// ```
/// use std::time::Duration;
/// use idem::{Idempotency, MemoryStore};
/// let engine = Idempotency::builder(MemoryStore::new()).retention(Duration::from_secs(3600)).build()?;
/// assert_eq!(engine.policy().retention(), Duration::from_secs(3600));
/// assert_eq!(engine.policy().lease(), Duration::from_secs(30));
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) on_locked: OnLocked,
    pub(crate) max_response_bytes: usize,
    /// Whether `max_response_bytes` was set: if not, a store that keeps more (one that offloads
    /// large results) raises it to its own limit when the engine is built.
    pub(crate) max_response_set: bool,
    pub(crate) key_retention: Duration,
    pub(crate) on_lapse: OnLapse,
}

/// [`Policy::key_retention`]'s default: seven days.
pub const DEFAULT_KEY_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

impl Default for Policy {
    fn default() -> Self {
        Policy {
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            on_locked: OnLocked::FailFast,
            max_response_bytes: 1 << 20,
            max_response_set: false,
            key_retention: DEFAULT_KEY_RETENTION,
            on_lapse: OnLapse::Release,
        }
    }
}

impl Policy {
    /// How long a claim blocks its key without a heartbeat. The engine renews it every third of
    /// the lease while the work runs, so a crashed worker blocks its key for at most one lease.
    /// Default 30 s.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// How long a completed result is replayed. Default 24 h.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// What to do when the key is locked by another call. Default [`OnLocked::FailFast`].
    pub fn on_locked(&self) -> OnLocked {
        self.on_locked
    }

    /// The largest encoded result stored, in bytes. Default 1 MiB, or, when the store states a
    /// larger limit of its own ([`Store::max_response_bytes`](crate::Store::max_response_bytes):
    /// a store that offloads large results to object storage), the store's. A larger result is
    /// not kept: the caller still gets it, and the key is recorded as completed without its
    /// result, so a retry gets [`Error::ResultNotRetained`] instead of running the work again.
    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    /// How long a key is kept after its result's retention ends, as a tombstone without the
    /// result: a retry then gets [`Error::ResultExpired`] instead of running the work again.
    /// Default [`DEFAULT_KEY_RETENTION`], seven days; zero frees the key when the retention
    /// ends. docs/architecture.md ("Past the lease") says why, and what a tombstone costs per
    /// store.
    pub fn key_retention(&self) -> Duration {
        self.key_retention
    }

    /// What a call's key becomes if its claim lapses with no completion. Default
    /// [`OnLapse::Release`]: a retry runs the work again.
    pub fn on_lapse(&self) -> OnLapse {
        self.on_lapse
    }

    fn validate(&self) -> Result<(), Error> {
        check_duration("lease", self.lease)?;
        check_duration("retention", self.retention)?;
        if !self.key_retention.is_zero() {
            check_duration("key_retention", self.key_retention)?;
        }
        if self.max_response_bytes == 0 {
            return Err(Error::InvalidConfig(
                "max_response_bytes must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// A result and whether it was computed now or replayed from the store.
///
/// ```
/// use idem::Outcome;
/// let o = Outcome::Replayed(7);
/// assert!(o.is_replayed());
/// assert_eq!(o.into_inner(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The work ran in this call.
    Fresh(T),
    /// An earlier call's stored result.
    Replayed(T),
}

impl<T> Outcome<T> {
    /// The value, fresh or replayed.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Fresh(v) | Outcome::Replayed(v) => v,
        }
    }

    /// Borrows the value.
    pub fn value(&self) -> &T {
        match self {
            Outcome::Fresh(v) | Outcome::Replayed(v) => v,
        }
    }

    /// Whether the value was replayed from the store.
    pub fn is_replayed(&self) -> bool {
        matches!(self, Outcome::Replayed(_))
    }
}

/// Builds an engine with a non-default policy or codec: an [`Idempotency`](crate::Idempotency)
/// from [`Idempotency::builder`](crate::Idempotency::builder), or (features `sqlite`,
/// `postgres`) a `Transactional` from `Transactional::builder`. The policy is checked once, by
/// `build`.
///
/// ```
/// use std::time::Duration;
/// use idem::{Idempotency, MemoryStore, OnLocked};
/// let engine = Idempotency::builder(MemoryStore::new())
///     .lease(Duration::from_secs(10))
///     .retention(Duration::from_secs(3600))
///     .on_locked(OnLocked::Wait { timeout: Duration::from_secs(5) })
///     .build()?;
/// assert_eq!(engine.policy().lease(), Duration::from_secs(10));
///
/// let zero = Idempotency::builder(MemoryStore::new()).retention(Duration::ZERO).build();
/// assert!(matches!(zero, Err(idem::Error::InvalidConfig(_))));
/// # Ok::<(), idem::Error>(())
/// ```
#[must_use = "call `build` to make the engine"]
pub struct EngineBuilder<S = Arc<dyn Store>, C = JsonCodec> {
    pub(crate) store: S,
    pub(crate) policy: Policy,
    pub(crate) codec: C,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    pub(crate) replay_cache: Option<ReplayCache>,
    pub(crate) latencies_one_in: u32,
}

impl<S, C: Codec> EngineBuilder<S, C> {
    pub(crate) fn with(store: S, codec: C) -> EngineBuilder<S, C> {
        EngineBuilder {
            store,
            policy: Policy::default(),
            codec,
            observer: None,
            replay_cache: None,
            latencies_one_in: DEFAULT_LATENCIES_ONE_IN,
        }
    }

    /// Sets [`Policy::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.policy.lease = lease;
        self
    }

    /// Sets [`Policy::retention`].
    pub fn retention(mut self, retention: Duration) -> Self {
        self.policy.retention = retention;
        self
    }

    /// Sets [`Policy::on_locked`]. (A transactional engine has no use for it: a concurrent
    /// duplicate waits on the database's lock.)
    pub fn on_locked(mut self, on_locked: OnLocked) -> Self {
        self.policy.on_locked = on_locked;
        self
    }

    /// Sets [`Policy::max_response_bytes`].
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.policy.max_response_bytes = limit;
        self.policy.max_response_set = true;
        self
    }

    /// Sets [`Policy::key_retention`] (zero for no tombstones).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Idempotency, MemoryStore};
    /// let engine = Idempotency::builder(MemoryStore::new()).key_retention(Duration::ZERO).build()?;
    /// assert_eq!(engine.policy().key_retention(), Duration::ZERO);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn key_retention(mut self, key_retention: Duration) -> Self {
        self.policy.key_retention = key_retention;
        self
    }

    /// Sets [`Policy::on_lapse`] for every call of the engine (a call may set its own).
    ///
    /// ```
    /// use idem::{Idempotency, MemoryStore, OnLapse};
    /// let engine = Idempotency::builder(MemoryStore::new()).on_lapse(OnLapse::Uncertain).build()?;
    /// assert_eq!(engine.policy().on_lapse(), OnLapse::Uncertain);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn on_lapse(mut self, on_lapse: OnLapse) -> Self {
        self.policy.on_lapse = on_lapse;
        self
    }

    /// Uses another codec for stored results.
    pub fn codec<C2: Codec>(self, codec: C2) -> EngineBuilder<S, C2> {
        EngineBuilder {
            store: self.store,
            policy: self.policy,
            codec,
            observer: self.observer,
            replay_cache: self.replay_cache,
            latencies_one_in: self.latencies_one_in,
        }
    }

    /// Keeps completed records in this process, so a replay of a hot key costs no round trip;
    /// see [`ReplayCache`] for its bounds and what a cached entry can and cannot cause across
    /// nodes. Off by default. (A transactional engine does not use it: its replays are read in
    /// the caller's transaction.)
    pub fn replay_cache(mut self, cache: ReplayCache) -> Self {
        self.replay_cache = Some(cache);
        self
    }

    /// Calls `observer` at each stage of every guarded call (claimed, then completed, replayed,
    /// released, locked, …): for audit logs, alerts, tests. Unset (the default), nothing is
    /// called. See [`Observer`](crate::Observer). (A transactional engine reports nothing: its
    /// calls end with the caller's transaction.)
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Records the latency histograms of the `metrics` feature (`idem_claim_seconds`,
    /// `idem_work_seconds`, `idem_complete_seconds`) for one call in `one_in`, each call drawn
    /// at random; `1` records every call. The default is
    /// [`DEFAULT_LATENCIES_ONE_IN`](crate::DEFAULT_LATENCIES_ONE_IN).
    ///
    /// Counters (`idem_calls_total`) and the in-flight gauge always count every call, so take
    /// call rates from `idem_calls_total`: a sampled histogram's `_count` is about `1/one_in` of
    /// the calls, while its quantiles and its mean estimate those of all calls. Why sample: with
    /// the Prometheus exporter a histogram sample costs about 150 instructions (it keeps each
    /// sample with a timestamp), and a new key plus its replay records four. Measured on the
    /// memory store's full path (`idem-bench`), metrics and tracing cost 10-11 % with every
    /// call's latencies and 0-4 % at one call in 16; see `docs/operations.md`. At low traffic,
    /// where that cost is nothing beside the work, `1` gives histograms of every call.
    /// Observers and the tracing span are not sampled. `0` is refused by `build`.
    ///
    /// ```
    /// use idem::{Idempotency, MemoryStore};
    /// // Every call timed, as a low-traffic service may prefer.
    /// let engine = Idempotency::builder(MemoryStore::new()).sample_latencies(1).build()?;
    /// # let _ = engine;
    /// let zero = Idempotency::builder(MemoryStore::new()).sample_latencies(0).build();
    /// assert!(matches!(zero, Err(idem::Error::InvalidConfig(_))));
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn sample_latencies(mut self, one_in: u32) -> Self {
        self.latencies_one_in = one_in;
        self
    }

    /// Checks the policy and hands over what the engine is made of.
    pub(crate) fn parts(self) -> Result<(S, Core<C>), Error> {
        self.policy.validate()?;
        if self.latencies_one_in == 0 {
            return Err(Error::InvalidConfig(
                "sample_latencies takes 1 (time every call) or more (one call in that many), not 0"
                    .into(),
            ));
        }
        let core = Core {
            policy: self.policy,
            codec: self.codec,
            observer: self.observer,
            meters: Arc::new(Meters::new(self.latencies_one_in)),
            replay_cache: self.replay_cache,
            store_limit: None,
        };
        Ok((self.store, core))
    }
}

/// The per-call choices of a [`Call`](crate::Call); `None` keeps the policy's. Public for the
/// attribute's expansion (`__private`) and for adapters ([`adapter`](crate::adapter)), which
/// keep one set of choices for all their calls (a layer's builder sets them once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    pub(crate) lease: Option<Duration>,
    pub(crate) retention: Option<Duration>,
    pub(crate) on_locked: Option<OnLocked>,
    pub(crate) on_lapse: Option<OnLapse>,
    /// The call's label in metrics, traces and hooks (the attribute's scope).
    pub(crate) scope: Option<&'static str>,
}

impl Overrides {
    /// Labels the call with the attribute's scope.
    pub fn scoped(mut self, scope: &'static str) -> Overrides {
        self.scope = Some(scope);
        self
    }

    /// The call's lease, as [`Call::lease`](crate::Call::lease) sets it.
    pub fn lease(mut self, lease: Duration) -> Overrides {
        self.lease = Some(lease);
        self
    }

    /// The call's retention, as [`Call::retention`](crate::Call::retention) sets it.
    pub fn retention(mut self, retention: Duration) -> Overrides {
        self.retention = Some(retention);
        self
    }

    /// What the call does on a live claim, as [`Call::on_locked`](crate::Call::on_locked) sets
    /// it.
    pub fn on_locked(mut self, on_locked: OnLocked) -> Overrides {
        self.on_locked = Some(on_locked);
        self
    }

    /// What the call's key becomes if its claim lapses, as
    /// [`Call::on_lapse`](crate::Call::on_lapse) sets it.
    pub fn on_lapse(mut self, on_lapse: OnLapse) -> Overrides {
        self.on_lapse = Some(on_lapse);
        self
    }

    /// Checks the lease and the retention set here as a call checks them when it runs (each
    /// between 1 ms and 10 years), for configuration checked before any call: an
    /// [`Error::InvalidConfig`] naming the first out of range.
    pub fn check(&self) -> Result<(), Error> {
        if let Some(lease) = self.lease {
            check_duration("lease", lease)?;
        }
        if let Some(retention) = self.retention {
            check_duration("retention", retention)?;
        }
        Ok(())
    }
}

/// A call's options, resolved against the policy and checked.
#[derive(Debug, Clone, Copy)]
pub struct Resolved {
    /// The call's lease.
    pub lease: Duration,
    /// How long the call's result is kept.
    pub retention: Duration,
    /// What the call does when its key is locked.
    pub on_locked: OnLocked,
    /// What the call's key becomes if its claim lapses.
    pub on_lapse: OnLapse,
}

/// What both engines are made of besides their store: the policy, the codec and the observer,
/// and what they decide about a call (its options, how its result is stored and replayed).
#[derive(Clone)]
pub struct Core<C> {
    pub(crate) policy: Policy,
    pub(crate) codec: C,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    /// The metric handles of the calls' scopes (feature `metrics`).
    pub(crate) meters: Arc<Meters>,
    /// The replay cache's settings, if it is on.
    pub(crate) replay_cache: Option<ReplayCache>,
    /// The store's own limit on a stored response ([`Store::max_response_bytes`]), read when
    /// the engine is built ([`Core::fit`]).
    ///
    /// [`Store::max_response_bytes`]: crate::Store::max_response_bytes
    pub(crate) store_limit: Option<usize>,
}

impl<C> Core<C> {
    /// The default policy, no observer.
    pub(crate) fn new(codec: C) -> Core<C> {
        Core {
            policy: Policy::default(),
            codec,
            observer: None,
            meters: Arc::default(),
            replay_cache: None,
            store_limit: None,
        }
    }

    /// This core over `store`: it learns the store's limit on a stored response, so it keeps a
    /// result over it as not retained itself instead of handing it to the store.
    /// A policy whose limit was not set takes a larger one the store states (an offloading
    /// store's), so that its default does not keep a result the store could keep as not
    /// retained.
    pub(crate) fn fit(mut self, store: &dyn crate::Store) -> Core<C> {
        self.store_limit = store.max_response_bytes();
        if let (false, Some(limit)) = (self.policy.max_response_set, self.store_limit) {
            self.policy.max_response_bytes = self.policy.max_response_bytes.max(limit);
        }
        self
    }
}

impl<C> std::fmt::Debug for Core<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("policy", &self.policy)
            .field("observer", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

impl<C: Codec> Core<C> {
    /// The call's options. The policy was checked when the engine was built, so only what the
    /// call overrides is checked here: each duration once per call.
    #[inline]
    pub(crate) fn resolve(&self, overrides: &Overrides) -> Result<Resolved, Error> {
        let pick = |what, given: Option<Duration>, default| match given {
            Some(d) => check_duration(what, d).map(|()| d),
            None => Ok(default),
        };
        Ok(Resolved {
            lease: pick("lease", overrides.lease, self.policy.lease)?,
            retention: pick("retention", overrides.retention, self.policy.retention)?,
            on_locked: overrides.on_locked.unwrap_or(self.policy.on_locked),
            on_lapse: overrides.on_lapse.unwrap_or(self.policy.on_lapse),
        })
    }

    /// `value` in its stored form: encoded by the codec and sealed, or the note that it was not
    /// retained (too large, not encodable).
    pub(crate) fn seal<T: serde::Serialize + ?Sized>(&self, value: &T, key: &Key) -> Sealed {
        self.seal_encoded(Encoded::from(self.codec.encode(value)), key)
    }

    /// An already encoded result in its stored form, within the policy's size limit and the
    /// store's.
    pub(crate) fn seal_encoded(&self, encoded: Encoded, key: &Key) -> Sealed {
        seal(
            encoded,
            self.policy.max_response_bytes,
            self.store_limit,
            key,
        )
    }

    /// Decodes a stored value with the codec.
    pub(crate) fn decode<T: serde::de::DeserializeOwned>(
        &self,
        bytes: &[u8],
    ) -> Result<T, crate::error::BoxError> {
        self.codec.decode(bytes)
    }
}
