//! The engines: drive claim → run → complete (or abort) over a store.
//!
//! [`Idempotency`] (this file) holds a shared [`Store`] and runs calls with their own lease
//! renewal, waiting and cancellation handling; `Transactional` runs them on the caller's
//! database transaction. Both are built by one [`EngineBuilder`], take their calls through one
//! [`Call`] builder, and share one [`Core`](policy::Core): the policy, the option resolution, and
//! how results are sealed and replayed.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::codec::{Codec, JsonCodec};
use crate::error::{BoxError, Error};
use crate::key::{Fingerprint, Key};
use crate::observe::{Probe, Stage};
use crate::record::{Claim, ClaimOutcome, ClaimRequest, OnLapse, StoredResult};
use crate::store::Store;

mod cache;
mod call;
mod claim;
mod detach;
mod finish;
mod policy;
mod resolve;
mod split;
mod steps;
mod stored;
mod underway;
mod waiters;

pub use cache::ReplayCache;
pub use call::Call;
pub use policy::{EngineBuilder, OnLocked, Outcome, Policy, DEFAULT_KEY_RETENTION};
pub use resolve::{Reconciled, Resolution};
pub use split::{CallClaim, Finish, Holder};
pub use steps::{atomic_step, AtomicStep, Attempt, Step, Steps};

pub use policy::Overrides;
pub use policy::{Core, Resolved};
pub use stored::Encoded;

use cache::{Cache, Hit, Known};
use claim::attempt;
pub(crate) use claim::{ClaimMode, Plain, WithSteps};
use detach::run_to_end;
pub(crate) use finish::renewing;
use finish::{pending_retry_after, ClaimGuard, PendingResult, Stored, Tombstone};
pub(crate) use stored::replay;
use underway::{Completions, Releases};
use waiters::{PollerRole, Typical, Waiters};

/// The engine: wraps work in claim → run → complete, so a duplicate call replays the stored
/// result instead of running again. Cheap to clone (one `Arc`).
///
/// Round trips per call (on top of the work itself; a SQL store's `start` may add one read, see
/// its `ClaimOrder`):
///
/// | path | statements |
/// |---|---|
/// | new key | 1 claim + 1 complete (+ 1 renew per third of the lease the work runs) |
/// | replay | 1 (the claim attempt returns the stored record) |
/// | work fails, cancelled or panics (not detached) | 1 claim + 1 abort |
/// | completion fails for a passing reason | 1 claim + 1 complete, then the completion again in the background until it lands |
/// | locked, fail fast | 1 |
/// | replay with the [`ReplayCache`] on, after the key's first replay in this process | 0 |
///
/// # What a call guarantees when things go wrong
///
/// | what happens | what the engine does |
/// |---|---|
/// | the caller is cancelled (a `timeout`, a dropped future) while the work runs | [`Call::run_detached`]: the work runs on to the end on its own task and its result is stored, so a retry replays it. [`Call::run`] and [`Call::run_storing_errors`] cannot keep borrowed work alive: they release the claim, and a retry runs the work again |
/// | the caller is cancelled while the claim statement is in flight | the statement is finished on a task of its own and whatever it claimed is released |
/// | the caller is cancelled while the result is being stored | the completion is finished on a task of its own |
/// | a retry in this process while a claim is being released | the retry waits for the release (one statement), never a [`Error::Locked`] for a key that is being freed |
/// | the result is larger than [`Policy::max_response_bytes`] or cannot be encoded | the caller gets its result; the key is kept as "completed, result not retained" and a retry gets [`Error::ResultNotRetained`], never a second execution |
/// | storing the result fails for a passing reason (store unreachable, statement timeout, disk full) | the caller gets its result; the completion is retried in the background, fenced by the claim's token, with the lease renewed every third of it meanwhile, until it lands, the key is taken over, or the retention ends |
/// | a call in this process meets a result still being stored in the background | it waits for that completion (at most a lease) and replays the result; it never claims the key |
/// | the claim was taken over while the work ran (its lease ran out) | [`Error::LeaseLost`]: the work may have run twice |
///
/// A process that exits (or a runtime that shuts down) loses what it had not finished: a claim
/// it held frees when its lease ends. A store outage longer than the lease lets the lease run
/// out in the store, and a retry from another process may then claim the key and run the work
/// again: make the lease longer than the store outages you want to ride out, plus a third of the
/// lease (docs/never-twice.md).
///
/// ```
/// use idem::{Idempotency, Key, MemoryStore, Error};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let key = Key::derive("charge", "customer-7", "order-1001")?;
/// let first = engine.call(key).run(async { Ok::<_, Error>(4200u64) }).await?;
/// let again = engine.call(key).run(async { Ok::<_, Error>(9999u64) }).await?;
/// assert!(!first.is_replayed());
/// assert!(again.is_replayed());
/// assert_eq!(again.into_inner(), 4200); // the second body never ran
/// # Ok(()) }
/// ```
pub struct Idempotency<C = JsonCodec> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for Idempotency<C> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
        }
    }
}

