//! The [`Store`] trait and its backends (`idem::store::url` opens one by URL).
//!
//! The backends: `memory`, `sqlite` (feature `sqlite`) and `postgres` (feature `postgres`);
//! Redis and DynamoDB have crates of their own (idem-redis, idem-dynamodb: `idem::RedisStore`,
//! `idem::DynamoStore`), built on [`support`]. The
//! two SQL stores are laid out alike (`mod.rs` the store and its builder, `schema.rs` its
//! migrations, `protocol.rs` its tie to the shared store protocol) and share everything else in
//! `sql/`: the protocol, written once against a connection, the dialect, the table name,
//! the duration conversion, the row decoding and the migrator. All of them pass the same
//! conformance suite (`idem::conformance`, feature `conformance`).
//! [`Pruner::records`](crate::Pruner::records) deletes their expired records in the background.
//! [`Forwarding`] wraps a store in one of yours that forwards whatever it does not change.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Error;
use crate::key::{Fingerprint, Key, Token};
use crate::record::{Claim, ClaimOutcome, ClaimRequest, Completion, Record, UncertainOperation};
use crate::step::{Abandoned, AbandonedQuery, StepLog, StepWrite};

pub(crate) mod admin;
pub(crate) mod memory;
pub mod support;

/// Where idempotency records live. Every backend keeps these rules:
///
/// - **Atomic claim.** Of any number of concurrent `start`s for one key, exactly one gets
///   [`ClaimOutcome::Claimed`]. SQL backends do it in one conditional statement, never read-then-write.
/// - **Fencing.** `complete`, `abort` and `renew` change the record only while it still carries
///   the claim's token; otherwise they return [`Error::LeaseLost`].
/// - **Completing is idempotent per claim.** Completing a claim that already completed returns
///   `Ok` and keeps the first result, so a completion retried after its first attempt committed
///   but its answer was lost (a connection cut after the commit) learns that it landed instead
///   of reporting a lost lease. `abort` and `renew` of a completed claim are still
///   [`Error::LeaseLost`], and change nothing.
/// - **Observed commits.** An operation reports success only once its write has committed: a
///   commit that fails (a full disk) is an error, never a claim reported as won.
/// - **Lease is not retention.** An in-progress record blocks its key until its lease ends; a
///   completed one replays until its retention ends.
/// - **A late holder still completes.** A claim whose lease ended, on a key nobody has claimed
///   since, completes normally: the store keeps the lapsed record for
///   [`LAPSED_CLAIMS_KEPT`] after its lease (neither `prune_expired` nor the backend's own
///   expiry removes it sooner), while the next `start` takes it over as before.
/// - **Database time.** SQL backends compute leases and expiry with the server's clock.
/// - **Fingerprints.** A live record whose fingerprint is of another request than the one given
///   to `claim` (both present) gives [`Error::KeyReused`], or [`Error::PolicyChanged`] when
///   their policy versions differ too ([`check_fingerprint`]); an ended record is simply
///   replaced.
/// - **Uncertain, not free.** A claim made with [`OnLapse::Uncertain`](crate::OnLapse::Uncertain) whose lease ends with no
///   completion is never taken over by `claim` ([`ClaimOutcome::Uncertain`]) and never removed
///   by `prune_expired` or the backend's expiry: only its holder (`complete`, `abort`, `renew`
///   with its token), [`take_uncertain`](Store::take_uncertain) or `evict` change it.
/// - **Tombstones.** A completion with a `key_retention` keeps the key that much longer than
///   the result: after the retention a claim gets [`ClaimOutcome::Expired`], and the store may
///   drop the response's bytes (`prune_expired` does); after `key_retention` the key is free.
///
/// **A store that wraps another** (to count, log, route or inject faults) is best written as a
/// [`Forward`], which [`Forwarding`] makes a `Store` that forwards every method the wrapper does
/// not override. A `Store` impl of its own that forwards only the methods without a default
/// keeps the defaults below, which do not forward: the steps of every call on it fail with
/// [`Error::StepsUnsupported`], a [`Completer`](crate::Completer) with
/// [`Error::CompleterUnsupported`], and a pruner uses the default batch size, whatever the inner
/// store does.
///
/// Use a store through [`Idempotency`](crate::Idempotency); call it directly to build your own
/// engine:
///
/// ```
/// use std::time::Duration;
/// use idem::{Completion, Key, MemoryStore, ClaimOutcome, ClaimRequest, Store};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let store = MemoryStore::new();
/// let key = Key::derive("deposit", "alice", "req-1")?;
/// let lease = Duration::from_secs(30);
/// let ClaimOutcome::Claimed(claim) = store.claim(ClaimRequest::new(&key, lease)).await? else {
///     unreachable!("a new key is always started");
/// };
/// let retention = Duration::from_secs(3600);
/// store.complete(&claim, Completion { response: Some(b"ok"), is_error: false, retention, key_retention: Duration::ZERO }).await?;
/// // Completing the same claim again (say, after a lost answer) is Ok; the first result stands.
/// store.complete(&claim, Completion { response: Some(b"again"), is_error: false, retention, key_retention: Duration::ZERO }).await?;
/// let ClaimOutcome::Completed(cached) = store.claim(ClaimRequest::new(&key, lease)).await? else {
///     unreachable!("a completed key replays");
/// };
/// assert_eq!(cached.response.as_deref(), Some(&b"ok"[..]));
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Claims the request's key for its lease, or reports why not. See [`ClaimOutcome`]. A lease out
    /// of range is [`Error::InvalidConfig`] ([`ClaimRequest::check`]).
    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error>;

    /// Stores the response and keeps it for the completion's retention (one out of range is
    /// [`Error::InvalidConfig`], [`Completion::check`]). Fails with [`Error::LeaseLost`] when the
    /// record no longer carries the claim's token (it was taken over after its lease ended,
    /// aborted or evicted).
    ///
    /// Completing the same claim again returns `Ok` and changes nothing: the first response and
    /// its retention stand. A caller whose `complete` failed with an
    /// [`Unavailable`](crate::StoreErrorKind::Unavailable) store error, and so cannot tell
    /// whether it committed, may therefore simply call it again.
    async fn complete(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error>;

    /// Deletes the in-progress record so a retry may run again. [`Error::LeaseLost`] when the
    /// record no longer carries the claim's token or has completed (a completed record is never
    /// deleted by `abort`).
    async fn abort(&self, claim: &Claim) -> Result<(), Error>;

    /// Extends the claim's lease to `lease` from now (a heartbeat for long work).
    /// [`Error::LeaseLost`] when the record no longer carries the claim's token or has completed.
    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error>;

    /// The live record of `key`; expired records read as `None`.
    async fn get(&self, key: &Key) -> Result<Option<Record>, Error>;

    /// Deletes the record of `key` whatever its state; returns whether one existed. A running
    /// claim on it will get [`Error::LeaseLost`].
    async fn evict(&self, key: &Key) -> Result<bool, Error>;

    /// Deletes up to `limit` records whose lease or retention has ended; returns how many.
    /// Call it until it returns less than `limit` to drain.
    async fn prune_expired(&self, limit: u32) -> Result<u64, Error>;

    /// The batch size a [`Pruner`](crate::Pruner) of this store uses when its
    /// [`PrunerConfig`](crate::PrunerConfig) names none: the largest `limit` it passes to
    /// [`prune_expired`](Self::prune_expired) before it steps up. By default
    /// [`PrunerConfig::DEFAULT_BATCH_SIZE`](crate::PrunerConfig::DEFAULT_BATCH_SIZE) (100), which
    /// the memory and SQLite stores keep (a SQLite batch holds the database's only write lock);
    /// `PostgresStore` says 1,000, where fewer, larger batches meet
    /// fewer claims. A store that wraps another should return the inner store's, as
    /// [`Forwarding`] does.
    ///
    /// ```
    /// use idem::{MemoryStore, PrunerConfig, Store};
    /// assert_eq!(MemoryStore::new().prune_batch_size(), PrunerConfig::DEFAULT_BATCH_SIZE);
    /// ```
    fn prune_batch_size(&self) -> u32 {
        DEFAULT_PRUNE_BATCH_SIZE
    }

    /// The most bytes of a [`Completion`]'s response this store keeps in one record, when it has
    /// a limit of its own: DynamoDB's 400 KB item, the request body idem-server takes. `None`,
    /// the default, is no limit short of the engine's
    /// [`max_response_bytes`](crate::Policy::max_response_bytes).
    ///
    /// The engine reads it when it is built and keeps a result whose stored form would be
    /// larger as "completed, result not retained" itself (a retry gets
    /// [`Error::ResultNotRetained`], never a second run), so a store never writes the engine's
    /// envelope. A store that keeps more than the engine's 1 MiB default (one that offloads
    /// large results to object storage) states its limit here too: an engine whose
    /// [`max_response_bytes`](crate::EngineBuilder::max_response_bytes) was not set takes it.
    /// A store refuses a larger response with a
    /// [`StoreErrorKind::Query`](crate::StoreErrorKind::Query) error and keeps nothing. A store
    /// that wraps another should return the inner store's, as [`Forwarding`] does.
    ///
    /// ```
    /// use idem::{MemoryStore, Store};
    /// assert_eq!(MemoryStore::new().max_response_bytes(), None);
    /// ```
    fn max_response_bytes(&self) -> Option<usize> {
        None
    }

    /// Begins (or resumes) the steps of the operation `claim` holds: counts this claim as the
    /// operation's next attempt if it is not the one counted last, keeps the operation's step
    /// records for `retention` from now, and returns them with the attempt's number.
    /// [`Error::LeaseLost`] when the operation's record no longer carries the claim's token (or
    /// has completed); [`Error::StepsUnsupported`], the default, for a store that keeps no
    /// steps. Steps are kept apart from the operation's record: releasing the claim (`abort`)
    /// keeps them, so a retry resumes; `evict` deletes them; `prune_expired` deletes them once
    /// their retention has ended. See docs/steps.md.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Key, MemoryStore, ClaimOutcome, ClaimRequest, StepState, StepWrite, Store};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = MemoryStore::new();
    /// let key = Key::derive("ride", "", "r-1")?;
    /// let (lease, day) = (Duration::from_secs(30), Duration::from_secs(86_400));
    /// let ClaimOutcome::Claimed(claim) = store.claim(ClaimRequest::new(&key, lease)).await? else { unreachable!() };
    /// assert_eq!(store.begin_steps(&claim, day).await?.attempt, 1);
    /// let charged = StepWrite { name: "charge", position: 0, result: Some(b"7"), retention: day, on_lapse: None };
    /// store.write_step(&claim, charged).await?;
    /// store.abort(&claim).await?; // the work failed after its first step
    /// let ClaimOutcome::Claimed(retry) = store.claim(ClaimRequest::new(&key, lease)).await? else { unreachable!() };
    /// let log = store.begin_steps(&retry, day).await?;
    /// assert_eq!(log.attempt, 2);
    /// assert_eq!(log.steps[0].state, StepState::Finished(b"7".to_vec()));
    /// # Ok(()) }
    /// ```
    async fn begin_steps(&self, claim: &Claim, retention: Duration) -> Result<StepLog, Error> {
        let _ = (claim, retention);
        Err(Error::StepsUnsupported)
    }

    /// [`claim`](Self::claim), and, where the store can do it in the claim's own round trip,
    /// [`begin_steps`](Self::begin_steps) of the claim it won with `retention`: the step log
    /// comes back beside a [`ClaimOutcome::Claimed`] outcome, and only beside one. `None` means
    /// the steps are not begun, and a caller that runs steps calls `begin_steps` itself; the
    /// default claims and returns `None`. Both or neither: a store that returns a log has
    /// counted the claim as the operation's next attempt, as `begin_steps` would (it may leave
    /// a new operation's first attempt to be counted by the next attempt's claim, as the SQL
    /// stores do, whose first attempt keeps its steps in its record, so long as the next
    /// attempt's count comes out the same; the engine counts a first attempt that fails having
    /// stored nothing with a `begin_steps` before it releases the claim); a store
    /// that won the claim but cannot return the log releases the claim and returns the error.
    /// [`Call::run_steps`](crate::Call::run_steps) claims this way (PostgreSQL reads what it
    /// needs in the claim's statement); a store that wraps another through [`Forwarding`]
    /// keeps the default, so its own `claim` and `begin_steps` are the ones that run.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{ClaimOutcome, ClaimRequest, Key, MemoryStore, Store};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = MemoryStore::new();
    /// let key = Key::derive("ride", "", "r-1")?;
    /// let (lease, day) = (Duration::from_secs(30), Duration::from_secs(86_400));
    /// let (outcome, log) = store.claim_steps(ClaimRequest::new(&key, lease), day).await?;
    /// let ClaimOutcome::Claimed(claim) = outcome else { unreachable!() };
    /// // The memory store claims only: the caller begins the steps.
    /// let log = match log {
    ///     Some(log) => log,
    ///     None => store.begin_steps(&claim, day).await?,
    /// };
    /// assert_eq!(log.attempt, 1);
    /// # Ok(()) }
    /// ```
    async fn claim_steps(
        &self,
        request: ClaimRequest<'_>,
        retention: Duration,
    ) -> Result<(ClaimOutcome, Option<StepLog>), Error> {
        let _ = retention;
        Ok((self.claim(request).await?, None))
    }

    /// Stores that a step begins (`step.result` `None`: an at-most-once step, before it runs)
    /// or its result, and keeps the operation's steps for `step.retention` from now (one out of
    /// range is [`Error::InvalidConfig`], [`StepWrite::check`]). Fenced as `complete`: only while the
    /// operation's record is in progress and carries the claim's token, else
    /// [`Error::LeaseLost`]. A step that already has a result keeps it (`Ok`, the first result
    /// stands), so a write repeated after a lost answer is harmless.
    /// [`Error::StepsUnsupported`], the default, for a store that keeps no steps.
    async fn write_step(&self, claim: &Claim, step: StepWrite<'_>) -> Result<(), Error> {
        let _ = (claim, step);
        Err(Error::StepsUnsupported)
    }

    /// Up to `query.limit` abandoned operations (see [`Abandoned`]: their steps keep an input, they
    /// ran through [`Call::run_steps_with`](crate::Call::run_steps_with); no claim holds them,
    /// their record being gone or in progress past its lease; not completed; their latest
    /// attempt not marked failed), with keys greater than `query.after` (all when `None`), by
    /// key: what a [`Completer`](crate::Completer) finishes. A caller pages through them by passing the
    /// last key it got; a page shorter than `query.limit` is the last. A read only: it claims
    /// nothing, so an operation found may be claimed by anyone before the caller claims it.
    /// [`Error::CompleterUnsupported`], the default, for a store that cannot look them up.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Abandoned, AbandonedQuery, Key, MemoryStore, ManualClock, ClaimOutcome, ClaimRequest};
    /// use idem::{StepWrite, Store, INPUT_STEP};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let clock = ManualClock::new();
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let key = Key::derive("rides", "", "r-1")?;
    /// let day = Duration::from_secs(86_400);
    /// let ClaimOutcome::Claimed(claim) = store.claim(ClaimRequest::new(&key, Duration::from_secs(30))).await? else { unreachable!() };
    /// store.begin_steps(&claim, day).await?;
    /// let input = Abandoned::encode_input("rides", b"{}");
    /// store.write_step(&claim, StepWrite { name: INPUT_STEP, position: i32::MAX as u32, result: Some(&input), retention: day, on_lapse: None }).await?;
    /// let first_page = AbandonedQuery::first(10);
    /// assert!(store.find_abandoned(first_page).await?.is_empty()); // its lease runs
    /// clock.advance(Duration::from_secs(31)); // the holder died
    /// let found = store.find_abandoned(first_page).await?;
    /// assert_eq!((found[0].key, found[0].scope.as_str()), (key, "rides"));
    /// # Ok(()) }
    /// ```
    async fn find_abandoned(&self, query: AbandonedQuery<'_>) -> Result<Vec<Abandoned>, Error> {
        let _ = query;
        Err(Error::CompleterUnsupported)
    }

    /// Takes over the uncertain operation of `key` (see [`OnLapse::Uncertain`](crate::OnLapse::Uncertain)) to resolve it:
    /// only while its record is a claim made with `OnLapse::Uncertain`, still carrying `token`,
    /// whose lease has ended (database time) with no completion. The record then carries a new
    /// token and a lease of `lease` from now, and stays uncertain on lapse; the caller resolves
    /// it through the returned claim: `complete` (completed, or abandoned through an engine),
    /// `abort` (failed: the key frees), or lets it lapse again (still unknown). Anything else is
    /// [`Error::NotUncertain`] and changes nothing: a live lease (its holder is back), another
    /// token (another resolution reached it first), a completed, absent or ordinary record.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Completion, Key, ManualClock, MemoryStore, OnLapse, ClaimOutcome, ClaimRequest, Store};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let clock = ManualClock::new();
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let key = Key::derive("charge", "", "c-1")?;
    /// let lease = Duration::from_secs(30);
    /// let request = ClaimRequest::new(&key, lease).on_lapse(OnLapse::Uncertain);
    /// let ClaimOutcome::Claimed(holder) = store.claim(request).await? else { unreachable!() };
    /// clock.advance(Duration::from_secs(31)); // the holder died mid-charge
    /// assert!(matches!(store.claim(request).await?, ClaimOutcome::Uncertain { .. }));
    /// let ops = store.find_uncertain(idem::AbandonedQuery::first(10)).await?;
    /// let resolver = store.take_uncertain(&key, ops[0].token, lease).await?;
    /// // A second resolver, fenced by the same token, is refused.
    /// assert!(store.take_uncertain(&key, ops[0].token, lease).await.is_err());
    /// store.complete(&resolver, Completion::new(Some(b"charged"), Duration::from_secs(60))).await?;
    /// assert!(matches!(store.claim(request).await?, ClaimOutcome::Completed(_)));
    /// # let _ = holder; Ok(()) }
    /// ```
    async fn take_uncertain(
        &self,
        key: &Key,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, Error>;

    /// Up to `query.limit` uncertain operations (claims made with [`OnLapse::Uncertain`](crate::OnLapse::Uncertain) whose
    /// lease ended with no completion), with keys greater than `query.after`, by key: what
    /// `idem uncertain` lists and a reconciler resolves. A read only.
    async fn find_uncertain(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<UncertainOperation>, Error>;

    /// This store's claim and completion as plain function calls, if it answers them without
    /// waiting (an in-process store such as [`MemoryStore`](crate::MemoryStore)); `None`, the
    /// default, for a store that does I/O. The engine then calls them directly: no future boxed,
    /// and nothing to finish after a caller that goes away, since a call that never waits cannot
    /// be left half done. They must keep every rule of [`claim`](Self::claim) and
    /// [`complete`](Self::complete) (the conformance suite checks the engine's calls too). A
    /// store that wraps another returns the inner store's only if it changes neither `start`
    /// nor `complete`, which the engine would otherwise bypass ([`Forward::immediate`]).
    ///
    /// ```
    /// use idem::{MemoryStore, Store};
    /// assert!(MemoryStore::new().immediate().is_some());
    /// ```
    fn immediate(&self) -> Option<&dyn Immediate> {
        None
    }
}

/// The claim and completion of a store that answers without waiting: see
/// [`Store::immediate`]. Each does what the [`Store`] method of the same name does, at once.
///
/// ```
/// use std::time::Duration;
/// use idem::{Key, MemoryStore, ClaimOutcome, ClaimRequest, Store};
/// let store = MemoryStore::new();
/// let now = store.immediate().expect("the memory store answers at once");
/// let key = Key::derive("s", "", "k")?;
/// let request = ClaimRequest::new(&key, Duration::from_secs(30));
/// assert!(matches!(now.claim_now(request)?, ClaimOutcome::Claimed(_)));
/// # Ok::<(), idem::Error>(())
/// ```
pub trait Immediate: Send + Sync {
    /// [`Store::claim`], done at once.
    fn claim_now(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error>;

    /// [`Store::complete`], done at once.
    fn complete_now(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error>;
}

/// Calls the macro `$then` with the [`Store`]'s async methods, one line each: its
/// [`Operation`](forward::Operation), then its signature without `&self`. The impls that forward
/// every method (`Arc<S>`'s below, [`Forwarding`]'s) are written from this one list, so a method
/// the trait gains is forwarded by all of them.
macro_rules! store_methods {
    ($then:ident) => {
        $then! {
            Claim: fn claim(request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error>;
            Complete: fn complete(claim: &Claim, completion: Completion<'_>) -> Result<(), Error>;
            Abort: fn abort(claim: &Claim) -> Result<(), Error>;
            Renew: fn renew(claim: &Claim, lease: Duration) -> Result<(), Error>;
            Get: fn get(key: &Key) -> Result<Option<Record>, Error>;
            Evict: fn evict(key: &Key) -> Result<bool, Error>;
            Prune: fn prune_expired(limit: u32) -> Result<u64, Error>;
            BeginSteps: fn begin_steps(claim: &Claim, retention: Duration) -> Result<StepLog, Error>;
            WriteStep: fn write_step(claim: &Claim, step: StepWrite<'_>) -> Result<(), Error>;
            FindAbandoned: fn find_abandoned(query: AbandonedQuery<'_>) -> Result<Vec<Abandoned>, Error>;
            TakeUncertain: fn take_uncertain(key: &Key, token: Token, lease: Duration) -> Result<Claim, Error>;
            FindUncertain: fn find_uncertain(query: AbandonedQuery<'_>) -> Result<Vec<UncertainOperation>, Error>;
        }
    };
}

/// Writes a `Store` impl for `Arc<S>` whose every method forwards to the store inside (the
/// async ones `store_methods!` lists, `prune_batch_size`, `max_response_bytes` and `immediate`).
macro_rules! forward_to_inner {
    ($($op:ident: fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        #[async_trait]
        impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
            $(
                async fn $name(&self $(, $arg: $ty)*) -> $ret {
                    (**self).$name($($arg),*).await
                }
            )*

            // Not in `store_methods!`: a `Forwarding` wrapper keeps the trait's default, so
            // that its own `claim` and `begin_steps` run; an `Arc` is the store itself.
            async fn claim_steps(
                &self,
                request: ClaimRequest<'_>,
                retention: Duration,
            ) -> Result<(ClaimOutcome, Option<StepLog>), Error> {
                (**self).claim_steps(request, retention).await
            }

            fn prune_batch_size(&self) -> u32 {
                (**self).prune_batch_size()
            }

            fn max_response_bytes(&self) -> Option<usize> {
                (**self).max_response_bytes()
            }

            fn immediate(&self) -> Option<&dyn Immediate> {
                (**self).immediate()
            }
        }
    };
}

store_methods!(forward_to_inner);

// After `store_methods!`, which it uses.
mod forward;
pub use forward::{Forward, Forwarding, Operation};
#[cfg(feature = "encryption")]
pub(crate) mod encrypted;

/// How many expired records a pruner deletes per batch unless its store or its config says
/// otherwise ([`PrunerConfig::DEFAULT_BATCH_SIZE`](crate::PrunerConfig::DEFAULT_BATCH_SIZE)):
/// defined with the stores, which size their batches, so that they need nothing of the pruner.
pub(crate) const DEFAULT_PRUNE_BATCH_SIZE: u32 = 100;

/// How long a store keeps a claim whose lease ended and that nobody took over, so that its
/// holder can still complete it: one day.
///
/// A lease ending does not end the work: a holder whose store was unreachable for longer than
/// its lease (a server restarted, a network cut) still has the answer it gave its caller, and the
/// engine retries the completion in the background. While nobody else has claimed the key, the
/// record still carries the holder's token, and completing it is safe; so every store keeps a
/// lapsed claim this long before [`Store::prune_expired`] (or the backend's own expiry, on Redis
/// and DynamoDB) deletes it. The next `start` of the key takes a lapsed claim over at once, as
/// before: keeping it only costs space. The engine stops retrying a completion after this long
/// (or after the result's retention, if shorter).
///
/// ```
/// assert_eq!(idem::LAPSED_CLAIMS_KEPT.as_secs(), 24 * 60 * 60);
/// ```
pub const LAPSED_CLAIMS_KEPT: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);

/// [`LAPSED_CLAIMS_KEPT`] in milliseconds, as the stores' statements and scripts take it.
pub const LAPSED_CLAIMS_KEPT_MS: i64 = LAPSED_CLAIMS_KEPT.as_millis() as i64;

/// Rejects a zero or absurd lease/retention before it reaches a store.
pub fn check_duration(what: &str, d: Duration) -> Result<(), Error> {
    // Ten years in milliseconds still fits comfortably in an i64 of milliseconds.
    const MAX: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
    if d < Duration::from_millis(1) || d > MAX {
        return Err(Error::InvalidConfig(format!(
            "{what} must be between 1 ms and 10 years, got {d:?}"
        )));
    }
    Ok(())
}

/// The fingerprint rule: a live record whose fingerprint is of another request than the given
/// one (both present, [`Fingerprint::same_request`] false) refuses the call, with
/// [`Error::PolicyChanged`] when their policy versions differ too, else [`Error::KeyReused`].
///
/// ```
/// use idem::store::support::check_fingerprint;
/// use idem::{Error, Fingerprint};
/// let (a, b) = (Fingerprint::of_bytes(b"a"), Fingerprint::of_bytes(b"b"));
/// assert!(check_fingerprint(Some(&a), Some(&a.with_policy(2))).is_ok());
/// assert!(matches!(check_fingerprint(Some(&a), Some(&b)), Err(Error::KeyReused)));
/// let changed = check_fingerprint(Some(&a), Some(&b.with_policy(2)));
/// assert!(matches!(changed, Err(Error::PolicyChanged { stored: 0, current: 2 })));
/// ```
pub fn check_fingerprint(
    stored: Option<&Fingerprint>,
    given: Option<&Fingerprint>,
) -> Result<(), Error> {
    match (stored, given) {
        (Some(stored), Some(given)) if !stored.same_request(given) => {
            if stored.policy() != given.policy() {
                Err(Error::PolicyChanged {
                    stored: stored.policy(),
                    current: given.policy(),
                })
            } else {
                Err(Error::KeyReused)
            }
        }
        _ => Ok(()),
    }
}
