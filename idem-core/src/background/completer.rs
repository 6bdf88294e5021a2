//! The completer: a background task that finishes operations abandoned past their lease, by
//! claiming each through the engine and running the handler registered for its scope with its
//! stored input (docs/steps.md, "Completer").

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{stop_requested, Background, Lease, RecordsLease};
use crate::codec::{Codec, JsonCodec};
use crate::engine::{renewing, Idempotency, OnLocked, Outcome, Reconciled, Resolution, Steps};
use crate::error::Error;
use crate::key::Key;
use crate::record::UncertainOperation;
use crate::step::{Abandoned, AbandonedQuery};
use crate::store::check_duration;

/// The reserved key of the completers' lease, a record of the store itself.
fn completer_lease_key() -> Result<Key, Error> {
    Ok(Key::derive("idem.completer", "", "operations")?)
}

/// How a [`Completer`] runs: pages of at most [`batch_size`](Self::batch_size) abandoned
/// operations, [`concurrency`](Self::concurrency) of them driven at once, paced to a
/// [`share`](Self::share) of the time, a run every [`interval`](Self::interval), under a
/// [`lease`](Self::lease) so that one node completes at a time.
///
/// ```
/// use std::time::Duration;
/// use idem::CompleterConfig;
/// let config = CompleterConfig::new()
///     .batch_size(200)
///     .concurrency(32)
///     .interval(Duration::from_secs(5))
///     .lease(Duration::from_secs(30));
/// # let _ = config;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CompleterConfig {
    batch_size: u32,
    concurrency: usize,
    share: f64,
    interval: Duration,
    lease: Duration,
    max_batches: Option<u32>,
}

impl CompleterConfig {
    /// The defaults: pages of 100 operations, 16 driven at once, half of the time (a pause as
    /// long as a page took after each full page), a run every 10 s, a 60 s lease, no cap on
    /// pages per run.
    ///
    /// ```
    /// assert_eq!(idem::CompleterConfig::new(), idem::CompleterConfig::default());
    /// ```
    pub fn new() -> CompleterConfig {
        CompleterConfig {
            batch_size: 100,
            concurrency: 16,
            share: 0.5,
            interval: Duration::from_secs(10),
            lease: Duration::from_secs(60),
            max_batches: None,
        }
    }

    /// The most operations one page finds (1 to 10,000).
    ///
    /// ```
    /// let _ = idem::CompleterConfig::new().batch_size(500);
    /// ```
    pub fn batch_size(mut self, batch_size: u32) -> CompleterConfig {
        self.batch_size = batch_size;
        self
    }

    /// How many operations of a page are driven at once (1 to 10,000), each in a task of its
    /// own: each holds a claim and a connection while its handler runs.
    ///
    /// ```
    /// let _ = idem::CompleterConfig::new().concurrency(4);
    /// ```
    pub fn concurrency(mut self, concurrency: usize) -> CompleterConfig {
        self.concurrency = concurrency;
        self
    }

    /// The largest share of the time (above 0, at most 1) a run spends driving pages: after a
    /// full page that took `t` it waits `t × (1 − share) / share` (at most a quarter of the
    /// lease). 1 drives the pages back to back.
    ///
    /// ```
    /// let _ = idem::CompleterConfig::new().share(1.0);
    /// ```
    pub fn share(mut self, share: f64) -> CompleterConfig {
        self.share = share;
        self
    }

    /// The time between the starts of two runs of a [spawned](Completer::spawn) completer. An
    /// operation abandoned just after a run started waits up to its lease plus this long
    /// (plus the run's own time) to be found: keep it well under the operations' lease to
    /// finish them within two leases.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem::CompleterConfig::new().interval(Duration::from_secs(2));
    /// ```
    pub fn interval(mut self, interval: Duration) -> CompleterConfig {
        self.interval = interval;
        self
    }

    /// The completers' lease (1 ms to 10 years): a run takes it, renews it before each page and
    /// every third of its length while a page runs, and releases it at the end, so of any
    /// number of completers on one store one runs at a time, and another takes over within this
    /// long of one that died.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem::CompleterConfig::new().lease(Duration::from_secs(20));
    /// ```
    pub fn lease(mut self, lease: Duration) -> CompleterConfig {
        self.lease = lease;
        self
    }

