//! [`OffloadStore`]: the wrapper, its builder, and what it does differently from the store it
//! wraps.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Forward, Forwarding};
use idem_core::{
    Claim, ClaimOutcome, ClaimRequest, Clock, Completion, Error, Key, Record, RecordState, StepLog,
    StepState, StepWrite, Store, StoreError, StoreErrorKind, StoredResult, SystemClock,
};
use object_store::path::Path;
use object_store::ObjectStore;

use crate::objects::{self, Objects};
use crate::pointer::{self, Pointer};

/// idem's own step records (`idem.input`, `idem.failed.<n>`, `idem.rerun.<n>`): the stores
/// parse their bytes (the completer's query reads the input), so they are never offloaded. A
/// step of the work cannot have a name that starts with it (the engine refuses one).
const RESERVED_STEPS: &str = "idem.";

/// The most parts a multipart upload may have (S3's limit; GCS and Azure allow as many).
const MAX_PARTS: usize = 10_000;

/// A [`Store`] wrapper that keeps large results in object storage: a result over the
/// [threshold](OffloadStoreBuilder::threshold) is uploaded as an object of its own, and the
/// record the wrapped store keeps holds a small pointer to it (its location, size and SHA-256).
/// A replay reads the record, then the object, checks both, and returns the result byte for
/// byte. Smaller results pass through unchanged. Build one with [`OffloadStore::builder`]; the
/// store to hand the engine is [`Forwarding`]`<OffloadStore<S>>`, which
/// [`build`](OffloadStoreBuilder::build) returns.
///
/// | operation | what the wrapper adds |
/// |---|---|
/// | `complete` of a large result | first 1 `PUT` of a new object (mode create; a multipart upload over [`part_size`](OffloadStoreBuilder::part_size)), then the wrapped store's `complete` with the pointer |
/// | `claim` or `get` of an offloaded result | after the wrapped store's read, 1 `GET` of the object, checked |
/// | `write_step` / `begin_steps` | the same, for step results (not idem's own step records) |
/// | `prune_expired` | after the wrapped store's, deletes the objects of hours that ended more than the [grace](OffloadStoreBuilder::grace) ago |
/// | [`max_response_bytes`](Store::max_response_bytes) | [`max_object_bytes`](OffloadStoreBuilder::max_object_bytes) (1 GiB): an engine whose limit was not set takes it |
/// | everything else | the wrapped store's, unchanged |
///
/// **The order of writes.** The object is written before the record points at it, under a
/// name no other object has, and never changed after. A crash between the two leaves an object
/// no record points at (an orphan, deleted with its hour) and an in-progress record whose lease
/// lapses as any crashed claim's does; a retry runs the work and writes its own object. A
/// record whose object is missing or holds other bytes reads as a
/// [`StoreErrorKind::Corrupt`] store error: never a replay of other bytes, never a second run.
///
/// **Encryption.** To keep results encrypted at rest in the bucket too, put the encrypting
/// wrapper outside this one (it encrypts, then this one offloads the ciphertext).
///
/// docs/offload.md has the round trips, what a crash leaves at each point, the pruner and the
/// lifecycle rule, and peak memory.
///
/// ```
/// use std::sync::Arc;
/// use idem::object_store::memory::InMemory;
/// use idem::{Error, Idempotency, Key, MemoryStore, OffloadStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let bucket = Arc::new(InMemory::new()); // S3, GCS, Azure or a local directory in production
/// let store = OffloadStore::builder(MemoryStore::new(), bucket).build()?;
/// let engine = Idempotency::new(store);
/// let key = Key::derive("report", "", "r-1")?;
/// let big = "x".repeat(2 << 20); // 2 MiB: over the threshold, and over the 1 MiB default
/// let first = engine.call(key).run(async { Ok::<_, Error>(big.clone()) }).await?;
/// let again = engine.call(key).run(async { Ok::<_, Error>(String::new()) }).await?;
/// assert!(again.is_replayed());
/// assert_eq!(again.into_inner(), first.into_inner());
/// # Ok(()) }
/// ```
pub struct OffloadStore<S> {
    inner: S,
    objects: Objects,
    /// Results longer than this go to an object: the builder's threshold, or less when the
    /// wrapped store keeps less in a record.
    threshold: usize,
    max_object_bytes: usize,
    grace: Duration,
    clock: Arc<dyn Clock>,
}

