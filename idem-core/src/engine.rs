//! The engine: drives claim → run → complete (or abort) over a [`Store`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::codec::{Codec, JsonCodec};
use crate::envelope;
use crate::error::{BoxError, Error, StoreError, StoreErrorKind};
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
    /// The largest encoded result stored, in bytes. Default 1 MiB. A larger result is not kept:
    /// the caller still gets it, and the key is recorded as completed without its result, so a
    /// retry gets [`Error::ResultNotRetained`] instead of running the work again.
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
                shared: Shared::new(self.store),
                policy: self.policy,
                codec: self.codec,
            }),
        })
    }
}

/// The engine: wraps work in claim → run → complete, so a duplicate call replays the stored
/// result instead of running again. Cheap to clone (one `Arc`).
///
/// Round trips per call (on top of the work itself; a SQL store's `start` may add one read, see
/// its [`ClaimOrder`](crate::ClaimOrder)):
///
/// | path | statements |
/// |---|---|
/// | new key | 1 claim + 1 complete (+ 1 renew per third of the lease the work runs) |
/// | replay | 1 (the claim attempt returns the stored record) |
/// | work fails, cancelled or panics (not detached) | 1 claim + 1 abort |
/// | completion fails for a passing reason | 1 claim + 1 complete, then the completion again in the background until it lands |
/// | locked, fail fast | 1 |
///
/// # What a call guarantees when things go wrong
///
/// | what happens | what the engine does |
/// |---|---|
/// | the caller is cancelled (a `timeout`, a dropped future) while the work runs | [`run_detached`](Self::run_detached): the work runs on to the end on its own task and its result is stored, so a retry replays it. The other `run*` methods cannot keep borrowed work alive: they release the claim, and a retry runs the work again |
/// | the caller is cancelled while the claim statement is in flight | the statement is finished on a task of its own and whatever it claimed is released |
/// | the caller is cancelled while the result is being stored | the completion is finished on a task of its own |
/// | a retry in this process while a claim is being released | the retry waits for the release (one statement), never a [`Error::Locked`] for a key that is being freed |
/// | the result is larger than [`Policy::max_response_bytes`] or cannot be encoded | the caller gets its result; the key is kept as "completed, result not retained" and a retry gets [`Error::ResultNotRetained`], never a second execution |
/// | storing the result fails for a passing reason (store unreachable, statement timeout, disk full) | the caller gets its result; the completion is retried in the background, fenced by the claim's token and renewing the lease, until it lands, the key is taken over, or the retention ends |
/// | the claim was taken over while the work ran (its lease ran out) | [`Error::LeaseLost`]: the work may have run twice |
///
/// A process that exits (or a runtime that shuts down) loses what it had not finished: a claim
/// it held frees when its lease ends. Make the lease longer than the store outages you want to
/// ride out without a second execution.
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
    shared: Arc<Shared>,
    policy: Policy,
    codec: C,
}

/// What every call of one engine shares, and the tasks it leaves behind (releases, background
/// completions) need: not generic over the codec.
struct Shared {
    store: Arc<dyn Store>,
    /// Calls waiting on a key held by another call ([`OnLocked::Wait`]).
    waiters: Waiters,
    /// Keys whose claim this process is releasing right now.
    releases: Releases,
    /// How long recent work took: the basis of `retry_after`.
    typical: Typical,
}