    /// Stops a run after this many pages (at least 1), leaving the rest to the next run.
    ///
    /// ```
    /// let _ = idem::CompleterConfig::new().max_batches(10);
    /// ```
    pub fn max_batches(mut self, max_batches: u32) -> CompleterConfig {
        self.max_batches = Some(max_batches);
        self
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::InvalidConfig(what));
        if !(1..=10_000).contains(&self.batch_size) {
            return bad(format!(
                "completer batch_size must be 1 to 10000, got {}",
                self.batch_size
            ));
        }
        if !(1..=10_000).contains(&self.concurrency) {
            return bad(format!(
                "completer concurrency must be 1 to 10000, got {}",
                self.concurrency
            ));
        }
        if !(self.share > 0.0 && self.share <= 1.0) {
            return bad(format!(
                "completer share must be above 0 and at most 1, got {}",
                self.share
            ));
        }
        if self.max_batches == Some(0) {
            return bad("completer max_batches must be at least 1".into());
        }
        check_duration("completer interval", self.interval)?;
        check_duration("completer lease", self.lease)
    }
}

impl Default for CompleterConfig {
    fn default() -> Self {
        CompleterConfig::new()
    }
}

/// What one completer run did.
///
/// ```
/// let report = idem::CompleteReport::default();
/// assert_eq!(report.completed, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompleteReport {
    /// Abandoned operations found.
    pub found: u64,
    /// Found operations whose handler ran to its end in this run (their result is stored).
    pub completed: u64,
    /// Found operations that had completed meanwhile (a client's retry got there first): their
    /// stored result was replayed, nothing ran.
    pub replayed: u64,
    /// Found operations claimed by someone else meanwhile (a client's retry): left to them.
    pub busy: u64,
    /// Found operations whose scope has no handler here: left as they are.
    pub unhandled: u64,
    /// Found operations whose handler failed (its claim was released, so a retry resumes it);
    /// each is logged (`WARN`).
    pub failed: u64,
    /// Uncertain operations found (claims made with `OnLapse::Uncertain` that lapsed), when a
    /// [reconciler](Completer::reconciler) is registered.
    pub uncertain: u64,
    /// Uncertain operations a reconciler found completed: completed with its result.
    pub reconciled: u64,
    /// Uncertain operations a reconciler found failed: their keys freed for the next retry.
    pub reconciled_failed: u64,
    /// Uncertain operations left uncertain: the reconciler could not tell, failed, or the
    /// operation has no stored input or no reconciler for its scope (each needs an operator:
    /// `idem uncertain`).
    pub still_uncertain: u64,
    /// Pages read.
    pub batches: u32,
    /// Another completer held the lease, so this run did nothing.
    pub skipped: bool,
    /// The last page came back short: nothing abandoned was left unseen.
    pub drained: bool,
    /// How long the run took.
    pub elapsed: Duration,
}

/// What driving one operation came to.
enum Driven {
    Completed,
    Replayed,
    Busy,
    Failed,
    /// An uncertain operation, as its reconciler found it (or left it).
    Reconciled(Verdict),
}

/// What reconciling one uncertain operation came to.
#[derive(Clone, Copy)]
enum Verdict {
    Completed,
    Failed,
    StillUncertain,
}

/// A registered reconciler, typed away: asks the provider about one uncertain operation (its
/// key and stored input), and answers with the result encoded by the engine's codec.
type Reconcile<C> = Arc<
    dyn Fn(
            Idempotency<C>,
            Key,
            Vec<u8>,
        ) -> Pin<Box<dyn Future<Output = Result<Reconciled<Vec<u8>>, Error>> + Send>>
        + Send
        + Sync,
>;

/// What one page holds: abandoned operations to finish, or uncertain ones to reconcile.
enum Job {
    Abandoned(Abandoned),
    Uncertain(UncertainOperation),
}

impl Job {
    fn key(&self) -> Key {
        match self {
            Job::Abandoned(op) => op.key,
            Job::Uncertain(op) => op.key,
        }
    }
}

/// Which operations a run pages through.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Abandoned,
    Uncertain,
}