impl<C> fmt::Debug for Idempotency<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("policy", &self.inner.core.policy)
            .finish_non_exhaustive()
    }
}

struct Inner<C> {
    shared: Arc<Shared>,
    core: Core<C>,
    /// Completed records kept in this process, if the replay cache is on.
    cache: Option<Cache>,
}

/// What every call of one engine shares, and the tasks it leaves behind (releases, background
/// completions) need: not generic over the codec.
struct Shared {
    store: Arc<dyn Store>,
    /// Calls waiting on a key held by another call ([`OnLocked::Wait`]).
    waiters: Waiters,
    /// Keys whose claim this process is releasing right now.
    releases: Releases,
    /// Keys whose result this process is still storing in the background, with the result.
    completions: Completions,
    /// How long recent work took: the basis of `retry_after`.
    typical: Typical,
    /// The policy's [`key_retention`](Policy::key_retention): every completion's tombstone.
    key_retention: Duration,
}

impl Shared {
    fn new(store: Arc<dyn Store>, key_retention: Duration) -> Arc<Shared> {
        Arc::new(Shared {
            store,
            waiters: Waiters::default(),
            releases: Releases::default(),
            completions: Completions::default(),
            typical: Typical::default(),
            key_retention,
        })
    }
}

impl Idempotency<JsonCodec> {
    /// An engine over `store` with the default [`Policy`] and JSON codec.
    ///
    /// A store that answers without waiting ([`Store::immediate`], as a [`MemoryStore`](crate::MemoryStore) does) is
    /// called directly: its claims and completions are plain function calls, with no future
    /// boxed to be finished after a caller that goes away (a fresh call allocates only the
    /// encoded result and the store's copy of it).
    ///
    /// ```
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "order-1")?;
    /// assert!(!engine.call(key).run(async { Ok::<_, Error>(1) }).await?.is_replayed());
    /// # Ok(()) }
    /// ```
    pub fn new(store: impl Store) -> Idempotency<JsonCodec> {
        Idempotency::from_parts(Arc::new(store), Core::new(JsonCodec))
    }

    /// An engine over a shared store.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::{Idempotency, MemoryStore, Store};
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let engine = Idempotency::from_arc(store.clone());
    /// # let _ = engine;
    /// ```
    pub fn from_arc(store: Arc<dyn Store>) -> Idempotency<JsonCodec> {
        Idempotency::from_parts(store, Core::new(JsonCodec))
    }

    /// A [`EngineBuilder`] to set the policy or codec.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Idempotency, MemoryStore};
    /// let engine = Idempotency::builder(MemoryStore::new()).lease(Duration::from_secs(10)).build()?;
    /// # let _ = engine; Ok::<(), idem::Error>(())
    /// ```
    pub fn builder(store: impl Store) -> EngineBuilder {
        EngineBuilder::with(Arc::new(store) as Arc<dyn Store>, JsonCodec)
    }
}

