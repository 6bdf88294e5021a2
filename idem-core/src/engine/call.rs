//! One call through an engine: its key, fingerprint and options, then how it runs.

use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use tracing::Instrument;

use super::{
    run_to_end, Claimed, Encoded, Errors, Format, Guarded, Idempotency, OnLocked, Outcome,
    Overrides, Steps,
};
use crate::codec::Codec;
use crate::error::{BoxError, Error};
use crate::key::{Fingerprint, Key};
use crate::observe::{Probe, Scope};
use crate::record::OnLapse;
use crate::step::{StepLog, INPUT_POSITION, INPUT_STEP};

/// One call through an engine, made by [`Idempotency::call`] (or `Transactional::call`, features
/// `sqlite`/`postgres`): set what differs from the engine's policy, then run it.
///
/// | step | what it sets | default |
/// |---|---|---|
/// | [`fingerprint`](Self::fingerprint) | what the request was, so a reused key with another request gets [`Error::KeyReused`] | none: any request under the key replays |
/// | [`lease`](Self::lease) | how long the claim blocks the key without a heartbeat | the policy's |
/// | [`retention`](Self::retention) | how long the result replays | the policy's |
/// | [`on_locked`](Self::on_locked) | what a call meeting a live claim does | the policy's |
///
/// | how it runs | the work | when the caller goes away while it runs |
/// |---|---|---|
/// | [`run`](Self::run) | may borrow | stopped; its claim is released, so a retry runs it again |
/// | [`run_detached`](Self::run_detached) | owns what it uses (`'static + Send`) | once its claim is won, runs on to its end and its result is stored, so a retry replays it |
/// | [`run_storing_errors`](Self::run_storing_errors) | may borrow | as `run`; an `Err` is stored and replayed too |
///
/// A duration is checked when the call runs: out of range (zero, or more than ten years), the
/// call fails with [`Error::InvalidConfig`] before the store is touched.
///
/// ```
/// use std::time::Duration;
/// use idem::{Error, Fingerprint, Idempotency, Key, MemoryStore, OnLocked};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let key = Key::derive("charge", "customer-7", "order-1001")?;
/// let out = engine
///     .call(key)
///     .fingerprint(Fingerprint::of_json(&("EUR", 4200))?)
///     .retention(Duration::from_secs(7 * 24 * 3600))
///     .on_locked(OnLocked::Wait { timeout: Duration::from_secs(5) })
///     .run(async { Ok::<_, Error>(4200u64) })
///     .await?;
/// assert!(!out.is_replayed());
/// let reused = engine
///     .call(key)
///     .fingerprint(Fingerprint::of_json(&("EUR", 9900))?)
///     .run(async { Ok::<_, Error>(9900u64) })
///     .await;
/// assert!(matches!(reused, Err(Error::KeyReused)));
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a call does nothing until it is run and awaited"]
pub struct Call<'e, En> {
    pub(crate) engine: &'e En,
    pub(crate) key: Option<Key>,
    pub(crate) fingerprint: Option<Fingerprint>,
    pub(crate) overrides: Overrides,
    pub(crate) scope: Scope,
    /// [`run_steps_with`](Self::run_steps_with)'s input: the bytes of the input's step record
    /// to store with the steps, or why the input cannot be stored (the call then fails before
    /// its claim).
    steps_input: Option<Result<Vec<u8>, Error>>,
}

impl<'e, En> Call<'e, En> {
    pub(crate) fn new(engine: &'e En, key: Option<Key>) -> Self {
        Call {
            engine,
            key,
            fingerprint: None,
            overrides: Overrides::default(),
            scope: Scope::default(),
            steps_input: None,
        }
    }

    /// Names the operation in metrics, traces and [`Observer`](crate::Observer) events (keys
    /// are hashes, so this is the only name they carry; `"unscoped"` otherwise). Use the scope
    /// the key was derived with; keep it to a fixed set of names, as it labels metric series.
    /// The attribute and the HTTP layer set it to their scope.
    pub fn scope(mut self, scope: &'static str) -> Self {
        self.scope = Scope::Static(scope);
        self
    }