type BoxFuture = Pin<Box<dyn Future<Output = Driven> + Send>>;

/// A registered handler, typed away: drives one abandoned operation through `engine`.
type Drive<C> = Arc<dyn Fn(Idempotency<C>, Abandoned) -> BoxFuture + Send + Sync>;

/// Finishes operations abandoned past their lease (their holder died, and no client retried):
/// a background task run like the [`Pruner`](crate::Pruner), one node at a time under a lease
/// (a record of the store itself, under the reserved key
/// `Key::derive("idem.completer", "", "operations")`), in bounded, paced pages.
///
/// A run takes the lease (or reports [`skipped`](CompleteReport::skipped)), pages through the
/// store's [`find_abandoned`](crate::Store::find_abandoned) (operations in progress past their
/// lease whose steps keep an input: they ran through
/// [`Call::run_steps_with`](crate::Call::run_steps_with)), and drives each through the engine
/// with the handler registered for its scope: `engine.call(key).run_steps_with(scope, input,
/// |steps| handler(steps, input))`. That claim is a takeover like any retry's (attempt n + 1,
/// fenced), never a write of the completer's own: a client retrying at the same moment either
/// wins the claim (the completer counts the operation [`busy`](CompleteReport::busy)) or meets
/// the completer's claim as it would another retry's. The handler replays the finished steps
/// and runs the rest; its result is stored and replays to any later retry.
///
/// The store must find abandoned operations ([`Error::CompleterUnsupported`] otherwise, from
/// [`run_once`](Self::run_once)): the memory, SQLite, PostgreSQL, Redis and DynamoDB stores
/// do; `RemoteStore` does not.
///
/// ```
/// use std::time::Duration;
/// use idem::{Completer, CompleterConfig, Error, Idempotency, Key, ManualClock, MemoryStore, Steps};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let clock = ManualClock::new();
/// let engine = Idempotency::new(MemoryStore::with_clock(clock.clone()));
///
/// // The operation, shared by the client's call and the completer's handler.
/// async fn ride(steps: Steps, input: Vec<u8>) -> Result<String, Error> {
///     let from = String::from_utf8_lossy(&input).into_owned();
///     let ride: String = steps.run("create ride", || async { Ok::<_, Error>(format!("ride from {from}")) }).await?;
///     steps.run("charge", || async { Ok::<_, Error>(ride.clone() + ", charged") }).await
/// }
///
/// // A client that goes away inside its second step (its caller cancelled, or its process
/// // died: then its claim is not released, and the operation waits out its lease).
/// let key = Key::derive("rides", "rider-7", "req-1")?;
/// let client = engine.call(key).run_steps_with("rides", b"home".to_vec(), |steps| async move {
///     steps.run("create ride", || async { Ok::<_, Error>("ride from home".to_owned()) }).await?;
///     std::future::pending::<Result<String, Error>>().await
/// });
/// let _ = tokio::time::timeout(Duration::from_millis(10), client).await;
/// clock.advance(Duration::from_secs(120)); // past any lease
///
/// let completer = Completer::new(engine.clone(), CompleterConfig::new())?.handler("rides", ride);
/// let report = completer.run_once().await?;
/// assert_eq!((report.found, report.completed), (1, 1));
/// // A retry now replays what the completer stored.
/// let again = engine.call(key).run_steps_with("rides", b"home".to_vec(), |steps| ride(steps, b"home".to_vec())).await?;
/// assert_eq!(again.into_inner(), "ride from home, charged");
/// # Ok(()) }
/// ```
pub struct Completer<C = JsonCodec> {
    engine: Idempotency<C>,
    config: CompleterConfig,
    handlers: HashMap<String, Drive<C>>,
    /// Shared with the tasks that reconcile, which learn an operation's scope only once they
    /// hold it.
    reconcilers: Arc<HashMap<String, Reconcile<C>>>,
}

impl<C> Clone for Completer<C> {
    fn clone(&self) -> Self {
        Completer {
            engine: self.engine.clone(),
            config: self.config.clone(),
            handlers: self.handlers.clone(),
            reconcilers: self.reconcilers.clone(),
        }
    }
}