impl Idempotency<JsonCodec> {
    /// A [`EngineBuilder`] over a shared store (one opened from a URL by
    /// `idem::store::url`, say).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::{Idempotency, MemoryStore, Store};
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let engine = Idempotency::builder_from_arc(store).max_response_bytes(16 << 20).build()?;
    /// # let _ = engine; Ok::<(), idem::Error>(())
    /// ```
    pub fn builder_from_arc(store: Arc<dyn Store>) -> EngineBuilder {
        EngineBuilder::with(store, JsonCodec)
    }
}

impl<S: EngineStore<C>, C: Codec> EngineBuilder<S, C> {
    /// Checks the policy and builds the engine: an [`Idempotency`] (from
    /// [`Idempotency::builder`]), or a `Transactional` (from its
    /// `builder`).
    pub fn build(self) -> Result<S::Engine, Error> {
        let (store, core) = self.parts()?;
        Ok(S::engine(store, core))
    }
}

/// What an [`EngineBuilder`] over a store of this type builds from the store and its checked
/// policy and codec: an [`Idempotency`] over the shared store, or a transactional engine over a
/// SQL store. For the engines' crates; see [`adapter`](crate::adapter).
pub trait EngineStore<C>: Sized {
    /// The engine built.
    type Engine;

    /// The engine of `store` and `core`.
    fn engine(store: Self, core: Core<C>) -> Self::Engine;
}

impl<C: Codec> EngineStore<C> for Arc<dyn Store> {
    type Engine = Idempotency<C>;

    fn engine(store: Arc<dyn Store>, core: Core<C>) -> Idempotency<C> {
        Idempotency::from_parts(store, core)
    }
}

impl<C: Codec> Idempotency<C> {
    fn from_parts(store: Arc<dyn Store>, core: Core<C>) -> Idempotency<C> {
        let core = core.fit(&*store);
        Idempotency {
            inner: Arc::new(Inner {
                shared: Shared::new(store, core.policy.key_retention),
                cache: core.replay_cache.clone().map(Cache::new),
                core,
            }),
        }
    }