impl Shared {
    fn new(store: Arc<dyn Store>) -> Arc<Shared> {
        Arc::new(Shared {
            store,
            waiters: Waiters::default(),
            releases: Releases::default(),
            typical: Typical::default(),
        })
    }
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
                shared: Shared::new(store),
                policy: Policy::default(),
                codec: JsonCodec,
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
        &self.inner.shared.store
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
    /// - The work is polled inside this call, so it may borrow. Dropping the returned future
    ///   (cancellation) or a panic in the work stops the work and releases the claim, so a retry
    ///   runs it again: use [`run_detached`](Self::run_detached) when a started call must finish
    ///   whatever its caller does. A release that is under way is awaited by a retry in the same
    ///   process, so the retry never sees a key that is being freed as locked.
    /// - The lease is renewed in the background of this call every third of the lease.
    /// - A result that cannot be stored (too large, not encodable) is still returned; a retry
    ///   gets [`Error::ResultNotRetained`]. A completion that fails for a passing reason is
    ///   retried in the background and the result is returned (see the table on
    ///   [`Idempotency`]).
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
            |value: &T| Encoded::from(codec.encode(value)),
            |bytes: &[u8]| codec.decode(bytes),
            |_| None,
            |bytes| Error::StoredError(bytes).into(),
        )
        .await
    }

    /// [`run_with`](Self::run_with) for work that must finish once it has started, whatever
    /// happens to its caller: the claim, the work and the completion run on a task of their own
    /// (spawned on the current tokio runtime), and this call waits for it. If the caller is
    /// cancelled (a `timeout`, a client that disconnects, a dropped future), the work goes on, its
    /// result is stored, and a retry replays it (or, while it still runs, finds the key locked,
    /// or waits for it under [`OnLocked::Wait`]). The work runs exactly once per key either way.
    ///
    /// The work must own what it uses (`'static + Send`). A panic in the work is resumed in this
    /// call, and its claim is released. Outside a tokio runtime the work runs in this call, as
    /// with [`run_with`](Self::run_with).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::{CallOptions, Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "customer-7", "order-1001")?;
    /// let opts = CallOptions::default();
    /// // The caller gives up after 10 ms, but the charge goes on and is stored.
    /// let slow = engine.run_detached(&opts, Some(key), None, async {
    ///     tokio::time::sleep(Duration::from_millis(50)).await;
    ///     Ok::<_, Error>(4200u64)
    /// });
    /// assert!(tokio::time::timeout(Duration::from_millis(10), slow).await.is_err());
    /// // The retry waits for the charge that is under way and replays it: one charge.
    /// let wait = CallOptions { on_locked: Some(idem_core::OnLocked::Wait { timeout: Duration::from_secs(5) }), ..opts };
    /// let again = engine.run_detached(&wait, Some(key), None, async { Ok::<_, Error>(9999u64) }).await?;
    /// assert!(again.is_replayed());
    /// assert_eq!(again.into_inner(), 4200);
    /// # Ok(()) }
    /// ```
    pub async fn run_detached<T, E, F>(
        &self,
        opts: &CallOptions,
        key: Option<Key>,
        fingerprint: Option<Fingerprint>,
        work: F,
    ) -> Result<Outcome<T>, E>
    where
        F: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let engine = self.clone();
        let opts = *opts;
        detach(async move { engine.run_with(&opts, key, fingerprint, work).await }).await
    }

    /// [`run_with`](Self::run_with) for a value with its own byte format: it is stored with
    /// `encode` and replayed with `decode` instead of the engine's codec. An `Err` from the work
    /// is not stored; an encoded value larger than [`Policy::max_response_bytes`], or one that
    /// `encode` refuses, is returned but not kept (a retry gets [`Error::ResultNotRetained`]).
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
        encode: impl FnOnce(&T) -> Result<Vec<u8>, BoxError>,
        decode: impl FnOnce(&[u8]) -> Result<T, BoxError>,
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
            |value: &T| Encoded::from(encode(value)),
            decode,
            |_| None,
            |bytes| Error::StoredError(bytes).into(),
        )
        .await
    }

    /// The HTTP layer's call: detached, with its own byte format, and a value that may say it
    /// cannot be stored ([`Encoded::NotRetained`]).
    #[cfg(feature = "http")]
    pub(crate) async fn run_detached_encoded<T, E, F>(
        &self,
        opts: &CallOptions,
        key: Key,
        fingerprint: Option<Fingerprint>,
        work: F,
        encode: fn(&T) -> Encoded,
        decode: fn(&[u8]) -> Result<T, BoxError>,
    ) -> Result<Outcome<T>, E>
    where
        F: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let engine = self.clone();
        let opts = *opts;
        detach(async move {
            engine
                .drive(
                    &opts,
                    Some(key),
                    fingerprint,
                    work,
                    encode,
                    decode,
                    |_| None,
                    |bytes| Error::StoredError(bytes).into(),
                )
                .await
        })
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
            |value: &T| Encoded::from(codec.encode(value)),
            |bytes: &[u8]| codec.decode(bytes),
            |e: &E| Some(Encoded::from(codec.encode(e))),
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
        encode_ok: impl FnOnce(&T) -> Encoded,
        decode_ok: impl FnOnce(&[u8]) -> Result<T, BoxError>,
        encode_err: impl FnOnce(&E) -> Option<Encoded>,
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
        let shared = &self.inner.shared;
        let guard = ClaimGuard {
            shared: shared.clone(),
            claim: Some(claim.clone()),
        };
        let began = Instant::now();
        let result = renewing(&*shared.store, &claim, lease, work).await;
        shared.typical.observe(began.elapsed());

        let (encoded, is_error) = match &result {
            Ok(value) => (encode_ok(value), false),
            Err(e) => match encode_err(e) {
                Some(encoded) => (encoded, true),
                // An error that is not stored: free the key so a retry runs again.
                None => {
                    guard.release().await;
                    return result.map(Outcome::Fresh);
                }
            },
        };
        let sealed = seal(encoded, policy.max_response_bytes, claim.key());
        guard.complete(sealed, is_error, retention, lease).await?;
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
        let shared = &self.inner.shared;
        // A claim this process is releasing is not another caller's: wait the one statement
        // it takes (bounded by the lease, after which the claim would be free anyway).
        shared.releases.settled(key, lease).await;
        let timeout = match on_locked {
            OnLocked::FailFast => {
                return match start(shared, key, fingerprint, lease).await? {
                    Start::Started(c) => Ok(Acquired::Claim(c)),
                    Start::Completed(c) => Ok(Acquired::Replay(c)),
                    Start::Locked { retry_after } => Err(Error::Locked {
                        retry_after: shared.typical.retry_after(retry_after),
                    }),
                };
            }
            OnLocked::Wait { timeout } => timeout,
        };
        let deadline = Instant::now() + timeout;
        let slot = shared.waiters.join(*key);
        let mut poller: Option<PollerRole<'_>> = None;
        let mut backoff = Duration::from_millis(5);
        // Bounded: every pass either returns or sleeps until a wake-up or the deadline.
        loop {
            let mut woken = pin!(slot.notify.notified());
            woken.as_mut().enable();
            let retry_after = match start(shared, key, fingerprint, lease).await? {
                Start::Started(c) => return Ok(Acquired::Claim(c)),
                Start::Completed(c) => return Ok(Acquired::Replay(c)),
                Start::Locked { retry_after } => retry_after,
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

/// A result as the engine is about to store it.
pub(crate) enum Encoded {
    /// The encoded value.
    Bytes(Vec<u8>),
    /// The value cannot be stored (it could not be captured or encoded); why.
    NotRetained(String),
}

impl From<Result<Vec<u8>, BoxError>> for Encoded {
    fn from(encoded: Result<Vec<u8>, BoxError>) -> Encoded {
        match encoded {
            Ok(bytes) => Encoded::Bytes(bytes),
            Err(e) => Encoded::NotRetained(format!("encoding it failed: {e}")),
        }
    }
}

/// The stored form of a result: its bytes in a checksummed envelope, or the note that it was not
/// retained (too large, not encodable, not capturable), so a retry is told instead of running
/// the work again.
pub(crate) fn seal(encoded: Encoded, limit: usize, key: &Key) -> Vec<u8> {
    let reason = match encoded {
        Encoded::Bytes(bytes) if bytes.len() <= limit => return envelope::result(&bytes),
        Encoded::Bytes(bytes) => format!(
            "it is {} bytes, more than max_response_bytes ({limit})",
            bytes.len()
        ),
        Encoded::NotRetained(reason) => reason,
    };
    tracing::warn!(%key, %reason, "the result is not retained; a retry gets ResultNotRetained and the work does not run again");
    envelope::not_retained(&reason)
}

/// What a stored record replays as: the decoded value, the stored error, or the news that the
/// result was not retained.
pub(crate) fn replay<T, E: From<Error>>(
    cached: Cached,
    decode_ok: impl FnOnce(&[u8]) -> Result<T, BoxError>,
    replay_err: impl FnOnce(Vec<u8>) -> E,
) -> Result<Outcome<T>, E> {
    let is_error = cached.is_error;
    let bytes = cached.result()?;
    if is_error {
        return Err(replay_err(bytes.to_vec()));
    }
    match decode_ok(bytes) {
        Ok(value) => Ok(Outcome::Replayed(value)),
        Err(e) => Err(Error::Codec(e).into()),
    }
}

enum Acquired {
    Claim(Claim),
    Replay(Cached),
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Runs `fut` to its end even when the caller stops waiting: polled in place while the caller
/// polls, and when dropped unfinished, handed to `orphaned`, which returns what to spawn on the
/// runtime in its place. Costs one allocation, no task, while the caller stays.
struct RunToEnd<T, O>
where
    O: FnOnce(BoxFuture<T>) -> BoxFuture<()>,
{
    fut: Option<BoxFuture<T>>,
    orphaned: Option<O>,
}

impl<T, O> RunToEnd<T, O>
where
    O: FnOnce(BoxFuture<T>) -> BoxFuture<()>,
{
    fn new(fut: BoxFuture<T>, orphaned: O) -> Self {
        RunToEnd {
            fut: Some(fut),
            orphaned: Some(orphaned),
        }
    }
}

impl<T, O> Future for RunToEnd<T, O>
where
    O: FnOnce(BoxFuture<T>) -> BoxFuture<()> + Unpin,
{
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        let Some(fut) = this.fut.as_mut() else {
            // Only reachable by polling after completion, which a caller never does.
            return Poll::Pending;
        };
        let out = std::task::ready!(fut.as_mut().poll(cx));
        this.fut = None;
        Poll::Ready(out)
    }
}

impl<T, O> Drop for RunToEnd<T, O>
where
    O: FnOnce(BoxFuture<T>) -> BoxFuture<()>,
{
    fn drop(&mut self) {
        if let (Some(fut), Some(orphaned)) = (self.fut.take(), self.orphaned.take()) {
            spawn_or_drop(orphaned(fut));
        }
    }
}

/// Spawns `fut` on the current tokio runtime; without one it can only be dropped.
fn spawn_or_drop(fut: BoxFuture<()>) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(fut);
        }
        Err(_) => tracing::warn!(
            "no tokio runtime to finish an idempotency store operation on; a claim it made frees \
             when its lease ends"
        ),
    }
}