impl<C> fmt::Debug for Completer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut scopes: Vec<&String> = self.handlers.keys().collect();
        scopes.sort();
        let mut reconciled: Vec<&String> = self.reconcilers.keys().collect();
        reconciled.sort();
        f.debug_struct("Completer")
            .field("config", &self.config)
            .field("scopes", &scopes)
            .field("reconciled", &reconciled)
            .finish_non_exhaustive()
    }
}

impl<C: Codec> Completer<C> {
    /// A completer of `engine`'s store, claiming through `engine` (its policy's lease and
    /// retention), with no handler yet. Checks `config`; otherwise [`Error::InvalidConfig`].
    ///
    /// ```
    /// use idem::{Completer, CompleterConfig, Error, Idempotency, MemoryStore};
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let bad = Completer::new(engine, CompleterConfig::new().batch_size(0));
    /// assert!(matches!(bad, Err(Error::InvalidConfig(_))));
    /// ```
    pub fn new(engine: Idempotency<C>, config: CompleterConfig) -> Result<Completer<C>, Error> {
        config.validate()?;
        Ok(Completer {
            engine,
            config,
            handlers: HashMap::new(),
            reconcilers: Arc::default(),
        })
    }

    /// Registers `reconcile` for the uncertain operations stored under `scope` (claims made
    /// with [`OnLapse::Uncertain`](crate::OnLapse::Uncertain) that lapsed with no result, which
    /// ran through [`Call::run_steps_with`](crate::Call::run_steps_with) and so keep their
    /// input), in place of any earlier one. Each run, after finishing abandoned operations,
    /// pages through the store's uncertain operations and, for each of this scope, takes it
    /// over (fenced by its lapsed claim's token: an operator or another completer resolving it
    /// at the same moment wins or loses whole), and calls `reconcile` with the operation's key
    /// and stored input, its claim renewed meanwhile. `reconcile` asks the provider what
    /// happened (by the key it was given, [`Key::provider_key`]) and answers:
    ///
    /// - [`Reconciled::Completed`]: the operation completes with this result (the type the
    ///   client's work returns), and every retry replays it;
    /// - [`Reconciled::Failed`]: its key is freed, and the next retry runs it;
    /// - [`Reconciled::Unknown`] (or an `Err`): it is left uncertain, for the next run or an
    ///   operator (`idem uncertain`).
    ///
    /// Operations without a stored input, or of a scope without a reconciler, are left
    /// uncertain (counted in [`still_uncertain`](CompleteReport::still_uncertain)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Completer, CompleterConfig, Error, Idempotency, Key, ManualClock, MemoryStore};
    /// use idem::{OnLapse, Reconciled};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let clock = ManualClock::new();
    /// let engine = Idempotency::new(MemoryStore::with_clock(clock.clone()));
    /// let key = Key::derive("charges", "", "c-1")?;
    /// // A client dies inside the charge: its claim lapses, and the key is uncertain.
    /// let client = engine.call(key).on_lapse(OnLapse::Uncertain).run_steps_with(
    ///     "charges",
    ///     b"4200".to_vec(),
    ///     |steps| async move { std::future::pending::<Result<String, Error>>().await },
    /// );
    /// let _ = tokio::time::timeout(Duration::from_millis(10), client).await;
    /// tokio::task::yield_now().await; // its claim is given up, uncertain (a died process's lapses)
    /// clock.advance(Duration::from_secs(120));
    ///
    /// // The provider, asked by the operation's provider key, says the charge went through.
    /// let completer = Completer::new(engine.clone(), CompleterConfig::new())?
    ///     .reconciler("charges", |key: Key, input: Vec<u8>| async move {
    ///         let _asked_for = key.provider_key(Some("charge"));
    ///         Ok::<_, Error>(Reconciled::Completed(format!("charged {}", String::from_utf8_lossy(&input))))
    ///     });
    /// let report = completer.run_once().await?;
    /// assert_eq!((report.uncertain, report.reconciled), (1, 1));
    /// let retry = engine.call(key).run(async { Ok::<_, Error>("charged twice".to_owned()) }).await?;
    /// assert_eq!(retry.into_inner(), "charged 4200");
    /// # Ok(()) }
    /// ```
    pub fn reconciler<T, R, F>(mut self, scope: &str, reconcile: R) -> Completer<C>
    where
        R: Fn(Key, Vec<u8>) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Reconciled<T>, Error>> + Send + 'static,
        T: Serialize + Send + 'static,
    {
        let reconcile = Arc::new(reconcile);
        let typed: Reconcile<C> = Arc::new(move |engine: Idempotency<C>, key, input| {
            let asked = reconcile(key, input);
            Box::pin(async move {
                Ok(match asked.await? {
                    Reconciled::Completed(value) => {
                        Reconciled::Completed(engine.codec().encode(&value).map_err(Error::Codec)?)
                    }
                    Reconciled::Failed => Reconciled::Failed,
                    Reconciled::Unknown => Reconciled::Unknown,
                })
            })
        });
        Arc::make_mut(&mut self.reconcilers).insert(scope.to_owned(), typed);
        self
    }