    /// The store behind this engine.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.shared.store
    }

    /// The engine's policy.
    pub fn policy(&self) -> &Policy {
        &self.inner.core.policy
    }

    /// The engine's codec.
    pub fn codec(&self) -> &C {
        &self.inner.core.codec
    }

    /// Deletes the record of `key` (whatever its state) from the store and from this engine's
    /// replay cache, so the next call runs the work again; returns whether the store held one.
    /// A running claim on the key gets [`Error::LeaseLost`] when it completes.
    ///
    /// ```
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "order-1")?;
    /// engine.call(key).run(async { Ok::<_, Error>(1) }).await?;
    /// assert!(engine.evict(&key).await?);
    /// assert!(!engine.call(key).run(async { Ok::<_, Error>(2) }).await?.is_replayed());
    /// # Ok(()) }
    /// ```
    pub async fn evict(&self, key: &Key) -> Result<bool, Error> {
        if let Some(cache) = &self.inner.cache {
            cache.remove(key);
        }
        let evicted = (*self.inner.shared.store).evict(key).await;
        // A replay read from the store in the meantime may have been cached again.
        if let Some(cache) = &self.inner.cache {
            cache.remove(key);
        }
        evicted
    }

    /// Starts a call guarded by `key`; set what differs from the policy on the returned
    /// [`Call`], then [`run`](Call::run) it. `None` runs the work every time, without
    /// deduplication (for requests that came without a key).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("report", "", "2026-11")?;
    /// let out = engine.call(key).lease(Duration::from_secs(300)).run(async { Ok::<_, Error>(1) }).await?;
    /// assert_eq!(out.into_inner(), 1);
    /// let unguarded = engine.call(None).run(async { Ok::<_, Error>(2) }).await?;
    /// assert!(!unguarded.is_replayed());
    /// # Ok(()) }
    /// ```
    pub fn call(&self, key: impl Into<Option<Key>>) -> Call<'_, Self> {
        Call::new(self, key.into())
    }

    /// Claims the call's key, runs `work` with its lease renewed, and stores its result; or
    /// replays the stored one, reporting to `probe`. `format` encodes and decodes the `Ok`
    /// value, `errors` says whether an `Err` is stored too.
    async fn guarded<T, E, F>(
        &self,
        probe: &mut Probe<'_>,
        call: Guarded<'_, impl Format<T>, impl Errors<E>>,
        work: F,
    ) -> Result<Outcome<T>, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        // Borrowed, not taken apart: every value moved into a local is one more copy in this
        // future's state, which is moved whole by every layer that wraps it.
        let holding = match self
            .claim_half(
                probe,
                call.key,
                call.fingerprint,
                call.overrides,
                Plain,
                &call.format,
                &call.errors,
            )
            .await
        {
            Claimed::Ended(out) => return out,
            Claimed::Holding(holding, _) => holding,
        };
        self.work_half(probe, &holding, work, &call.format, &call.errors)
            .await
    }

    /// The first half of a guarded call: claims the key, or ends the call with the stored
    /// result (or a refusal, or an error).
    // Eight: the call's parts as its four callers hold them apart (a struct of them would be
    // built and taken apart at once, in the future of every call).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim_half<T, E: From<Error>, M: ClaimMode>(
        &self,
        probe: &mut Probe<'_>,
        key: Key,
        fingerprint: Option<Fingerprint>,
        overrides: &Overrides,
        mode: M,
        format: &impl Format<T>,
        errors: &impl Errors<E>,
    ) -> Claimed<T, E, M::Log> {
        let core = &self.inner.core;
        let resolved = match core.resolve(overrides) {
            Ok(resolved) => resolved,
            Err(e) => {
                probe.end(Stage::Failed);
                return Claimed::Ended(Err(e.into()));
            }
        };

        let asked = probe.timed().then(Instant::now);
        let acquired = self
            .acquire(
                &key,
                fingerprint.as_ref(),
                resolved.lease,
                resolved.on_locked,
                resolved.on_lapse,
                mode.retained(resolved.retention),
            )
            .await;
        // The clock is read when something uses it: the claim's time (a timed call), or the
        // work's (a claim whose work is timed, or one sampled for the `retry_after` estimate); a
        // replay or a claim that is neither does not read it. Reading a clock is a system call on
        // some virtual machines, the costliest step of a call on the memory store there.
        let began = match (&acquired, asked) {
            (_, Some(_)) => Some(Instant::now()),
            (Ok(Acquired::Claim(..)), None) if self.inner.shared.typical.wants_sample() => {
                Some(Instant::now())
            }
            _ => None,
        };
        if let (Some(asked), Some(began)) = (asked, began) {
            probe.claim_took(began - asked);
        }
        let cached = match acquired {
            Ok(Acquired::Claim(claim, log)) => {
                probe.claimed();
                let holding = Holding {
                    claim,
                    fingerprint,
                    lease: resolved.lease,
                    retention: resolved.retention,
                    on_lapse: resolved.on_lapse,
                    began,
                };
                return Claimed::Holding(holding, log);
            }
            Ok(Acquired::Replay(cached)) => {
                if let Some(cache) = &self.inner.cache {
                    let known = Known::from_replay(fingerprint);
                    cache.put(key, known, &cached, cached.expires_at);
                }
                cached
            }
            Ok(Acquired::FromCache(cached) | Acquired::Pending(cached)) => cached,
            Err(e) => {
                probe.end(Stage::of_error(&e));
                return Claimed::Ended(Err(e.into()));
            }
        };
        let (stage, replayed) = replay(cached, |b| format.decode(b), |b| errors.replay(b));
        probe.end(stage);
        Claimed::Ended(replayed)
    }

    /// The second half of a guarded call, once it holds its key: runs `work` with the lease
    /// renewed, and stores its result (or releases the key for an error that is not stored).
    pub(crate) async fn work_half<T, E, F>(
        &self,
        probe: &mut Probe<'_>,
        holding: &Holding,
        work: F,
        format: &impl Format<T>,
        errors: &impl Errors<E>,
    ) -> Result<Outcome<T>, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let Holding {
            claim,
            fingerprint,
            lease,
            retention,
            began,
            ..
        } = holding;
        let (lease, retention, began) = (*lease, *retention, *began);
        let core = &self.inner.core;
        let shared = &self.inner.shared;
        let guard = ClaimGuard::new(shared.clone(), claim.clone(), holding.on_lapse);
        // The work, raising the in-flight gauge when it first awaits ([`Probe::working`]).
        let result = {
            let mut work = std::pin::pin!(work);
            let working = &mut *probe;
            let work = std::future::poll_fn(move |cx| {
                let polled = work.as_mut().poll(cx);
                if polled.is_pending() {
                    working.working();
                }
                polled
            });
            renewing(&*shared.store, claim, lease, work).await
        };
        let ended = began.map(|began| {
            let ended = Instant::now();
            shared.typical.observe(ended - began);
            probe.work_took(ended - began);
            ended
        });

        let (encoded, is_error) = match &result {
            Ok(value) => (format.encode(value), false),
            Err(e) => match errors.encode(e) {
                Some(encoded) => (encoded, true),
                // An error that is not stored: free the key so a retry runs again.
                None => {
                    guard.release().await;
                    probe.end(Stage::Released);
                    return result.map(Outcome::Fresh);
                }
            },
        };
        let sealed = core.seal_encoded(encoded, claim.key());
        let kept = if sealed.retained {
            Stage::Completed
        } else {
            Stage::NotRetained
        };
        let kept_here = self.inner.cache.as_ref().map(|cache| {
            let until = cache.now() + retention;
            let record = StoredResult {
                response: Some(sealed.bytes.clone()),
                is_error,
                expires_at: until,
                not_retained: None,
            };
            (cache, record, until)
        });
        let completed = guard
            .complete(
                sealed.bytes,
                is_error,
                *fingerprint,
                retention,
                Tombstone::of(shared.key_retention),
                lease,
            )
            .await;
        // StoredResult only once it is in the store: until then, calls here meet the pending result,
        // which the store may yet refuse (the key taken over after a long outage).
        if let (Ok(Stored::Landed), Some((cache, record, until))) = (&completed, kept_here) {
            cache.put(*claim.key(), Known::Exactly(*fingerprint), &record, until);
        }
        if let (true, Some(ended)) = (probe.timed(), ended) {
            probe.complete_took(ended.elapsed());
        }
        probe.end_with(&completed, kept);
        completed?;
        result.map(Outcome::Fresh)
    }

    /// Claims the key, or returns the stored result, waiting on a live claim if the policy says so.
    async fn acquire<M: ClaimMode>(
        &self,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        lease: Duration,
        on_locked: OnLocked,
        on_lapse: OnLapse,
        mode: M,
    ) -> Result<Acquired<M::Log>, Error> {
        let shared = &self.inner.shared;
        if let Some(cache) = &self.inner.cache {
            match cache.get(key, fingerprint) {
                Some(Hit::Replay(cached)) => return Ok(Acquired::FromCache(cached)),
                Some(Hit::Reused) => return Err(Error::KeyReused),
                None => {}
            }
        }
        // A claim this process is releasing is not another caller's: wait the one statement
        // it takes (bounded by the lease, after which the claim would be free anyway). Boxed,
        // as the waiting below: kept out of every call's future, which is moved whole each time
        // it is wrapped, for the calls that wait.
        if shared.releases.under_way() {
            Box::pin(shared.releases.settled(key, lease)).await;
        }
        if let Some(pending) = shared.completions.get(key) {
            let wait = match on_locked {
                OnLocked::FailFast => Duration::ZERO,
                OnLocked::Wait { timeout } => timeout,
            };
            return Box::pin(self.pending(key, fingerprint, lease, wait, pending)).await;
        }
        let claim = ClaimRequest::new(key, lease)
            .fingerprint(fingerprint)
            .on_lapse(on_lapse);
        match on_locked {
            OnLocked::FailFast => match acquired(attempt(shared, claim, mode).await?, key)? {
                Ok(acquired) => Ok(acquired),
                Err(retry_after) => Err(Error::Locked {
                    retry_after: shared.typical.retry_after(retry_after),
                }),
            },
            OnLocked::Wait { timeout } => Box::pin(self.wait_for(claim, timeout, mode)).await,
        }
    }

    /// [`acquire`](Self::acquire) under [`OnLocked::Wait`]: claims the key or returns the
    /// stored result, waiting up to `timeout` for a live claim on it to end.
    async fn wait_for<M: ClaimMode>(
        &self,
        claim: ClaimRequest<'_>,
        timeout: Duration,
        mode: M,
    ) -> Result<Acquired<M::Log>, Error> {
        let (key, fingerprint, lease) = (claim.key, claim.fingerprint, claim.lease);
        let shared = &self.inner.shared;
        let deadline = Instant::now() + timeout;
        let slot = shared.waiters.join(*key);
        let mut poller: Option<PollerRole<'_>> = None;
        let mut backoff = Duration::from_millis(5);
        // Bounded: every pass either returns or sleeps until a wake-up or the deadline.
        loop {
            let mut woken = pin!(slot.notify.notified());
            woken.as_mut().enable();
            if let Some(pending) = shared.completions.get(key) {
                let left = deadline.saturating_duration_since(Instant::now());
                return self.pending(key, fingerprint, lease, left, pending).await;
            }
            let retry_after = match acquired(attempt(shared, claim, mode).await?, key)? {
                Ok(acquired) => return Ok(acquired),
                Err(retry_after) => retry_after,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Locked {
                    retry_after: shared.typical.retry_after(retry_after),
                });
            }
            if poller.is_none() {
                poller = PollerRole::take(&slot);
            }
            // One waiter per key polls the store (for owners in other processes); the others
            // sleep until it, or a local owner finishing, wakes them.
            let wake_at = if poller.is_some() {
                let jitter = backoff.mul_f64(fastrand::f64() * 0.5);
                (now + (backoff + jitter).min(retry_after.max(Duration::from_millis(1))))
                    .min(deadline)
            } else {
                deadline
            };
            backoff = (backoff * 2).min(Duration::from_millis(500));
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }
}

