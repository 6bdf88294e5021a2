//! The engine: drives claim → run → complete (or abort) over a [`Store`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::codec::{Codec, JsonCodec};
use crate::error::{Error, StoreErrorKind};
use crate::key::{Fingerprint, Key};
use crate::record::{Cached, Claim, Completion, Start};
use crate::store::{check_duration, Store};

/// What a call does when another call holds a live claim on its key.
///
/// ```
/// use std::time::Duration;
/// use idem_core::OnLocked;
/// let wait = OnLocked::Wait { timeout: Duration::from_secs(5) };
/// assert_ne!(wait, OnLocked::FailFast);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLocked {
    /// Return [`Error::Locked`] at once with the time left on the other lease (the default).
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

/// How the engine treats every call, unless a call overrides it with [`CallOptions`].
///
/// ```
/// use std::time::Duration;
/// use idem_core::Policy;
/// let policy = Policy { retention: Duration::from_secs(3600), ..Policy::default() };
/// assert_eq!(policy.lease, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How long a claim blocks its key without a heartbeat. The engine renews it every third of
    /// the lease while the work runs, so a crashed worker blocks its key for at most one lease.
    /// Default 30 s.
    pub lease: Duration,
    /// How long a completed result is replayed. Default 24 h.
    pub retention: Duration,
    /// What to do when the key is locked by another call. Default [`OnLocked::FailFast`].
    pub on_locked: OnLocked,
    /// The largest encoded response stored, in bytes. Default 1 MiB.
    pub max_response_bytes: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            on_locked: OnLocked::FailFast,
            max_response_bytes: 1 << 20,
        }
    }
}