    /// Registers `handler` for the operations stored under `scope` (the `scope` given to
    /// [`Call::run_steps_with`](crate::Call::run_steps_with)), in place of any earlier one. It
    /// receives the operation's [`Steps`] and its stored input, and must run the same steps as
    /// the client's work and return the same type: its result is stored as the operation's and
    /// replayed to the client's retry. An `Err` releases the operation's claim (its finished
    /// steps are kept); the completer logs it and tries again when it finds the operation
    /// abandoned again, which it will not be until a claim of it dies again.
    ///
    /// ```
    /// use idem::{Completer, CompleterConfig, Error, Idempotency, MemoryStore, Steps};
    /// async fn receipt(steps: Steps, input: Vec<u8>) -> Result<usize, Error> {
    ///     steps.run("send", || async { Ok::<_, Error>(input.len()) }).await
    /// }
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let completer = Completer::new(engine, CompleterConfig::new())?.handler("receipts", receipt);
    /// # let _ = completer;
    /// # Ok::<(), Error>(())
    /// ```
    pub fn handler<T, H, F>(mut self, scope: &str, handler: H) -> Completer<C>
    where
        H: Fn(Steps<C>, Vec<u8>) -> F + Send + Sync + 'static,
        F: Future<Output = Result<T, Error>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let handler = Arc::new(handler);
        let drive: Drive<C> = Arc::new(move |engine: Idempotency<C>, op: Abandoned| {
            let handler = handler.clone();
            Box::pin(async move {
                let Abandoned { key, scope, input } = op;
                let given = input.clone();
                let out = engine
                    .call(key)
                    .on_locked(OnLocked::FailFast)
                    .run_steps_with(&scope, given, move |steps| handler(steps, input))
                    .await;
                match out {
                    Ok(Outcome::Fresh(_)) => Driven::Completed,
                    Ok(Outcome::Replayed(_)) => Driven::Replayed,
                    Err(Error::Locked { .. }) => Driven::Busy,
                    Err(e) => {
                        tracing::warn!(
                            scope = scope.as_str(),
                            key = ?key,
                            error = %e,
                            "the completer's handler failed; the operation's claim is released"
                        );
                        Driven::Failed
                    }
                }
            }) as BoxFuture
        });
        self.handlers.insert(scope.to_owned(), drive);
        self
    }

    /// Runs once now: takes the lease (or reports [`skipped`](CompleteReport::skipped)),
    /// drives every abandoned operation found page by page, pausing after each full page, and
    /// releases the lease. A handler's failure is counted, not returned; a store error stops
    /// the run and is returned ([`Error::CompleterUnsupported`] from a store that cannot find
    /// abandoned operations). See [`Completer`] for an example.
    pub async fn run_once(&self) -> Result<CompleteReport, Error> {
        let mut report = CompleteReport::default();
        self.run(None, &mut report).await?;
        Ok(report)
    }

    /// Runs in a tokio task (call it inside a runtime): once now and then every
    /// [`interval`](CompleterConfig::interval), until [`CompleterHandle::shutdown`] or the
    /// handle is dropped. A failed run is logged (`tracing`, `WARN`) and the next interval
    /// tries again.
    ///
    /// ```
    /// use idem::{Completer, CompleterConfig, Idempotency, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let mut handle = Completer::new(engine, CompleterConfig::new())?.spawn();
    /// assert_eq!(handle.next_report().await.map(|r| r.found), Some(0));
    /// handle.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn spawn(self) -> CompleterHandle {
        CompleterHandle::spawn(self)
    }

    async fn run(
        &self,
        stop: Option<&mut watch::Receiver<bool>>,
        report: &mut CompleteReport,
    ) -> Result<(), Error> {
        let started = Instant::now();
        let mut lease = RecordsLease::new(
            self.engine.store().clone(),
            completer_lease_key,
            self.config.lease,
        );
        if !lease.acquire().await? {
            report.skipped = true;
            tracing::debug!("another completer holds the lease; skipping this run");
            return Ok(());
        }
        let mut stop = stop;
        let mut outcome = self
            .pages(Pass::Abandoned, stop.as_deref_mut(), &mut lease, report)
            .await;
        if !self.reconcilers.is_empty() {
            // A store that cannot find abandoned operations (`RemoteStore`) may still find
            // uncertain ones: the reconcilers run there all the same.
            if matches!(outcome, Err(Error::CompleterUnsupported)) && self.handlers.is_empty() {
                outcome = Ok(());
            }
            if outcome.is_ok() {
                outcome = self.pages(Pass::Uncertain, stop, &mut lease, report).await;
            }
        }
        let released = lease.release().await;
        report.elapsed = started.elapsed();
        outcome?;
        released?;
        if report.uncertain > 0 {
            tracing::info!(
                uncertain = report.uncertain,
                reconciled = report.reconciled,
                reconciled_failed = report.reconciled_failed,
                still_uncertain = report.still_uncertain,
                "reconciled uncertain operations"
            );
        }
        if report.found > 0 {
            tracing::info!(
                found = report.found,
                completed = report.completed,
                replayed = report.replayed,
                busy = report.busy,
                unhandled = report.unhandled,
                failed = report.failed,
                elapsed_ms = report.elapsed.as_millis() as u64,
                "completed abandoned operations"
            );
        }
        Ok(())
    }

    async fn pages(
        &self,
        pass: Pass,
        mut stop: Option<&mut watch::Receiver<bool>>,
        lease: &mut RecordsLease,
        report: &mut CompleteReport,
    ) -> Result<(), Error> {
        let mut after: Option<Key> = None;
        loop {
            if stop.as_deref().is_some_and(stop_requested) {
                return Ok(());
            }
            // Taking the lease again renews it; failing means another completer took over
            // after ours ran out, so leave the rest to it.
            if report.batches > 0 && !lease.acquire().await? {
                tracing::warn!("completer lease lost midway; stopping this run");
                return Ok(());
            }
            let page_started = Instant::now();
            let query = AbandonedQuery {
                after: after.as_ref(),
                limit: self.config.batch_size,
            };
            let store = self.engine.store();
            let page: Vec<Job> = match pass {
                Pass::Abandoned => {
                    let page = store.find_abandoned(query).await?;
                    report.found += page.len() as u64;
                    page.into_iter().map(Job::Abandoned).collect()
                }
                Pass::Uncertain => {
                    let page = store.find_uncertain(query).await?;
                    report.uncertain += page.len() as u64;
                    page.into_iter().map(Job::Uncertain).collect()
                }
            };
            report.batches += 1;
            let full = page.len() >= self.config.batch_size as usize;
            after = page.last().map(Job::key);
            if !self.drive(page, lease, report).await {
                tracing::warn!("completer lease lost while driving a page; stopping this run");
                return Ok(());
            }
            if !full {
                report.drained |= pass == Pass::Abandoned;
                return Ok(());
            }
            if self
                .config
                .max_batches
                .is_some_and(|max| report.batches >= max)
            {
                return Ok(());
            }
            let took = page_started.elapsed();
            let pause = took
                .mul_f64((1.0 - self.config.share) / self.config.share)
                .min(self.config.lease / 4)
                .min(self.config.interval);
            if !pause.is_zero() {
                let sleep = tokio::time::sleep(pause);
                match stop.as_deref_mut() {
                    None => sleep.await,
                    Some(stop) => tokio::select! {
                        _ = sleep => {}
                        _ = stop.changed() => return Ok(()),
                    },
                }
            }
        }
    }

    /// Drives the operations of one page, [`concurrency`](CompleterConfig::concurrency) at a
    /// time, each in a task of its own, and counts how each went, renewing `lease` every third
    /// of its length meanwhile (a page of slow handlers may outlast it). Returns whether the
    /// lease is still held: when it is not, the page's operations still run to their end (each
    /// under its own claim), and the run stops after them.
    async fn drive(
        &self,
        page: Vec<Job>,
        lease: &mut RecordsLease,
        report: &mut CompleteReport,
    ) -> bool {
        let mut renewal = Renewal {
            lease,
            every: self.config.lease / 3,
            at: Instant::now() + self.config.lease / 3,
            held: true,
        };
        let mut tasks = JoinSet::new();
        let count = |driven: Option<Driven>, report: &mut CompleteReport| match driven {
            Some(Driven::Completed) => report.completed += 1,
            Some(Driven::Replayed) => report.replayed += 1,
            Some(Driven::Busy) => report.busy += 1,
            Some(Driven::Failed) => report.failed += 1,
            Some(Driven::Reconciled(Verdict::Completed)) => report.reconciled += 1,
            Some(Driven::Reconciled(Verdict::Failed)) => report.reconciled_failed += 1,
            Some(Driven::Reconciled(Verdict::StillUncertain)) => report.still_uncertain += 1,
            // The handler panicked (its claim was released by the engine).
            None => report.failed += 1,
        };
        for job in page {
            let task = match job {
                Job::Abandoned(op) => match self.handlers.get(&op.scope) {
                    Some(drive) => drive(self.engine.clone(), op),
                    None => {
                        tracing::debug!(
                            scope = op.scope.as_str(),
                            "no completer handler for this scope"
                        );
                        report.unhandled += 1;
                        continue;
                    }
                },
                Job::Uncertain(op) => {
                    Box::pin(reconcile(self.engine.clone(), op, self.reconcilers.clone()))
                        as BoxFuture
                }
            };
            while tasks.len() >= self.config.concurrency {
                if let Some(done) = renewal.next_done(&mut tasks).await {
                    count(done, report);
                }
            }
            tasks.spawn(task);
        }
        while let Some(done) = renewal.next_done(&mut tasks).await {
            count(done, report);
        }
        renewal.held
    }
}