/// Runs `fut` on a task of its own and waits for it; the task goes on if this call is dropped.
/// A panic in it is resumed here. Outside a tokio runtime `fut` runs in this call.
async fn detach<T, E>(fut: impl Future<Output = Result<T, E>> + Send + 'static) -> Result<T, E>
where
    T: Send + 'static,
    E: From<Error> + Send + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return fut.await;
    };
    match runtime.spawn(fut).await {
        Ok(out) => out,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(Error::Store(StoreError::new(
            StoreErrorKind::Unavailable,
            "the tokio runtime shut down before the detached call finished",
        ))
        .into()),
    }
}

/// One claim attempt that is finished even if its caller goes away: a claim statement in flight
/// (waiting on a lock, say) may still commit, so an orphaned attempt runs on to its end on a task
/// of its own, and whatever it claimed is released. A retry in this process waits for that.
async fn start(
    shared: &Arc<Shared>,
    key: &Key,
    fingerprint: Option<&Fingerprint>,
    lease: Duration,
) -> Result<Start, Error> {
    let attempt = {
        let (store, key, fingerprint) = (shared.store.clone(), *key, fingerprint.copied());
        Box::pin(async move { store.start(&key, fingerprint.as_ref(), lease).await })
    };
    let shared = shared.clone();
    let key = *key;
    RunToEnd::new(attempt, move |attempt: BoxFuture<Result<Start, Error>>| {
        let releasing = shared.releases.begin(&shared, key);
        Box::pin(async move {
            if let Ok(Start::Started(claim)) = attempt.await {
                release(&*releasing.shared.store, &claim).await;
            }
            drop(releasing);
        })
    })
    .await
}