impl<S> fmt::Debug for OffloadStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OffloadStore")
            .field("objects", &self.objects.store)
            .field("prefix", &self.objects.prefix)
            .field("threshold", &self.threshold)
            .field("max_object_bytes", &self.max_object_bytes)
            .field("part_size", &self.objects.part_size)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl<S: Store> OffloadStore<S> {
    /// A builder of the wrapper around `inner` (any store) that keeps large results in
    /// `objects` (any object_store backend), with the defaults of
    /// [`OffloadStoreBuilder`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{MemoryStore, OffloadStore};
    /// let store = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new()))
    ///     .prefix("payments/idem")
    ///     .threshold(64 * 1024)
    ///     .build()?;
    /// assert_eq!(store.threshold(), 64 * 1024);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn builder(inner: S, objects: Arc<dyn ObjectStore>) -> OffloadStoreBuilder<S> {
        OffloadStoreBuilder {
            inner,
            objects,
            prefix: OffloadStoreBuilder::<S>::DEFAULT_PREFIX.to_owned(),
            threshold: OffloadStoreBuilder::<S>::DEFAULT_THRESHOLD,
            max_object_bytes: OffloadStoreBuilder::<S>::DEFAULT_MAX_OBJECT_BYTES,
            part_size: OffloadStoreBuilder::<S>::DEFAULT_PART_SIZE,
            grace: OffloadStoreBuilder::<S>::DEFAULT_GRACE,
            clock: Arc::new(SystemClock),
        }
    }
}

impl<S> OffloadStore<S> {
    /// The object store results go to.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{MemoryStore, OffloadStore};
    /// let store = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new())).build()?;
    /// assert_eq!(store.objects().to_string(), "InMemory");
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.objects.store
    }

    /// The path under which its objects are named (`<prefix>/<hour>/<key>.<id>`).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{MemoryStore, OffloadStore};
    /// let store = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new())).build()?;
    /// assert_eq!(store.prefix().as_ref(), "idem");
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn prefix(&self) -> &Path {
        &self.objects.prefix
    }

    /// The size over which a result goes to an object: the builder's
    /// [threshold](OffloadStoreBuilder::threshold), or the wrapped store's own
    /// [`max_response_bytes`](Store::max_response_bytes) if that is smaller (a result it could
    /// not keep is offloaded too).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{MemoryStore, OffloadStore};
    /// let store = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new())).build()?;
    /// assert_eq!(store.threshold(), 256 * 1024);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn threshold(&self) -> usize {
        self.threshold
    }

    /// Deletes at most `limit` objects under hours that ended more than the
    /// [grace](OffloadStoreBuilder::grace) ago, oldest first, and returns how many went: what
    /// [`prune_expired`](Store::prune_expired) does after the wrapped store's records. Every
    /// record that points at such an object has ended (its retention ended in that hour), so
    /// what goes is the objects of ended records and orphans.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{MemoryStore, OffloadStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new())).build()?;
    /// assert_eq!(store.prune_objects(100).await?, 0); // nothing has ended
    /// # Ok(()) }
    /// ```
    pub async fn prune_objects(&self, limit: u64) -> Result<u64, Error> {
        let cutoff = objects::cutoff(self.clock.now(), self.grace);
        self.objects.prune_ended(cutoff, limit).await
    }

    /// Whether `value` goes to an object: longer than the threshold, or shaped as a pointer
    /// (so that no value kept in a record reads as one).
    fn offloads(&self, value: &[u8]) -> bool {
        value.len() > self.threshold || pointer::is_pointer(value)
    }

    /// Uploads `value`, a result of `key` kept for `retention` from now, as a new object.
    async fn upload(&self, key: &Key, retention: Duration, value: &[u8]) -> Result<Pointer, Error> {
        if value.len() > self.max_object_bytes {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Query,
                format!(
                    "OffloadStore keeps results of at most {} bytes (max_object_bytes), not {}: \
                     an engine keeps such a result as not retained; nothing was written",
                    self.max_object_bytes,
                    value.len()
                ),
            )));
        }
        let Some(ends) = self.clock.now().checked_add(retention) else {
            return Err(Error::InvalidConfig(format!(
                "a retention of {retention:?} from now is past what the clock can tell"
            )));
        };
        let location = self.objects.location(key, ends);
        self.objects.upload(location, value).await
    }

    /// `value` itself, or, when it is a pointer, the object it points at, checked.
    async fn resolve(&self, value: Vec<u8>) -> Result<Vec<u8>, Error> {
        match Pointer::decode(&value) {
            None => Ok(value),
            Some(pointer) => self.objects.download(&pointer?).await,
        }
    }

    async fn resolve_result(&self, mut stored: StoredResult) -> Result<StoredResult, Error> {
        if let Some(value) = stored.response.take() {
            stored.response = Some(self.resolve(value).await?);
        }
        Ok(stored)
    }

    /// What the wrapped store answered to a write of `pointer`, after deleting its object if
    /// the store refused it and says nothing was written. An error that leaves that unknown (the
    /// store unreachable, its answer lost) keeps the object, which the record may point at; if
    /// it does not, it is an orphan the pruner removes with its hour.
    async fn settle(&self, pointer: &Pointer, written: Result<(), Error>) -> Result<(), Error> {
        let Err(e) = &written else {
            return written;
        };
        let nothing_written = match e {
            Error::LeaseLost | Error::InvalidConfig(_) | Error::InvalidStep(_) => true,
            Error::StepsUnsupported => true,
            Error::Store(e) => matches!(
                e.kind(),
                StoreErrorKind::Full
                    | StoreErrorKind::ReadOnly
                    | StoreErrorKind::Query
                    | StoreErrorKind::Unauthorized
            ),
            _ => false,
        };
        if nothing_written {
            self.objects.delete_quietly(&pointer.location).await;
        }
        written
    }
}