/// Reconciles one uncertain operation: takes it over (fenced by its lapsed claim's token), reads
/// its scope and stored input, asks the scope's reconciler with the claim renewed, and settles
/// it as the reconciler says; an operation it cannot ask about is given back, still uncertain.
async fn reconcile<C: Codec>(
    engine: Idempotency<C>,
    op: UncertainOperation,
    reconcilers: Arc<HashMap<String, Reconcile<C>>>,
) -> Driven {
    let store = engine.store();
    let lease = engine.policy().lease();
    let claim = match store.take_uncertain(&op.key, op.token, lease).await {
        Ok(claim) => claim,
        // Resolved by someone else, or its holder came back: not ours.
        Err(Error::NotUncertain { .. }) => return Driven::Busy,
        Err(e) => {
            tracing::warn!(key = %op.key, error = %e, "taking over an uncertain operation failed");
            return Driven::Failed;
        }
    };
    let give_back = |why: &str, error: Option<&Error>| {
        tracing::warn!(key = %op.key, error = ?error, "an uncertain operation stays uncertain: {why}");
    };
    let asked = match engine.input_of(&claim).await {
        Ok(Some(Abandoned { scope, input, .. })) => match reconcilers.get(&scope) {
            Some(reconcile) => {
                let asking = reconcile(engine.clone(), op.key, input);
                renewing(&**store, &claim, lease, asking).await
            }
            None => Ok(Reconciled::Unknown),
        },
        Ok(None) => Ok(Reconciled::Unknown),
        Err(e) => Err(e),
    };
    let settled = match asked {
        Ok(Reconciled::Completed(result)) => engine
            .settle(&claim, Resolution::Completed(result))
            .await
            .map(|()| Verdict::Completed),
        Ok(Reconciled::Failed) => engine
            .settle(&claim, Resolution::Failed)
            .await
            .map(|()| Verdict::Failed),
        Ok(Reconciled::Unknown) => {
            give_back(
                "the provider could not tell, or there is no input or reconciler",
                None,
            );
            engine
                .put_back(&claim)
                .await
                .map(|()| Verdict::StillUncertain)
        }
        Err(e) => {
            give_back("the reconciler failed", Some(&e));
            engine
                .put_back(&claim)
                .await
                .map(|()| Verdict::StillUncertain)
        }
    };
    match settled {
        Ok(verdict) => Driven::Reconciled(verdict),
        // The takeover's lease ends by itself and the operation is uncertain again.
        Err(e) => {
            tracing::warn!(key = %op.key, error = %e, "settling an uncertain operation failed");
            Driven::Reconciled(Verdict::StillUncertain)
        }
    }
}