/// Polls `work` to completion while renewing the claim's lease every third of the lease, in the
/// same task (so cancelling the call stops both). A renewal that fails for a passing reason is
/// retried sooner, with backoff, for as long as the lease lasts.
async fn renewing<F: Future>(
    store: &dyn Store,
    claim: &Claim,
    lease: Duration,
    work: F,
) -> F::Output {
    let period = lease / 3;
    let heartbeat = async {
        let mut next = Instant::now() + period;
        let mut backoff = RETRY_FIRST.min(period);
        loop {
            tokio::time::sleep_until(next).await;
            match store.renew(claim, lease).await {
                Ok(()) => {
                    next += period;
                    backoff = RETRY_FIRST.min(period);
                }
                Err(Error::LeaseLost) => {
                    tracing::warn!(key = %claim.key(), "lease lost while the work runs; completion will fail");
                    return std::future::pending::<Infallible>().await;
                }
                Err(e) => {
                    tracing::warn!(key = %claim.key(), error = %e, "lease renewal failed; retrying");
                    next = Instant::now() + backoff;
                    backoff = (backoff * 2).min(period);
                }
            }
        }
    };
    tokio::select! {
        biased;
        out = work => out,
        never = heartbeat => match never {},
    }
}

/// The first pause before a failed renewal or completion is tried again; it doubles each time.
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest pause between two tries of a completion that keeps failing.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Owns a claim until it is completed or released; dropping it armed (cancellation, panic)
/// releases the claim on a task of its own, and a retry in this process waits for that.
struct ClaimGuard {
    shared: Arc<Shared>,
    claim: Option<Claim>,
}