#[async_trait]
impl<S: Store> Forward for OffloadStore<S> {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    /// The wrapped store's claim; a completed record's offloaded result is read back, checked.
    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        match self.inner.claim(request).await? {
            ClaimOutcome::Completed(stored) => {
                Ok(ClaimOutcome::Completed(self.resolve_result(stored).await?))
            }
            other => Ok(other),
        }
    }

    /// A large result is uploaded first, then the wrapped store completes with its pointer.
    async fn complete(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error> {
        let Some(value) = completion.response.filter(|value| self.offloads(value)) else {
            return self.inner.complete(claim, completion).await;
        };
        completion.check()?;
        let pointer = self
            .upload(claim.key(), completion.retention, value)
            .await?;
        let kept = pointer.encode();
        let response = Some(&kept[..]);
        let completed = self
            .inner
            .complete(
                claim,
                Completion {
                    response,
                    ..completion
                },
            )
            .await;
        self.settle(&pointer, completed).await
    }

    /// The wrapped store's record; a completed one's offloaded result is read back, checked.
    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let Some(mut record) = self.inner.get(key).await? else {
            return Ok(None);
        };
        if let RecordState::Completed(stored) = record.state {
            record.state = RecordState::Completed(self.resolve_result(stored).await?);
        }
        Ok(Some(record))
    }

    /// The wrapped store's step log; each offloaded step result is read back, checked.
    async fn begin_steps(&self, claim: &Claim, retention: Duration) -> Result<StepLog, Error> {
        let mut log = self.inner.begin_steps(claim, retention).await?;
        for step in &mut log.steps {
            if step.name.starts_with(RESERVED_STEPS) {
                continue;
            }
            if let StepState::Finished(value) = &mut step.state {
                *value = self.resolve(std::mem::take(value)).await?;
            }
        }
        Ok(log)
    }

    /// A large step result is uploaded first, then the wrapped store writes its pointer; idem's
    /// own step records pass unchanged.
    async fn write_step(&self, claim: &Claim, step: StepWrite<'_>) -> Result<(), Error> {
        let value = match step.result {
            Some(value) if !step.name.starts_with(RESERVED_STEPS) && self.offloads(value) => value,
            _ => return self.inner.write_step(claim, step).await,
        };
        step.check()?;
        let pointer = self.upload(claim.key(), step.retention, value).await?;
        let kept = pointer.encode();
        let result = Some(&kept[..]);
        let written = self
            .inner
            .write_step(claim, StepWrite { result, ..step })
            .await;
        self.settle(&pointer, written).await
    }

    /// The wrapped store's ended records, then, with what is left of `limit`, the objects of
    /// ended hours ([`OffloadStore::prune_objects`]). What it returns counts both, and is less
    /// than `limit` only when both are drained.
    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        let records = self.inner.prune_expired(limit).await?;
        let room = u64::from(limit).saturating_sub(records);
        Ok(records + self.prune_objects(room).await?)
    }

    /// [`max_object_bytes`](OffloadStoreBuilder::max_object_bytes).
    fn max_response_bytes(&self) -> Option<usize> {
        Some(self.max_object_bytes)
    }
}