impl Policy {
    pub(crate) fn validate(&self) -> Result<(), Error> {
        check_duration("lease", self.lease)?;
        check_duration("retention", self.retention)?;
        if self.max_response_bytes == 0 {
            return Err(Error::InvalidConfig(
                "max_response_bytes must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Per-call overrides of the [`Policy`]; `None` keeps the policy's value.
///
/// ```
/// use std::time::Duration;
/// use idem_core::CallOptions;
/// let opts = CallOptions { lease: Some(Duration::from_secs(120)), ..CallOptions::default() };
/// assert!(opts.retention.is_none());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// Overrides [`Policy::lease`].
    pub lease: Option<Duration>,
    /// Overrides [`Policy::retention`].
    pub retention: Option<Duration>,
    /// Overrides [`Policy::on_locked`].
    pub on_locked: Option<OnLocked>,
}

/// A result and whether it was computed now or replayed from the store.
///
/// ```
/// use idem_core::Outcome;
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

/// Builds an [`Idempotency`] engine with a non-default policy or codec.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Idempotency, MemoryStore, OnLocked};
/// let engine = Idempotency::builder(MemoryStore::new())
///     .lease(Duration::from_secs(10))
///     .retention(Duration::from_secs(3600))
///     .on_locked(OnLocked::Wait { timeout: Duration::from_secs(5) })
///     .build()?;
/// assert_eq!(engine.policy().lease, Duration::from_secs(10));
/// # Ok::<(), idem_core::Error>(())
/// ```
pub struct Builder<C = JsonCodec> {
    store: Arc<dyn Store>,
    policy: Policy,
    codec: C,
}

impl<C: Codec> Builder<C> {
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

    /// Sets [`Policy::on_locked`].
    pub fn on_locked(mut self, on_locked: OnLocked) -> Self {
        self.policy.on_locked = on_locked;
        self
    }

    /// Sets [`Policy::max_response_bytes`].
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.policy.max_response_bytes = limit;
        self
    }

    /// Replaces the whole policy.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Uses another codec for stored results.
    pub fn codec<C2: Codec>(self, codec: C2) -> Builder<C2> {
        Builder {
            store: self.store,
            policy: self.policy,
            codec,
        }
    }

    /// Checks the policy and builds the engine.
    pub fn build(self) -> Result<Idempotency<C>, Error> {
        self.policy.validate()?;
        Ok(Idempotency {
            inner: Arc::new(Inner {
                store: self.store,
                policy: self.policy,
                codec: self.codec,
                waiters: Waiters::default(),
            }),
        })
    }
}

/// The engine: wraps work in claim → run → complete, so a duplicate call replays the stored
/// result instead of running again. Cheap to clone (one `Arc`).
///
/// Round trips per call (on top of the work itself):
///
/// | path | statements |
/// |---|---|
/// | new key | 1 claim + 1 complete (+ 1 renew per third of the lease the work runs) |
/// | replay | 1 (the claim attempt returns the stored record) |
/// | work fails | 1 claim + 1 abort |
/// | locked, fail fast | 1 |
///
/// ```
/// use idem_core::{Idempotency, Key, MemoryStore, Error};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let key = Key::derive("charge", "customer-7", "order-1001")?;
/// let first = engine.run(Some(key), None, async { Ok::<_, Error>(4200u64) }).await?;
/// let again = engine.run(Some(key), None, async { Ok::<_, Error>(9999u64) }).await?;
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
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

struct Inner<C> {
    store: Arc<dyn Store>,
    policy: Policy,
    codec: C,
    waiters: Waiters,
}

impl Idempotency<JsonCodec> {
    /// An engine over `store` with the default [`Policy`] and JSON codec.
    pub fn new(store: impl Store) -> Idempotency<JsonCodec> {
        Idempotency::from_arc(Arc::new(store))
    }

    /// An engine over a shared store.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem_core::{Idempotency, MemoryStore, Store};
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let engine = Idempotency::from_arc(store.clone());
    /// # let _ = engine;
    /// ```
    pub fn from_arc(store: Arc<dyn Store>) -> Idempotency<JsonCodec> {
        Idempotency {
            inner: Arc::new(Inner {
                store,
                policy: Policy::default(),
                codec: JsonCodec,
                waiters: Waiters::default(),
            }),
        }
    }

    /// A [`Builder`] to set the policy or codec.
    pub fn builder(store: impl Store) -> Builder<JsonCodec> {
        Builder {
            store: Arc::new(store),
            policy: Policy::default(),
            codec: JsonCodec,
        }
    }
}

impl<C: Codec> Idempotency<C> {
    /// The store behind this engine.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The engine's policy.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The engine's codec.
    pub fn codec(&self) -> &C {
        &self.inner.codec
    }

    /// Runs `work` once per key: the first call runs it and stores its `Ok` value; later calls
    /// with the same key replay that value until the retention ends.
    ///
    /// - `key: None` runs the work every time, without deduplication (optional idempotency).
    /// - `fingerprint`: when given, a later call whose fingerprint differs gets
    ///   [`Error::KeyReused`] instead of the replay.
    /// - An `Err` from the work is not stored: the claim is aborted so a retry runs again.
    ///   (To store errors too, use [`run_storing_errors`](Self::run_storing_errors).)
    /// - Dropping the returned future (cancellation) or a panic in the work releases the claim
    ///   at once (a task is spawned on the current tokio runtime); without a runtime the claim
    ///   frees when its lease ends.
    /// - The lease is renewed in the background of this call every third of the lease.
    /// - [`Error::LeaseLost`] at completion means the key was taken over while the work ran: the
    ///   work may have run twice.
    ///
    /// ```
    /// use idem_core::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let out = engine.run(None, None, async { Ok::<_, Error>("no key, no dedup".to_string()) }).await?;
    /// assert!(!out.is_replayed());
    /// # Ok(()) }
    /// ```
    pub async fn run<T, E, F>(
        &self,
        key: Option<Key>,
        fingerprint: Option<Fingerprint>,
        work: F,
    ) -> Result<Outcome<T>, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        self.run_with(&CallOptions::default(), key, fingerprint, work)
            .await
    }

    /// [`run`](Self::run) with per-call overrides of the policy.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::{CallOptions, Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let opts = CallOptions { lease: Some(Duration::from_secs(300)), ..Default::default() };
    /// let key = Key::derive("report", "", "2026-11")?;
    /// let out = engine.run_with(&opts, Some(key), None, async { Ok::<_, Error>(1) }).await?;
    /// assert_eq!(out.into_inner(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn run_with<T, E, F>(
        &self,
        opts: &CallOptions,
        key: Option<Key>,
        fingerprint: Option<Fingerprint>,
        work: F,
    ) -> Result<Outcome<T>, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        let codec = &self.inner.codec;
        self.drive(
            opts,
            key,
            fingerprint,
            work,
            |value: &T| codec.encode(value),
            |bytes: &[u8]| codec.decode(bytes),
            |_| None,
            |bytes| Error::StoredError(bytes).into(),
        )
        .await
    }