    /// [`scope`](Self::scope) from a name known only at run time (an HTTP layer's scope, a
    /// queue's name). It labels metric series as `scope` does: keep the set of names small.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let queue: Arc<str> = Arc::from("orders");
    /// let key = Key::derive(&queue, "", "message-1")?;
    /// engine.call(key).scope_named(queue).run(async { Ok::<_, Error>(1) }).await?;
    /// # Ok(()) }
    /// ```
    pub fn scope_named(mut self, scope: impl Into<std::sync::Arc<str>>) -> Self {
        self.scope = Scope::Shared(scope.into());
        self
    }

    /// What the request was: a later call with the same key and another fingerprint gets
    /// [`Error::KeyReused`] instead of the replay. `None` (the default) matches any request.
    pub fn fingerprint(mut self, fingerprint: impl Into<Option<Fingerprint>>) -> Self {
        self.fingerprint = fingerprint.into();
        self
    }

    /// How long this call's claim blocks its key without a heartbeat (the policy's
    /// [`lease`](crate::Policy::lease) otherwise).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.overrides.lease = Some(lease);
        self
    }

    /// How long this call's result replays (the policy's
    /// [`retention`](crate::Policy::retention) otherwise).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.overrides.retention = Some(retention);
        self
    }

    /// Sets several options at once (the attribute's and the HTTP layer's way).
    pub(crate) fn overrides(mut self, overrides: Overrides) -> Self {
        if let Some(scope) = overrides.scope {
            self.scope = Scope::Static(scope);
        }
        self.overrides = overrides;
        self
    }
}

impl<'e, C: Codec> Call<'e, Idempotency<C>> {
    /// What this call does when another call holds a live claim on its key (the policy's
    /// [`on_locked`](crate::Policy::on_locked) otherwise).
    pub fn on_locked(mut self, on_locked: OnLocked) -> Self {
        self.overrides.on_locked = Some(on_locked);
        self
    }

    /// What this call's key becomes if its claim lapses with no completion (the policy's
    /// [`on_lapse`](crate::Policy::on_lapse) otherwise): [`OnLapse::Uncertain`] for work whose
    /// effect must not repeat (a charge through a provider), so that a holder that dies or
    /// stalls past its lease leaves the key uncertain, and every retry gets
    /// [`Error::Uncertain`] until it is resolved ([`Idempotency::resolve`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Error, Idempotency, Key, ManualClock, MemoryStore, OnLapse};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let clock = ManualClock::new();
    /// let engine = Idempotency::new(MemoryStore::with_clock(clock.clone()));
    /// let key = Key::derive("charge", "", "c-1")?;
    /// let idem::CallClaim::Claimed(_dead) = engine.call(key).on_lapse(OnLapse::Uncertain).claim().await? else {
    ///     unreachable!()
    /// };
    /// clock.advance(Duration::from_secs(31)); // its holder stalled past the lease
    /// let retry = engine.call(key).run(async { Ok::<_, Error>("charged again".to_owned()) }).await;
    /// assert!(matches!(retry, Err(Error::Uncertain { operation, .. }) if operation == key));
    /// # Ok(()) }
    /// ```
    pub fn on_lapse(mut self, on_lapse: OnLapse) -> Self {
        self.overrides.on_lapse = Some(on_lapse);
        self
    }