/// What a claim's outcome gives a call: the claim or a result to replay, or (`Err` inside) how
/// long the live claim that holds the key may last; an uncertain key or a tombstone is the
/// call's error, never waited on (neither ends by itself).
// Inlined: generic over the claim's mode, it was otherwise kept as a call of its own on every
// claim (about 60 instructions more a call, by callgrind).
#[inline(always)]
fn acquired<L>(
    (outcome, log): (ClaimOutcome, L),
    key: &Key,
) -> Result<Result<Acquired<L>, Duration>, Error> {
    Ok(match outcome {
        ClaimOutcome::Claimed(c) => Ok(Acquired::Claim(c, log)),
        ClaimOutcome::Completed(c) => Ok(Acquired::Replay(c)),
        ClaimOutcome::Locked { retry_after } => Err(retry_after),
        ClaimOutcome::Uncertain { since } => {
            return Err(Error::Uncertain {
                operation: *key,
                since,
            })
        }
        ClaimOutcome::Expired { since } => return Err(Error::ResultExpired { since }),
    })
}

impl<C: Codec> Idempotency<C> {
    /// A call that meets a result this process is still storing in the background: it waits
    /// up to `wait` (the call's [`OnLocked`] policy: none when failing fast, at most its
    /// timeout when waiting) for that completion to end, then replays the result, whether or not
    /// it landed. If the completion is still retrying when `wait` runs out, the call is
    /// [`Error::Locked`], with a `retry_after` of the completion's next try. Either way it never
    /// claims the key, so the work that produced the result does not run again here.
    async fn pending<L>(
        &self,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        lease: Duration,
        wait: Duration,
        pending: Arc<PendingResult>,
    ) -> Result<Acquired<L>, Error> {
        crate::store::check_fingerprint(pending.fingerprint.as_ref(), fingerprint)?;
        // With no time to wait, `settled` still looks once: a completion that just ended replays.
        if self.inner.shared.completions.settled(key, wait).await {
            return Ok(Acquired::Pending(pending.record.clone()));
        }
        Err(Error::Locked {
            retry_after: pending_retry_after(lease),
        })
    }
}