    /// [`run_with`](Self::run_with) for a value with its own byte format: it is stored with
    /// `encode` and replayed with `decode` instead of the engine's codec. The HTTP layer stores
    /// responses this way, so a body is kept as its exact bytes. An `Err` from the work is not
    /// stored; the encoded value must fit [`Policy::max_response_bytes`].
    ///
    /// ```
    /// use idem_core::{BoxError, CallOptions, Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("upload", "", "u-1")?;
    /// let encode = |v: &Vec<u8>| Ok::<_, BoxError>(v.clone());
    /// let decode = |b: &[u8]| Ok::<_, BoxError>(b.to_vec());
    /// let opts = CallOptions::default();
    /// engine.run_encoded(&opts, Some(key), None, async { Ok::<_, Error>(vec![0xff, 0]) }, encode, decode).await?;
    /// let again = engine.run_encoded(&opts, Some(key), None, async { Ok::<_, Error>(vec![]) }, encode, decode).await?;
    /// assert!(again.is_replayed());
    /// assert_eq!(again.into_inner(), [0xff, 0]); // stored as raw bytes, not JSON
    /// # Ok(()) }
    /// ```
    pub async fn run_encoded<T, E, F>(
        &self,
        opts: &CallOptions,
        key: Option<Key>,
        fingerprint: Option<Fingerprint>,
        work: F,
        encode: impl FnOnce(&T) -> Result<Vec<u8>, crate::BoxError>,
        decode: impl FnOnce(&[u8]) -> Result<T, crate::BoxError>,
    ) -> Result<Outcome<T>, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        self.drive(
            opts,
            key,
            fingerprint,
            work,
            encode,
            decode,
            |_| None,
            |bytes| Error::StoredError(bytes).into(),
        )
        .await
    }

    /// Like [`run`](Self::run), but an `Err` from the work is stored and replayed too (for
    /// errors that are final answers, such as "card declined"). The error type must serialize.
    ///
    /// ```
    /// use idem_core::{Error, Idempotency, Key, MemoryStore};
    /// #[derive(Debug, serde::Serialize, serde::Deserialize)]
    /// enum PayError { Declined, Idem(String) }
    /// impl From<Error> for PayError { fn from(e: Error) -> Self { PayError::Idem(e.to_string()) } }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("pay", "", "p-1")?;
    /// let first = engine.run_storing_errors(Some(key), None, async { Err::<u32, _>(PayError::Declined) }).await;
    /// let again = engine.run_storing_errors(Some(key), None, async { Ok::<u32, PayError>(1) }).await;
    /// assert!(matches!(first, Err(PayError::Declined)));
    /// assert!(matches!(again, Err(PayError::Declined))); // replayed, the body did not run
    /// # Ok(()) }
    /// ```
    pub async fn run_storing_errors<T, E, F>(
        &self,
        key: Option<Key>,
        fingerprint: Option<Fingerprint>,
        work: F,
    ) -> Result<Outcome<T>, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned + From<Error>,
    {
        let codec = &self.inner.codec;
        self.drive(
            &CallOptions::default(),
            key,
            fingerprint,
            work,
            |value: &T| codec.encode(value),
            |bytes: &[u8]| codec.decode(bytes),
            |e: &E| Some(codec.encode(e)),
            |bytes| match codec.decode::<E>(&bytes) {
                Ok(e) => e,
                Err(err) => Error::Codec(err).into(),
            },
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn drive<T, E, F>(
        &self,
        opts: &CallOptions,
        key: Option<Key>,
        fingerprint: Option<Fingerprint>,
        work: F,
        encode_ok: impl FnOnce(&T) -> Result<Vec<u8>, crate::BoxError>,
        decode_ok: impl FnOnce(&[u8]) -> Result<T, crate::BoxError>,
        encode_err: impl FnOnce(&E) -> Option<Result<Vec<u8>, crate::BoxError>>,
        replay_err: impl FnOnce(Vec<u8>) -> E,
    ) -> Result<Outcome<T>, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let Some(key) = key else {
            return work.await.map(Outcome::Fresh);
        };
        let policy = &self.inner.policy;
        let lease = opts.lease.unwrap_or(policy.lease);
        let retention = opts.retention.unwrap_or(policy.retention);
        check_duration("lease", lease)?;
        check_duration("retention", retention)?;
        let on_locked = opts.on_locked.unwrap_or(policy.on_locked);

        let claim = match self
            .acquire(&key, fingerprint.as_ref(), lease, on_locked)
            .await?
        {
            Acquired::Claim(claim) => claim,
            Acquired::Replay(cached) => return replay(cached, decode_ok, replay_err),
        };
        let mut guard = ClaimGuard {
            inner: self.inner.clone(),
            claim: Some(claim.clone()),
        };
        let result = renewing(&*self.inner.store, &claim, lease, work).await;

        let (encoded, is_error) = match &result {
            Ok(value) => (Some(encode_ok(value)), false),
            Err(e) => (encode_err(e), true),
        };
        let bytes = match encoded {
            None => {
                guard.abort().await;
                return result.map(Outcome::Fresh);
            }
            Some(Err(e)) => {
                guard.abort().await;
                return Err(Error::Codec(e).into());
            }
            Some(Ok(bytes)) => bytes,
        };
        if bytes.len() > policy.max_response_bytes {
            guard.abort().await;
            if is_error {
                // A failure too large to store is still the caller's answer; a retry runs again.
                return result.map(Outcome::Fresh);
            }
            return Err(Error::ResponseTooLarge {
                size: bytes.len(),
                limit: policy.max_response_bytes,
            }
            .into());
        }
        guard
            .complete(
                &claim,
                Completion {
                    response: Some(&bytes),
                    is_error,
                },
                retention,
            )
            .await?;
        result.map(Outcome::Fresh)
    }

    /// Claims the key, or returns the stored result, waiting on a live claim if the policy says so.
    async fn acquire(
        &self,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        lease: Duration,
        on_locked: OnLocked,
    ) -> Result<Acquired, Error> {
        let store = &*self.inner.store;
        let timeout = match on_locked {
            OnLocked::FailFast => {
                return match store.start(key, fingerprint, lease).await? {
                    Start::Started(c) => Ok(Acquired::Claim(c)),
                    Start::Completed(c) => Ok(Acquired::Replay(c)),
                    Start::Locked { retry_after } => Err(Error::Locked { retry_after }),
                };
            }
            OnLocked::Wait { timeout } => timeout,
        };
        let deadline = Instant::now() + timeout;
        let slot = self.inner.waiters.join(*key);
        let mut poller: Option<PollerRole<'_>> = None;
        let mut backoff = Duration::from_millis(5);
        // Bounded: every pass either returns or sleeps until a wake-up or the deadline.
        loop {
            let mut woken = pin!(slot.notify.notified());
            woken.as_mut().enable();
            let retry_after = match store.start(key, fingerprint, lease).await {
                Ok(Start::Started(c)) => return Ok(Acquired::Claim(c)),
                Ok(Start::Completed(c)) => return Ok(Acquired::Replay(c)),
                Ok(Start::Locked { retry_after }) => retry_after,
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Locked { retry_after });
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

fn replay<T, E: From<Error>>(
    cached: Cached,
    decode_ok: impl FnOnce(&[u8]) -> Result<T, crate::BoxError>,
    replay_err: impl FnOnce(Vec<u8>) -> E,
) -> Result<Outcome<T>, E> {
    let bytes = cached.response.unwrap_or_else(|| b"null".to_vec());
    if cached.is_error {
        return Err(replay_err(bytes));
    }
    match decode_ok(&bytes) {
        Ok(value) => Ok(Outcome::Replayed(value)),
        Err(e) => Err(Error::Codec(e).into()),
    }
}

enum Acquired {
    Claim(Claim),
    Replay(Cached),
}

/// Polls `work` to completion while renewing the claim's lease every third of the lease, in the
/// same task (so cancelling the call stops both).
async fn renewing<F: Future>(
    store: &dyn Store,
    claim: &Claim,
    lease: Duration,
    work: F,
) -> F::Output {
    let period = lease / 3;
    let heartbeat = async {
        let mut next = Instant::now() + period;
        loop {
            tokio::time::sleep_until(next).await;
            next += period;
            match store.renew(claim, lease).await {
                Ok(()) => {}
                Err(Error::LeaseLost) => {
                    tracing::warn!(key = %claim.key(), "lease lost while the work runs; completion will fail");
                    return std::future::pending::<Infallible>().await;
                }
                // A failed heartbeat is retried at the next tick; two more fit in one lease.
                Err(e) => tracing::warn!(key = %claim.key(), error = %e, "lease renewal failed"),
            }
        }
    };
    tokio::select! {
        biased;
        out = work => out,
        never = heartbeat => match never {},
    }
}

/// Owns a claim until it is completed or aborted; dropping it armed (cancellation, panic)
/// releases the claim in a spawned task.
struct ClaimGuard<C: Codec> {
    inner: Arc<Inner<C>>,
    claim: Option<Claim>,
}

impl<C: Codec> ClaimGuard<C> {
    async fn complete(
        &mut self,
        claim: &Claim,
        completion: Completion<'_>,
        retention: Duration,
    ) -> Result<(), Error> {
        let mut attempt = 0;
        let result = loop {
            attempt += 1;
            match self
                .inner
                .store
                .complete(claim, completion, retention)
                .await
            {
                // A completion lost to an unreachable store is retried briefly: the work ran, so
                // giving up leaves the key blocked until its lease ends.
                Err(Error::Store(e)) if e.kind() == StoreErrorKind::Unavailable && attempt < 3 => {
                    tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
                }
                other => break other,
            }
        };
        // Whatever happened, the work ran: never abort this claim (a retry would run it again
        // at once). On failure the key frees when the lease ends.
        if let Some(claim) = self.claim.take() {
            self.inner.waiters.wake(claim.key());
        }
        result
    }

    async fn abort(&mut self) {
        if let Some(claim) = self.claim.take() {
            release(&*self.inner.store, &claim).await;
            self.inner.waiters.wake(claim.key());
        }
    }
}

impl<C: Codec> Drop for ClaimGuard<C> {
    fn drop(&mut self) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %claim.key(), "claim dropped outside a runtime; it frees when its lease ends");
            return;
        };
        let inner = self.inner.clone();
        runtime.spawn(async move {
            release(&*inner.store, &claim).await;
            inner.waiters.wake(claim.key());
        });
    }
}