/// Builds an [`OffloadStore`]: [`OffloadStore::builder`], then the settings, then
/// [`build`](Self::build).
///
/// | setting | default |
/// |---|---|
/// | [`prefix`](Self::prefix) | `idem` |
/// | [`threshold`](Self::threshold) | 256 KiB |
/// | [`max_object_bytes`](Self::max_object_bytes) | 1 GiB |
/// | [`part_size`](Self::part_size) | 8 MiB |
/// | [`grace`](Self::grace) | 1 hour |
/// | [`clock`](Self::clock) | the system's |
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use idem::object_store::memory::InMemory;
/// use idem::{MemoryStore, OffloadStore};
/// let store = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new()))
///     .prefix("orders/idem")
///     .threshold(128 * 1024)
///     .max_object_bytes(256 << 20)
///     .part_size(16 << 20)
///     .grace(Duration::from_secs(2 * 3600))
///     .build()?;
/// # let _ = store; Ok::<(), idem::Error>(())
/// ```
pub struct OffloadStoreBuilder<S> {
    inner: S,
    objects: Arc<dyn ObjectStore>,
    prefix: String,
    threshold: usize,
    max_object_bytes: usize,
    part_size: usize,
    grace: Duration,
    clock: Arc<dyn Clock>,
}

impl<S> fmt::Debug for OffloadStoreBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OffloadStoreBuilder")
            .field("objects", &self.objects)
            .field("prefix", &self.prefix)
            .field("threshold", &self.threshold)
            .field("max_object_bytes", &self.max_object_bytes)
            .field("part_size", &self.part_size)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl<S: Store> OffloadStoreBuilder<S> {
    /// `idem`: objects are named `idem/<hour>/<key>.<id>`.
    ///
    /// ```
    /// use idem::{MemoryStore, OffloadStoreBuilder};
    /// assert_eq!(OffloadStoreBuilder::<MemoryStore>::DEFAULT_PREFIX, "idem");
    /// ```
    pub const DEFAULT_PREFIX: &'static str = "idem";

    /// 256 KiB. Results up to it stay in the record, where a replay costs one round trip to
    /// the store; larger ones cost the store more than the extra `GET` of a replay (a row past
    /// PostgreSQL's TOAST threshold, Redis memory on every replica, DynamoDB's 400 KB item).
    /// It is below DynamoDB's limit, so every store keeps what is not offloaded.
    ///
    /// ```
    /// use idem::{MemoryStore, OffloadStoreBuilder};
    /// assert_eq!(OffloadStoreBuilder::<MemoryStore>::DEFAULT_THRESHOLD, 262_144);
    /// ```
    pub const DEFAULT_THRESHOLD: usize = 256 * 1024;

    /// 1 GiB. The engine holds a result in memory to store and replay it (about twice its
    /// size while it is stored, docs/offload.md), so the bound is the process's, not the
    /// object store's (S3 takes objects of 5 TiB).
    ///
    /// ```
    /// use idem::{MemoryStore, OffloadStoreBuilder};
    /// assert_eq!(OffloadStoreBuilder::<MemoryStore>::DEFAULT_MAX_OBJECT_BYTES, 1 << 30);
    /// ```
    pub const DEFAULT_MAX_OBJECT_BYTES: usize = 1 << 30;

    /// 8 MiB: S3's parts are at least 5 MiB; 1 GiB is 128 of them.
    ///
    /// ```
    /// use idem::{MemoryStore, OffloadStoreBuilder};
    /// assert_eq!(OffloadStoreBuilder::<MemoryStore>::DEFAULT_PART_SIZE, 8 << 20);
    /// ```
    pub const DEFAULT_PART_SIZE: usize = 8 << 20;

    /// One hour. See [`grace`](Self::grace).
    ///
    /// ```
    /// use idem::{MemoryStore, OffloadStoreBuilder};
    /// assert_eq!(OffloadStoreBuilder::<MemoryStore>::DEFAULT_GRACE.as_secs(), 3600);
    /// ```
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

    /// The path under which objects are named: `<prefix>/<hour its retention ends, UTC>/<key
    /// hex>.<128 random bits hex>`. Give each store wrapped in one bucket its own: the pruner
    /// deletes ended hours under it. One or more path segments, as object_store parses a path
    /// (no empty segment, no `.` or `..`).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{Error, MemoryStore, OffloadStore};
    /// let bucket = Arc::new(InMemory::new());
    /// let ok = OffloadStore::builder(MemoryStore::new(), bucket.clone()).prefix("a/b").build()?;
    /// assert_eq!(ok.prefix().as_ref(), "a/b");
    /// let bad = OffloadStore::builder(MemoryStore::new(), bucket).prefix("a//b").build();
    /// assert!(matches!(bad, Err(Error::InvalidConfig(_))));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Results (and step results) longer than this many bytes go to an object; shorter ones
    /// stay in the record. Default [`DEFAULT_THRESHOLD`](Self::DEFAULT_THRESHOLD), 256 KiB.
    /// Capped at the wrapped store's own [`max_response_bytes`](Store::max_response_bytes).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{MemoryStore, OffloadStore};
    /// let all = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new())).threshold(0).build()?;
    /// assert_eq!(all.threshold(), 0); // every non-empty result goes to an object
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn threshold(mut self, bytes: usize) -> Self {
        self.threshold = bytes;
        self
    }

    /// The largest result kept, in bytes: the store's
    /// [`max_response_bytes`](Store::max_response_bytes), so an engine whose own limit was not
    /// set takes it (a larger result is kept as "completed, not retained": a retry gets
    /// `ResultNotRetained`, never a second run). Default
    /// [`DEFAULT_MAX_OBJECT_BYTES`](Self::DEFAULT_MAX_OBJECT_BYTES), 1 GiB; at most 10,000
    /// [parts](Self::part_size).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{Idempotency, MemoryStore, OffloadStore, Store};
    /// let store = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new()))
    ///     .max_object_bytes(64 << 20)
    ///     .build()?;
    /// assert_eq!(store.max_response_bytes(), Some(64 << 20));
    /// let engine = Idempotency::new(store);
    /// assert_eq!(engine.policy().max_response_bytes(), 64 << 20);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn max_object_bytes(mut self, bytes: usize) -> Self {
        self.max_object_bytes = bytes;
        self
    }

    /// The size of a multipart upload's parts: a result up to it is one `PUT`, a larger one a
    /// multipart upload of parts this size, two in flight, each copied from the result only as
    /// it is sent. 5 MiB to 5 GiB (S3's bounds). Default
    /// [`DEFAULT_PART_SIZE`](Self::DEFAULT_PART_SIZE), 8 MiB.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{Error, MemoryStore, OffloadStore};
    /// let small = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new())).part_size(1 << 20).build();
    /// assert!(matches!(small, Err(Error::InvalidConfig(_))));
    /// ```
    pub fn part_size(mut self, bytes: usize) -> Self {
        self.part_size = bytes;
        self
    }

    /// How long after its hour has ended an hour's objects are kept before
    /// [`prune_expired`](Store::prune_expired) deletes them. An object is named for the hour
    /// its retention ends as this process's clock counts it when it uploads; its record's
    /// retention runs from the wrapped store's `complete`, a moment later on the store's clock.
    /// The grace covers that: it must exceed the time between an upload and its record's commit
    /// plus the skew between the two clocks. Default
    /// [`DEFAULT_GRACE`](Self::DEFAULT_GRACE), one hour; at most ten years.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{MemoryStore, OffloadStore};
    /// let store = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new()))
    ///     .grace(Duration::from_secs(600))
    ///     .build()?;
    /// # let _ = store; Ok::<(), idem::Error>(())
    /// ```
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The clock that names an object's hour and says which hours have ended. Default the
    /// system's; a test moves a [`ManualClock`](idem_core::ManualClock) shared with its store.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{ManualClock, MemoryStore, OffloadStore};
    /// let clock = ManualClock::new();
    /// let store = OffloadStore::builder(MemoryStore::with_clock(clock.clone()), Arc::new(InMemory::new()))
    ///     .clock(clock)
    ///     .build()?;
    /// # let _ = store; Ok::<(), idem::Error>(())
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The store to hand the engine. [`Error::InvalidConfig`] for a prefix that is not an
    /// object path or is empty, a part size outside 5 MiB..5 GiB, a `max_object_bytes` of 0
    /// or of more than 10,000 parts, a grace over ten years, or a wrapped store whose own
    /// limit cannot hold a pointer.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::object_store::memory::InMemory;
    /// use idem::{Error, MemoryStore, OffloadStore};
    /// let empty = OffloadStore::builder(MemoryStore::new(), Arc::new(InMemory::new())).prefix("").build();
    /// assert!(matches!(empty, Err(Error::InvalidConfig(_))));
    /// ```
    pub fn build(self) -> Result<Forwarding<OffloadStore<S>>, Error> {
        let invalid = |why: String| Err(Error::InvalidConfig(why));
        let prefix = match Path::parse(&self.prefix) {
            Ok(prefix) if prefix.parts_count() > 0 => prefix,
            Ok(_) => {
                return invalid(
                    "the OffloadStore's prefix is empty: give its objects a path of their own \
                     (the pruner deletes ended hours under it)"
                        .into(),
                )
            }
            Err(e) => return invalid(format!("the OffloadStore's prefix is not a path: {e}")),
        };
        const MIN_PART: usize = 5 << 20;
        const MAX_PART: u64 = 5 << 30;
        if self.part_size < MIN_PART || self.part_size as u64 > MAX_PART {
            return invalid(format!(
                "the OffloadStore's part_size must be 5 MiB to 5 GiB (S3's bounds), got {}",
                self.part_size
            ));
        }
        let most = self.part_size.saturating_mul(MAX_PARTS);
        if self.max_object_bytes == 0 || self.max_object_bytes > most {
            return invalid(format!(
                "the OffloadStore's max_object_bytes must be 1 to 10,000 parts ({most} bytes at \
                 a part_size of {}), got {}",
                self.part_size, self.max_object_bytes
            ));
        }
        if self.grace > Duration::from_secs(10 * 365 * 24 * 3600) {
            return invalid(format!(
                "the OffloadStore's grace must be at most ten years, got {:?}",
                self.grace
            ));
        }
        // The longest pointer: the prefix, an hour, a key (64 hex digits), '.', 32 hex digits.
        let longest = pointer::len_with(prefix.as_ref().len() + 1 + 13 + 1 + 64 + 1 + 32);
        let kept = self.inner.max_response_bytes();
        if kept.is_some_and(|kept| kept < longest) {
            return invalid(format!(
                "the wrapped store keeps responses of at most {} bytes, less than a pointer under \
                 this prefix ({longest} bytes): shorten the prefix",
                kept.unwrap_or_default()
            ));
        }
        let threshold = self.threshold.min(kept.unwrap_or(usize::MAX));
        Ok(Forwarding(OffloadStore {
            inner: self.inner,
            objects: Objects::new(self.objects, prefix, self.part_size),
            threshold,
            max_object_bytes: self.max_object_bytes,
            grace: self.grace,
            clock: self.clock,
        }))
    }
}