/// The renewal of a run's lease while a page's operations run.
struct Renewal<'l> {
    lease: &'l mut RecordsLease,
    every: Duration,
    /// When to renew next.
    at: Instant,
    /// Whether the lease is still held (a failed or refused renewal gives it up).
    held: bool,
}

impl Renewal<'_> {
    /// The next of `tasks` to end (`Some(None)` for one that panicked), renewing the lease when
    /// it is due meanwhile; `None` when no task is left.
    async fn next_done(&mut self, tasks: &mut JoinSet<Driven>) -> Option<Option<Driven>> {
        loop {
            tokio::select! {
                done = tasks.join_next() => return done.map(Result::ok),
                _ = tokio::time::sleep_until(self.at), if self.held => {
                    self.held = match self.lease.acquire().await {
                        Ok(held) => held,
                        Err(e) => {
                            tracing::warn!(error = %e, "renewing the completer lease failed");
                            false
                        }
                    };
                    self.at = Instant::now() + self.every;
                }
            }
        }
    }
}

/// Controls a [spawned](Completer::spawn) completer. Dropping it stops the completer too
/// (after the page in progress); [`shutdown`](CompleterHandle::shutdown) also waits for that.
///
/// ```
/// use idem::{Completer, CompleterConfig, Idempotency, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let mut handle = Completer::new(engine, CompleterConfig::new())?.spawn();
/// let first = handle.next_report().await;
/// assert_eq!(first, handle.last_report());
/// handle.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CompleterHandle(Background<CompleteReport>);