    /// The key to pass to a provider that takes an idempotency key of its own (Stripe's
    /// `Idempotency-Key`, a bank's request id) for this call's effect: derived from the call's
    /// key, so the same on every attempt and after a takeover, and never the client's key
    /// itself. `None` for a call without a key. See [`Key::provider_key`].
    ///
    /// ```
    /// use idem::{Idempotency, Key, MemoryStore};
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "alice", "req-1")?;
    /// let first = engine.call(key).provider_key();
    /// assert_eq!(first, engine.call(key).provider_key());
    /// assert_eq!(first, Some(key.provider_key(None)));
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn provider_key(&self) -> Option<String> {
        self.key.map(|k| k.provider_key(None))
    }

    /// Runs `work` once per key: the first call runs it and stores its `Ok` value; later calls
    /// with the same key replay that value until the retention ends.
    ///
    /// - An `Err` from the work is not stored: the claim is released so a retry runs again.
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
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "customer-7", "order-1001")?;
    /// let first = engine.call(key).run(async { Ok::<_, Error>(4200u64) }).await?;
    /// let again = engine.call(key).run(async { Ok::<_, Error>(9999u64) }).await?;
    /// assert!(again.is_replayed());
    /// assert_eq!(again.into_inner(), 4200); // the second future never ran
    /// # let _ = first; Ok(()) }
    /// ```
    // Not an `async fn`: it returns the engine's future itself, one layer less to move (about
    // 2 KB, once per layer, when the future starts).
    #[inline(always)]
    pub fn run<T, E, F>(self, work: F) -> impl Future<Output = Result<Outcome<T>, E>> + 'e
    where
        F: Future<Output = Result<T, E>> + 'e,
        T: Serialize + DeserializeOwned + 'e,
        E: From<Error> + 'e,
    {
        let codec = self.engine.codec();
        self.drive(
            None,
            work,
            WithCodec(codec),
            Released,
            std::convert::identity,
        )
    }

    /// What `#[idempotent]` runs (through `__private::call`): [`run`](Self::run) for a body
    /// that resolves to the function's own return type `R`, giving `R` back; or `R` with the
    /// error `refused` (a key or fingerprint that could not be made) without claiming anything.
    /// The engine's own future, as `run` returns it: `__private::call` only prepares the call
    /// and returns this, since every async layer moves the engine's future (about 2 KB) once
    /// more.
    #[inline(always)]
    pub(crate) fn run_into<R, F>(
        self,
        refused: Option<Error>,
        body: F,
    ) -> impl Future<Output = R> + 'e
    where
        R: crate::__private::IdempotentResult + 'e,
        R::Value: Serialize + DeserializeOwned,
        R::Error: From<Error>,
        F: Future<Output = R> + 'e,
    {
        let codec = self.engine.codec();
        let body = async move { body.await.into_result() };
        let finish = |result: Result<Outcome<R::Value>, R::Error>| {
            R::from_result(result.map(Outcome::into_inner))
        };
        self.drive(refused, body, WithCodec(codec), Released, finish)
    }

    /// [`run`](Self::run) for work that must finish once it has started, whatever happens to
    /// its caller. The claim is made in the caller's task; once it is won, the work and the
    /// storing of its result run to their end: in the caller's task while the caller waits (no
    /// task spawned, no other worker woken), and on a task of their own (spawned on the current
    /// tokio runtime) from the moment the caller drops this future. So if the caller is
    /// cancelled (a `timeout`, a client that disconnects, a dropped future) after the claim, the
    /// work goes on, its result is stored, and a retry replays it (or, while it still runs, finds
    /// the key locked, or waits for it under [`OnLocked::Wait`]); cancelled before or during
    /// the claim, nothing ran, a claim the statement made is released, and a retry runs the
    /// work. The work runs at most once per key either way. The HTTP layer runs its handlers
    /// this way.
    ///
    /// The work must own what it uses (`'static + Send`). A panic in the work is resumed in this
    /// call, and its claim is released. Like every future, this one makes progress only while it
    /// is polled: hold it without polling it and the work waits too (drop it, and the work goes
    /// on by itself). Outside a tokio runtime, work whose caller drops it cannot go on: its
    /// claim frees when its lease ends.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Error, Idempotency, Key, MemoryStore, OnLocked};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "customer-7", "order-1001")?;
    /// // The caller gives up after 10 ms, but the charge goes on and is stored (it waits for
    /// // the card network, `answered` here, which answers only once the caller has gone).
    /// let (answer, answered) = tokio::sync::oneshot::channel::<()>();
    /// let slow = engine.call(key).run_detached(async {
    ///     let _ = answered.await;
    ///     Ok::<_, Error>(4200u64)
    /// });
    /// assert!(tokio::time::timeout(Duration::from_millis(10), slow).await.is_err());
    /// let _ = answer.send(());
    /// // The retry waits for the charge that is under way and replays it: one charge.
    /// let again = engine
    ///     .call(key)
    ///     .on_locked(OnLocked::Wait { timeout: Duration::from_secs(5) })
    ///     .run_detached(async { Ok::<_, Error>(9999u64) })
    ///     .await?;
    /// assert!(again.is_replayed());
    /// assert_eq!(again.into_inner(), 4200);
    /// # Ok(()) }
    /// ```
    // A plain function returning the engine's future, as `run`.
    #[inline(always)]
    pub fn run_detached<T, E, F>(
        self,
        work: F,
    ) -> impl Future<Output = Result<Outcome<T>, E>> + Send + 'e
    where
        F: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let codec = WithCodec(self.engine.clone());
        self.run_detached_as(work, codec)
    }

    /// Like [`run`](Self::run), but an `Err` from the work is stored and replayed too (for
    /// errors that are final answers, such as "card declined"). The error type must serialize;
    /// a later [`run`](Self::run) of the same key, which cannot decode it, gets
    /// [`Error::StoredError`] with its bytes.
    ///
    /// ```
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// #[derive(Debug, serde::Serialize, serde::Deserialize)]
    /// enum PayError { Declined, Idem(String) }
    /// impl From<Error> for PayError { fn from(e: Error) -> Self { PayError::Idem(e.to_string()) } }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("pay", "", "p-1")?;
    /// let first = engine.call(key).run_storing_errors(async { Err::<u32, _>(PayError::Declined) }).await;
    /// let again = engine.call(key).run_storing_errors(async { Ok::<u32, PayError>(1) }).await;
    /// assert!(matches!(first, Err(PayError::Declined)));
    /// assert!(matches!(again, Err(PayError::Declined))); // replayed, the body did not run
    /// # Ok(()) }
    /// ```
    // Not an `async fn`, as `run`.
    #[inline(always)]
    pub fn run_storing_errors<T, E, F>(
        self,
        work: F,
    ) -> impl Future<Output = Result<Outcome<T>, E>> + 'e
    where
        F: Future<Output = Result<T, E>> + 'e,
        T: Serialize + DeserializeOwned + 'e,
        E: Serialize + DeserializeOwned + From<Error> + 'e,
    {
        let codec = self.engine.codec();
        self.drive(
            None,
            work,
            WithCodec(codec),
            WithCodec(codec),
            std::convert::identity,
        )
    }

    /// Runs an operation of several named steps: [`run`](Self::run) whose work receives a
    /// [`Steps`] handle. Each step's result is stored under the call's key and the step's name
    /// as soon as it finishes, fenced by the call's claim (a claim that was taken over stores
    /// nothing), so a retry of the operation (after a crash, a lost lease, a failure or a
    /// cancelled call) replays the finished steps and continues at the first unfinished one.
    /// The operation's result is stored and replayed as `run` does. Steps are kept when the
    /// claim is released, until the operation completes and for the call's retention after
    /// their last write; see docs/steps.md for what is promised and what is not.
    ///
    /// The store must keep steps ([`Error::StepsUnsupported`] otherwise): all of idem's stores
    /// do; a store of your own does once it implements [`Store::begin_steps`](crate::Store::begin_steps)
    /// and [`Store::write_step`](crate::Store::write_step). Without a key, every step runs and
    /// nothing is stored. One or two round trips more than `run` to begin (docs/steps.md), then
    /// one per step (two for an [`at_most_once`](crate::Step::at_most_once) step).
    ///
    /// ```
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("ride", "rider-7", "req-1")?;
    /// let ride = engine
    ///     .call(key)
    ///     .run_steps(|steps| async move {
    ///         let id: u64 = steps.run("create ride", || async { Ok::<_, Error>(41) }).await?;
    ///         steps.run("charge", || async { Ok::<_, Error>(4200u64) }).await?;
    ///         Ok::<_, Error>(id)
    ///     })
    ///     .await?;
    /// assert_eq!(ride.into_inner(), 41);
    /// # Ok(()) }
    /// ```
    // A plain function returning an `async` block, for the reason given at `drive`.
    #[allow(clippy::manual_async_fn)]
    pub fn run_steps<T, E, W, F>(self, work: W) -> impl Future<Output = Result<Outcome<T>, E>> + 'e
    where
        W: FnOnce(Steps<C>) -> F + 'e,
        F: Future<Output = Result<T, E>> + 'e,
        T: Serialize + DeserializeOwned + 'e,
        E: From<Error> + 'e,
    {
        async move {
            let input = self.steps_input.transpose()?;
            let engine = self.engine;
            let Some(key) = self.key else {
                let steps = Steps::new(
                    engine.clone(),
                    None,
                    Duration::ZERO,
                    OnLapse::Release,
                    StepLog::first(),
                );
                return work(steps).await.map(Outcome::Fresh);
            };
            let core = &engine.inner.core;
            let mut probe = Probe::new(core.observer.as_deref(), &core.meters, &self.scope, key);
            let span = probe.span().clone();
            let format = WithCodec(engine.codec());
            async {
                let (holding, begun) = match engine
                    .claim_half(
                        &mut probe,
                        key,
                        self.fingerprint,
                        &self.overrides,
                        super::WithSteps::new(),
                        &format,
                        &Released,
                    )
                    .await
                {
                    Claimed::Ended(out) => return out,
                    Claimed::Holding(holding, log) => (holding, log),
                };
                let (claim, retention, on_lapse) = holding.steps_of();
                // A store that began the steps with the claim gave their log; otherwise they
                // are begun inside the work, so a store that refuses releases the claim as a
                // failed work does.
                let work = async move {
                    let log = match begun {
                        Some(log) => log,
                        None => engine.store().begin_steps(&claim, retention).await?,
                    };
                    let Some(input) = &input else {
                        // A store may begin a first attempt's steps without writing (the SQL
                        // stores count it with its first stored step): one that fails having
                        // stored nothing is counted before its claim is released, so that the
                        // next attempt's number is right. Best effort, on the failure path only.
                        let uncounted = log.attempt == 1 && log.steps.is_empty();
                        let steps = Steps::new(
                            engine.clone(),
                            Some(claim.clone()),
                            retention,
                            on_lapse,
                            log,
                        );
                        let out = work(steps).await;
                        if out.is_err() && uncounted {
                            let _ = engine.store().begin_steps(&claim, retention).await;
                        }
                        return out;
                    };
                    store_input(engine.store(), &claim, &log, input, retention).await?;
                    let attempt = log.attempt;
                    let out = work(Steps::new(
                        engine.clone(),
                        Some(claim.clone()),
                        retention,
                        on_lapse,
                        log,
                    ))
                    .await;
                    if out.is_err() {
                        // The caller gets the failure: no completer should run it again. Best
                        // effort: unmarked, a completer retries it once its claim is released.
                        let _ = mark_failed(engine.store(), &claim, attempt, retention).await;
                    }
                    out
                };
                engine
                    .work_half(&mut probe, &holding, work, &format, &Released)
                    .await
            }
            .instrument(span)
            .await
        }
    }

    /// [`run_steps`](Self::run_steps) that also stores the operation's `input` under `scope`
    /// with its steps, so that a [`Completer`](crate::Completer) with a handler for `scope` can
    /// finish the operation if it is abandoned (its holder dies and no client retries): the
    /// completer claims it after its lease and runs the handler with `input`, which replays the
    /// finished steps and runs the rest, as a retry would. Give `input` as the handler reads it
    /// (say, the request's JSON), and run the same steps in the handler as here.
    ///
    /// The input is written once, when the operation's first attempt begins its steps (one
    /// round trip more for that attempt), and kept as its steps are (docs/steps.md,
    /// "Completer"). `scope` names the handler: 1 to 255 bytes of printable ASCII, else
    /// [`Error::InvalidKey`] before anything is claimed. Errors otherwise as `run_steps`'.
    ///
    /// ```
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("rides", "rider-7", "req-1")?;
    /// let ride = engine
    ///     .call(key)
    ///     .run_steps_with("rides", br#"{"from":"a","to":"b"}"#.to_vec(), |steps| async move {
    ///         steps.run("create ride", || async { Ok::<_, Error>(41u64) }).await
    ///     })
    ///     .await?;
    /// assert_eq!(ride.into_inner(), 41);
    /// # Ok(()) }
    /// ```
    pub fn run_steps_with<T, E, W, F>(
        mut self,
        scope: &str,
        input: Vec<u8>,
        work: W,
    ) -> impl Future<Output = Result<Outcome<T>, E>> + 'e + use<'e, T, E, W, F, C>
    where
        W: FnOnce(Steps<C>) -> F + 'e,
        F: Future<Output = Result<T, E>> + 'e,
        T: Serialize + DeserializeOwned + 'e,
        E: From<Error> + 'e,
    {
        self.steps_input = Some(
            crate::key::check_scope(scope)
                .map(|()| crate::step::Abandoned::encode_input(scope, &input))
                .map_err(Error::from),
        );
        self.run_steps(work)
    }

    /// The one way a call whose work must finish once it has started runs
    /// ([`run_detached`](Self::run_detached), the HTTP layer, and every transport after them),
    /// with `format` to store and replay its value: the claim is made in the caller's task (a
    /// replay, a refusal or a failure costs no task), and from the won claim on, the work and
    /// the storing of its result run to their end, in the caller's task while it waits and on a
    /// task of their own once it is dropped.
    // A plain function returning an `async` block, for the reason given at `drive`.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn run_detached_as<T, E, F, Fm>(
        self,
        work: F,
        format: Fm,
    ) -> impl Future<Output = Result<Outcome<T>, E>> + Send + 'e
    where
        F: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: From<Error> + Send + 'static,
        Fm: Format<T> + Send + Sync + 'static,
    {
        async move {
            let Some(key) = self.key else {
                return run_to_end(work).await.map(Outcome::Fresh);
            };
            // The claim is made in the caller's task: a replay, a refusal or a failure costs no
            // task of its own. A claim attempt the caller abandons is finished and released all
            // the same (see `finish::start`).
            let owned = self.into_owned();
            let (suspended, holding) = {
                let core = &owned.engine.inner.core;
                let mut probe =
                    Probe::new(core.observer.as_deref(), &core.meters, &owned.scope, key);
                let span = probe.span().clone();
                let claimed = owned
                    .engine
                    .claim_half(
                        &mut probe,
                        key,
                        owned.fingerprint,
                        &owned.overrides,
                        super::Plain,
                        &format,
                        &Released,
                    )
                    .instrument(span)
                    .await;
                match claimed {
                    Claimed::Ended(out) => return out,
                    Claimed::Holding(holding, _) => (probe.suspend(), holding),
                }
            };
            // It holds the key: from here the work and the storing of its result run to their
            // end, even if the caller goes away: in the caller's task while it waits, and on a
            // task of their own once it is dropped (`run_to_end`). Nothing is awaited between the
            // claim and this, so there is no point at which a dropped caller leaves the claim
            // held with no work running.
            run_to_end(async move {
                let core = &owned.engine.inner.core;
                let mut probe = Probe::resume(
                    suspended,
                    core.observer.as_deref(),
                    &core.meters,
                    &owned.scope,
                );
                let span = probe.span().clone();
                owned
                    .engine
                    .work_half(&mut probe, &holding, work, &format, &Released)
                    .instrument(span)
                    .await
            })
            .await
        }
    }

    /// Runs the call through the engine with the given result formats, reporting to the
    /// observer, metrics and tracing, and gives what `finish` makes of the outcome; or, with
    /// `refused`, that error without claiming anything. The one async layer of a call between
    /// its caller and the engine.
    // A plain function returning an `async` block, not an `async fn`: an `async fn` keeps its
    // arguments twice in its future (as arguments and as the locals they are moved into), and
    // this future is moved whole by every layer that wraps it.
    #[allow(clippy::manual_async_fn)]
    fn drive<T, E, F, R>(
        self,
        refused: Option<Error>,
        work: F,
        format: impl Format<T> + 'e,
        errors: impl Errors<E> + 'e,
        finish: impl FnOnce(Result<Outcome<T>, E>) -> R + 'e,
    ) -> impl Future<Output = R> + 'e
    where
        F: Future<Output = Result<T, E>> + 'e,
        E: From<Error> + 'e,
        T: 'e,
        R: 'e,
    {
        async move {
            if let Some(e) = refused {
                return finish(Err(e.into()));
            }
            let Some(key) = self.key else {
                return finish(work.await.map(Outcome::Fresh));
            };
            let (engine, core) = (self.engine, &self.engine.inner.core);
            let mut probe = Probe::new(core.observer.as_deref(), &core.meters, &self.scope, key);
            let call = Guarded {
                key,
                fingerprint: self.fingerprint,
                overrides: &self.overrides,
                format,
                errors,
            };
            // No span (nothing listens): nothing to enter and leave at every poll.
            if probe.span().is_none() {
                return finish(engine.guarded(&mut probe, call, work).await);
            }
            let span = probe.span().clone();
            finish(
                engine
                    .guarded(&mut probe, call, work)
                    .instrument(span)
                    .await,
            )
        }
    }

    /// The call with its own handle on the engine, to run on a task of its own.
    fn into_owned(self) -> Owned<C> {
        Owned {
            engine: self.engine.clone(),
            fingerprint: self.fingerprint,
            overrides: self.overrides,
            scope: self.scope,
        }
    }
}