impl ClaimGuard {
    /// Stores the sealed result. From here on the work has run, so this is finished even if the
    /// caller goes away, and a failure that passes is retried in the background.
    async fn complete(
        mut self,
        sealed: Vec<u8>,
        is_error: bool,
        retention: Duration,
        lease: Duration,
    ) -> Result<(), Error> {
        let Some(claim) = self.claim.take() else {
            return Ok(());
        };
        let completing = complete(
            self.shared.clone(),
            claim,
            sealed,
            is_error,
            retention,
            lease,
        );
        RunToEnd::new(
            Box::pin(completing),
            |rest: BoxFuture<Result<(), Error>>| {
                Box::pin(async move {
                    let _ = rest.await;
                })
            },
        )
        .await
    }

    /// Releases the claim so a retry runs again; visible at once to retries in this process.
    async fn release(mut self) {
        if let Some(claim) = self.claim.take() {
            let releasing = self.shared.releases.begin(&self.shared, *claim.key());
            RunToEnd::new(
                Box::pin(async move {
                    release(&*releasing.shared.store, &claim).await;
                    drop(releasing);
                }),
                |rest: BoxFuture<()>| rest,
            )
            .await;
        }
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            let releasing = self.shared.releases.begin(&self.shared, *claim.key());
            spawn_or_drop(Box::pin(async move {
                release(&*releasing.shared.store, &claim).await;
                drop(releasing);
            }));
        }
    }
}