async fn release(store: &dyn Store, claim: &Claim) {
    match store.abort(claim).await {
        Ok(()) | Err(Error::LeaseLost) => {}
        Err(e) => {
            tracing::warn!(key = %claim.key(), error = %e, "releasing the claim failed; it frees when its lease ends")
        }
    }
}

/// Per-key wake-ups shared by the waiters of one engine.
#[derive(Default)]
struct Waiters {
    slots: Mutex<HashMap<Key, Arc<Slot>>>,
}

#[derive(Default)]
struct Slot {
    notify: Notify,
    polling: AtomicBool,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn join(&self, key: Key) -> SlotRef<'_> {
        let slot = self.lock().entry(key).or_default().clone();
        SlotRef {
            waiters: self,
            key,
            slot,
        }
    }

    fn get(&self, key: &Key) -> Option<Arc<Slot>> {
        self.lock().get(key).cloned()
    }

    fn wake(&self, key: &Key) {
        if let Some(slot) = self.get(key) {
            slot.notify.notify_waiters();
        }
    }
}

/// A waiter's membership in a key's slot; the last one out removes the slot.
struct SlotRef<'a> {
    waiters: &'a Waiters,
    key: Key,
    slot: Arc<Slot>,
}

impl std::ops::Deref for SlotRef<'_> {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        &self.slot
    }
}

impl Drop for SlotRef<'_> {
    fn drop(&mut self) {
        let mut slots = self.waiters.lock();
        // The map's reference and ours: nobody else waits on this key.
        if Arc::strong_count(&self.slot) == 2 {
            slots.remove(&self.key);
        }
    }
}

/// The one waiter per key that polls the store; leaving hands the role on by waking the others.
struct PollerRole<'a>(&'a Slot);

impl<'a> PollerRole<'a> {
    fn take(slot: &'a Slot) -> Option<PollerRole<'a>> {
        slot.polling
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| PollerRole(slot))
    }
}

impl Drop for PollerRole<'_> {
    fn drop(&mut self) {
        self.0.polling.store(false, Ordering::Release);
        self.0.notify.notify_waiters();
    }
}