/// What a guarded call is asked to do, besides its work.
pub(crate) struct Guarded<'o, Fm, Er> {
    pub(crate) key: Key,
    pub(crate) fingerprint: Option<Fingerprint>,
    pub(crate) overrides: &'o Overrides,
    pub(crate) format: Fm,
    pub(crate) errors: Er,
}

/// How a call's `Ok` value is stored and replayed.
pub trait Format<T> {
    /// The value as it is to be stored.
    fn encode(&self, value: &T) -> Encoded;
    /// A stored value.
    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// Whether a call's `Err` is stored, and how a stored one replays.
pub(crate) trait Errors<E> {
    /// The error as it is to be stored, or `None` to release the claim instead.
    fn encode(&self, error: &E) -> Option<Encoded>;
    /// A stored error.
    fn replay(&self, bytes: Vec<u8>) -> E;
}

/// What the first half of a guarded call came to.
pub(crate) enum Claimed<T, E, L = ()> {
    /// The call ended there: replayed, refused, or failed.
    Ended(Result<Outcome<T>, E>),
    /// It holds its key; the work comes next. Beside it, what its [`ClaimMode`] returns with a
    /// claim: nothing, or the operation's step log when the claim began its steps too
    /// ([`Store::claim_steps`](crate::Store::claim_steps)).
    Holding(Holding, L),
}

/// A call that holds its key, between its two halves.
pub(crate) struct Holding {
    claim: Claim,
    fingerprint: Option<Fingerprint>,
    /// What the call's work needs of its options ([`Resolved`] less `on_locked`, which is
    /// spent once the key is claimed: 16 bytes of every call's future).
    lease: Duration,
    retention: Duration,
    on_lapse: OnLapse,
    /// When the claim came back, if the work is timed: its time runs from here.
    began: Option<Instant>,
}

impl Holding {
    /// The claim and the retention a call's steps are stored with.
    fn steps_of(&self) -> (Claim, Duration, OnLapse) {
        (self.claim.clone(), self.retention, self.on_lapse)
    }
}

enum Acquired<L> {
    /// A claim, with what its [`ClaimMode`] returns beside it.
    Claim(Claim, L),
    /// The record, from the store.
    Replay(StoredResult),
    /// The record, from the replay cache.
    FromCache(StoredResult),
    /// The result this process is still storing in the background.
    Pending(StoredResult),
}

#[cfg(test)]
mod tests {
    use super::waiters::{FIRST_GUESS, MIN_RETRY_AFTER};
    use super::*;
    use crate::store::memory::MemoryStore;