/// One try at storing the result; if it fails for a passing reason the result is the caller's
/// anyway, and the completion goes on in the background.
async fn complete(
    shared: Arc<Shared>,
    claim: Claim,
    sealed: Vec<u8>,
    is_error: bool,
    retention: Duration,
    lease: Duration,
) -> Result<(), Error> {
    let done = Completion {
        response: Some(&sealed),
        is_error,
    };
    // The lease is still renewed while the completion waits (for a pooled connection taken by
    // other work, say), so the key cannot be taken over in the meantime.
    let stored = renewing(
        &*shared.store,
        &claim,
        lease,
        shared.store.complete(&claim, done, retention),
    );
    match stored.await {
        Err(Error::Store(e)) if e.kind().is_transient() => {
            tracing::warn!(key = %claim.key(), error = %e, "storing the result failed; retrying in the background");
            spawn_or_drop(Box::pin(keep_completing(
                shared, claim, sealed, is_error, retention, lease,
            )));
            Ok(())
        }
        other => {
            shared.waiters.wake(claim.key());
            other
        }
    }
}

/// Retries a completion until it lands, the key is taken over, a definite error says it never
/// will, or the retention (after which the result would not be replayed anyway) has passed. The
/// claim's lease is renewed meanwhile, so the key stays this process's while the store is away.
async fn keep_completing(
    shared: Arc<Shared>,
    claim: Claim,
    sealed: Vec<u8>,
    is_error: bool,
    retention: Duration,
    lease: Duration,
) {
    let key = *claim.key();
    let give_up = Instant::now() + retention;
    let mut renew_at = Instant::now() + lease / 3;
    let mut backoff = RETRY_FIRST;
    let done = Completion {
        response: Some(&sealed),
        is_error,
    };
    // Bounded by `give_up`: every pass sleeps at least RETRY_FIRST.
    loop {
        let jitter = backoff.mul_f64(fastrand::f64() * 0.5);
        tokio::time::sleep(backoff + jitter).await;
        backoff = (backoff * 2).min(RETRY_MAX);
        match shared.store.complete(&claim, done, retention).await {
            Ok(()) => {
                tracing::info!(%key, "the result was stored after a retry");
                break;
            }
            Err(Error::LeaseLost) => {
                tracing::error!(%key, "the key was taken over before its result could be stored: the work may run twice");
                break;
            }
            Err(Error::Store(e)) if e.kind().is_transient() => {
                if Instant::now() >= give_up {
                    tracing::error!(%key, error = %e, "gave up storing the result after its retention");
                    break;
                }
                if Instant::now() >= renew_at {
                    // A failure here is decided by the next completion attempt.
                    let _ = shared.store.renew(&claim, lease).await;
                    renew_at = Instant::now() + lease / 3;
                }
            }
            Err(e) => {
                tracing::error!(%key, error = %e, "storing the result failed for good; the key frees when its lease ends");
                break;
            }
        }
    }
    shared.waiters.wake(&key);
}

async fn release(store: &dyn Store, claim: &Claim) {
    match store.abort(claim).await {
        Ok(()) | Err(Error::LeaseLost) => {}
        Err(e) => {
            tracing::warn!(key = %claim.key(), error = %e, "releasing the claim failed; it frees when its lease ends")
        }
    }
}

/// The keys whose claims this process is releasing, so a retry here waits for the release
/// instead of meeting the claim in the store.
#[derive(Default)]
struct Releases {
    /// How many releases are under way: zero lets every call skip the map.
    pending: AtomicUsize,
    keys: Mutex<HashMap<Key, ReleaseSlot>>,
}

struct ReleaseSlot {
    done: Arc<Notify>,
    count: usize,
}

/// A release under way; dropping it (done, or its task dropped) ends it and wakes whoever waits.
struct Releasing {
    shared: Arc<Shared>,
    key: Key,
}