/// A [`Call`] that owns its engine handle (for detached calls).
struct Owned<C> {
    engine: Idempotency<C>,
    fingerprint: Option<Fingerprint>,
    overrides: Overrides,
    scope: Scope,
}

/// Values (and, for [`Call::run_storing_errors`], errors) stored and replayed with the
/// engine's codec, borrowed (`&C`) or through an engine handle of its own (for detached work).
struct WithCodec<H>(H);

/// Where a [`WithCodec`] finds the codec.
trait CodecRef {
    type Codec: Codec;
    fn codec(&self) -> &Self::Codec;
}

impl<C: Codec> CodecRef for &C {
    type Codec = C;
    fn codec(&self) -> &C {
        self
    }
}

impl<C: Codec> CodecRef for Idempotency<C> {
    type Codec = C;
    fn codec(&self) -> &C {
        Idempotency::codec(self)
    }
}

impl<T: Serialize + DeserializeOwned, H: CodecRef> Format<T> for WithCodec<H> {
    fn encode(&self, value: &T) -> Encoded {
        Encoded::from(self.0.codec().encode(value))
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        self.0.codec().decode(bytes)
    }
}

impl<E: Serialize + DeserializeOwned + From<Error>, H: CodecRef> Errors<E> for WithCodec<H> {
    fn encode(&self, error: &E) -> Option<Encoded> {
        Some(Encoded::from(self.0.codec().encode(error)))
    }