impl CompleterHandle {
    fn spawn<C: Codec>(completer: Completer<C>) -> CompleterHandle {
        CompleterHandle(Background::spawn(|mut stop_rx, report_tx| async move {
            let mut wait = Duration::ZERO;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    // A `true` sent or the handle dropped: stop either way.
                    _ = stop_rx.changed() => break,
                }
                let started = Instant::now();
                let mut report = CompleteReport::default();
                match completer.run(Some(&mut stop_rx), &mut report).await {
                    Ok(()) => {
                        report_tx.send_replace(Some(report));
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        found = report.found,
                        completed = report.completed,
                        "completing abandoned operations failed; trying again at the next interval"
                    ),
                }
                if stop_requested(&stop_rx) {
                    break;
                }
                wait = completer.config.interval.saturating_sub(started.elapsed());
            }
        }))
    }

    /// The report of the latest successful run, if any.
    ///
    /// ```
    /// use idem::{Completer, CompleterConfig, Idempotency, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let handle = Completer::new(Idempotency::new(MemoryStore::new()), CompleterConfig::new())?.spawn();
    /// assert_eq!(handle.last_report(), None); // the first run has not started yet
    /// # Ok(()) }
    /// ```
    pub fn last_report(&self) -> Option<CompleteReport> {
        self.0.last_report()
    }

    /// Waits for the next successful run and returns its report; `None` once the completer
    /// has stopped. See [`CompleterHandle`] for an example.
    pub async fn next_report(&mut self) -> Option<CompleteReport> {
        self.0.next_report().await
    }

    /// Stops the completer after the page in progress (a pause is cut short), lets it release
    /// its lease, and waits for it. A panic inside the completer task is resumed here. See
    /// [`CompleterHandle`] for an example.
    pub async fn shutdown(self) {
        self.0.shutdown().await
    }
}