impl Releases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, ReleaseSlot>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn begin(&self, shared: &Arc<Shared>, key: Key) -> Releasing {
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.lock()
            .entry(key)
            .or_insert_with(|| ReleaseSlot {
                done: Arc::new(Notify::new()),
                count: 0,
            })
            .count += 1;
        Releasing {
            shared: shared.clone(),
            key,
        }
    }

    /// Waits until no release of `key` is under way in this process, for at most `bound`.
    async fn settled(&self, key: &Key, bound: Duration) {
        if self.pending.load(Ordering::Acquire) == 0 {
            return;
        }
        let _ = tokio::time::timeout(bound, async {
            // Bounded: each pass waits for one release of the key to end.
            loop {
                let done = match self.lock().get(key) {
                    Some(slot) => slot.done.clone(),
                    None => return,
                };
                let mut ended = pin!(done.notified());
                ended.as_mut().enable();
                // The release may have ended between the look-up and `enable`.
                if !self
                    .lock()
                    .get(key)
                    .is_some_and(|slot| Arc::ptr_eq(&slot.done, &done))
                {
                    continue;
                }
                ended.await;
            }
        })
        .await;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        let releases = &self.shared.releases;
        let ended = {
            let mut keys = releases.lock();
            match keys.get_mut(&self.key) {
                Some(slot) if slot.count > 1 => {
                    slot.count -= 1;
                    None
                }
                Some(_) => keys.remove(&self.key).map(|slot| slot.done),
                None => None,
            }
        };
        releases.pending.fetch_sub(1, Ordering::AcqRel);
        if let Some(done) = ended {
            done.notify_waiters();
        }
        self.shared.waiters.wake(&self.key);
    }
}

/// A running estimate of how long this engine's work takes, for `retry_after`: an exponentially
/// weighted mean over recent calls (weight 1/8), in microseconds; zero until the first call.
#[derive(Default)]
struct Typical(AtomicU64);

/// `retry_after` before any work has finished in this engine.
const FIRST_GUESS: Duration = Duration::from_secs(1);
/// The shortest `retry_after`: retrying sooner only spends a round trip.
const MIN_RETRY_AFTER: Duration = Duration::from_millis(10);

impl Typical {
    fn observe(&self, took: Duration) {
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        // A lost update between two racing calls only skips one sample.
        let old = self.0.load(Ordering::Relaxed);
        let new = if old == 0 {
            took
        } else {
            old - old / 8 + took / 8
        };
        self.0.store(new.max(1), Ordering::Relaxed);
    }

    /// When a call locked out by a live claim should try again: how long this engine's work
    /// typically takes (at least [`MIN_RETRY_AFTER`]; [`FIRST_GUESS`] before any has finished),
    /// never more than what is left of the holder's lease.
    fn retry_after(&self, lease_left: Duration) -> Duration {
        let typical = match self.0.load(Ordering::Relaxed) {
            0 => FIRST_GUESS,
            micros => Duration::from_micros(micros).max(MIN_RETRY_AFTER),
        };
        typical.min(lease_left)
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
    /// How many waiters hold this slot; changed only under the map's lock, so the last one out
    /// removes it whatever else holds a reference for a moment.
    members: AtomicUsize,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn join(&self, key: Key) -> SlotRef<'_> {
        let slot = {
            let mut slots = self.lock();
            let slot = slots.entry(key).or_default();
            slot.members.fetch_add(1, Ordering::Relaxed);
            slot.clone()
        };
        SlotRef {
            waiters: self,
            key,
            slot,
        }
    }

    fn wake(&self, key: &Key) {
        if let Some(slot) = self.lock().get(key) {
            slot.notify.notify_waiters();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
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
        if self.slot.members.fetch_sub(1, Ordering::Relaxed) == 1 {
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

#[cfg(test)]
mod tests {
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
        let wait = CallOptions {
            on_locked: Some(OnLocked::Wait {
                timeout: Duration::from_secs(30),
            }),
            ..CallOptions::default()
        };
        let mut tasks = tokio::task::JoinSet::new();
        for batch in 0..4u32 {
            let engine = engine.clone();
            tasks.spawn(async move {
                for i in 0..25_000u32 {
                    let k = key(batch * 25_000 + i);
                    let (a, b) = tokio::join!(
                        engine.run_with(&wait, Some(k), None, async {
                            tokio::task::yield_now().await;
                            Ok::<_, Error>(i)
                        }),
                        engine.run_with(&wait, Some(k), None, async { Ok::<_, Error>(i) }),
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
}