    fn replay(&self, bytes: Vec<u8>) -> E {
        match self.0.codec().decode::<E>(&bytes) {
            Ok(e) => e,
            Err(err) => Error::Codec(err).into(),
        }
    }
}

/// Errors are not stored: the claim is released so a retry runs again. (A stored error met by
/// such a call is reported as [`Error::StoredError`].)
struct Released;

impl<E: From<Error>> Errors<E> for Released {
    fn encode(&self, _: &E) -> Option<Encoded> {
        None
    }

    fn replay(&self, bytes: Vec<u8>) -> E {
        Error::StoredError(bytes).into()
    }
}

/// Writes the operation's input record (see [`Call::run_steps_with`]) unless an earlier attempt
/// did: `log` is what this attempt's `begin_steps` found.
async fn store_input(
    store: &dyn crate::store::Store,
    claim: &crate::record::Claim,
    log: &StepLog,
    input: &[u8],
    retention: Duration,
) -> Result<(), Error> {
    if log.steps.iter().any(|s| s.name == INPUT_STEP) {
        return Ok(());
    }
    let step = crate::step::StepWrite {
        name: INPUT_STEP,
        position: INPUT_POSITION,
        result: Some(input),
        retention,
        on_lapse: None,
    };
    store.write_step(claim, step).await
}

/// Marks `attempt` of the operation `claim` holds as failed (see
/// [`Abandoned`](crate::Abandoned)): a completer leaves it alone.
async fn mark_failed(
    store: &dyn crate::store::Store,
    claim: &crate::record::Claim,
    attempt: u32,
    retention: Duration,
) -> Result<(), Error> {
    let name = crate::step::failed_step(attempt);
    let step = crate::step::StepWrite {
        name: &name,
        position: INPUT_POSITION,
        result: Some(b""),
        retention,
        on_lapse: None,
    };
    store.write_step(claim, step).await
}