    fn key(i: u32) -> Key {
        let mut bytes = [0; 32];
        bytes[..4].copy_from_slice(&i.to_be_bytes());
        Key::from_bytes(bytes)
    }

    /// A million contended joins: threads share keys, join, wake and leave in every order. The
    /// last one out of a slot must remove it, whatever references a wake holds at that moment.
    #[test]
    fn waiter_slots_are_all_released_after_a_million_contended_keys() {
        let waiters = Arc::new(Waiters::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let waiters = waiters.clone();
                std::thread::spawn(move || {
                    for i in 0..250_000u32 {
                        // Neighbouring threads share each key.
                        let k = key((i + t * 7) % 1_000);
                        let first = waiters.join(k);
                        waiters.wake(&k);
                        let second = waiters.join(k);
                        drop(first);
                        waiters.wake(&k);
                        drop(second);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(waiters.len(), 0);
    }

    /// Contended keys through the engine: two callers per key, the second waiting on the first.
    /// Afterwards no waiter slot and no release is left behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_slot_outlives_its_waiters() {
        let engine = Idempotency::new(MemoryStore::new());
        let wait = OnLocked::Wait {
            timeout: Duration::from_secs(30),
        };
        let mut tasks = tokio::task::JoinSet::new();
        for batch in 0..4u32 {
            let engine = engine.clone();
            tasks.spawn(async move {
                for i in 0..25_000u32 {
                    let k = key(batch * 25_000 + i);
                    let (a, b) = tokio::join!(
                        engine.call(k).on_locked(wait).run(async {
                            tokio::task::yield_now().await;
                            Ok::<_, Error>(i)
                        }),
                        engine
                            .call(k)
                            .on_locked(wait)
                            .run(async { Ok::<_, Error>(i) }),
                    );
                    assert_eq!(a.unwrap().into_inner(), i);
                    assert_eq!(b.unwrap().into_inner(), i);
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        assert_eq!(engine.inner.shared.waiters.len(), 0);
        assert_eq!(engine.inner.shared.releases.len(), 0);
    }

    /// The work is timed on every claim until the estimate has a sample, then on one in
    /// `SAMPLE_ONE_IN`: the other claims read no clock for it.
    #[test]
    fn work_is_timed_on_a_sample_of_claims() {
        let typical = Typical::default();
        assert!((0..100).all(|_| typical.wants_sample()), "no estimate yet");
        typical.observe(Duration::from_millis(5));
        fastrand::seed(7);
        let sampled = (0..80_000).filter(|_| typical.wants_sample()).count();
        assert!(
            (9_000..11_000).contains(&sampled),
            "{sampled} of 80,000 claims timed, about 10,000 expected"
        );
    }

    #[test]
    fn retry_after_is_the_typical_duration_within_the_lease() {
        let typical = Typical::default();
        let lease_left = Duration::from_secs(25);
        assert_eq!(typical.retry_after(lease_left), FIRST_GUESS);
        assert_eq!(
            typical.retry_after(Duration::from_millis(300)),
            Duration::from_millis(300)
        );
        typical.observe(Duration::from_millis(200));
        assert_eq!(typical.retry_after(lease_left), Duration::from_millis(200));
        typical.observe(Duration::from_micros(10));
        assert!(typical.retry_after(lease_left) < Duration::from_millis(200));
        for _ in 0..100 {
            typical.observe(Duration::from_micros(10));
        }
        assert_eq!(typical.retry_after(lease_left), MIN_RETRY_AFTER);
    }

    /// A call's future is moved whole by every layer that wraps it (the attribute, a tower
    /// service, `tokio::spawn`), so its size is a cost of every call: 1,584 bytes with rustc
    /// 1.95 since the lease's heartbeat is made only once the work awaits (48 bytes more: the
    /// `Option` it is made into and what makes it; it saves `tokio::select!` and the heartbeat's
    /// construction, about 110 instructions a call, where 48 bytes more to move are a few);
    /// 1,536 before, 1,520 before `StoredResult::not_retained`, which is boxed to cost 16 bytes,
    /// not 24, after 1,792 when `drive` was an `async fn` and `work_half` took its claim by value
    /// (docs/performance.md, "The memory store called directly"). The bound is reached: a field
    /// more in what a call holds across an await must pay for itself elsewhere.
    #[test]
    fn a_call_future_keeps_one_copy_of_its_arguments() {
        let engine = Idempotency::new(MemoryStore::new());
        let call = engine.call(key(1)).run(async { Ok::<_, Error>(1u64) });
        let size = std::mem::size_of_val(&call);
        eprintln!("a call's future: {size} bytes");
        assert!(
            size <= 1_584,
            "the engine's future for a call is {size} bytes"
        );
    }

    /// The same for a detached call (`run_detached`, the HTTP layer's, every transport's),
    /// which every request's future holds: with work whose future holds 512 bytes, 1,576 bytes
    /// with rustc 1.95 for the HTTP layer's, after 2,112 when it was an `async fn` (which kept
    /// the work twice).
    #[test]
    fn a_detached_call_future_keeps_one_copy_of_its_arguments() {
        let engine = Idempotency::new(MemoryStore::new());
        // Work whose future is over 512 bytes, as a tower service's is: a second copy of it would
        // show.
        let work = async {
            let held = std::hint::black_box([1u8; 512]);
            tokio::task::yield_now().await;
            Ok::<_, Error>(u64::from(held[0]))
        };
        let call = engine.call(key(1)).run_detached(work);
        let size = std::mem::size_of_val(&call);
        eprintln!("a detached call's future: {size} bytes");
        assert!(
            size <= 1_664,
            "the engine's future for a detached call is {size} bytes"
        );
    }
}
