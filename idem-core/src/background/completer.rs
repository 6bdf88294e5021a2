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
use crate::engine::{Idempotency, OnLocked, Outcome, Steps};
use crate::error::Error;
use crate::key::Key;
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
}

impl<C> Clone for Completer<C> {
    fn clone(&self) -> Self {
        Completer {
            engine: self.engine.clone(),
            config: self.config.clone(),
            handlers: self.handlers.clone(),
        }
    }
}

impl<C> fmt::Debug for Completer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut scopes: Vec<&String> = self.handlers.keys().collect();
        scopes.sort();
        f.debug_struct("Completer")
            .field("config", &self.config)
            .field("scopes", &scopes)
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
        })
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
        let outcome = self.pages(stop, &mut lease, report).await;
        let released = lease.release().await;
        report.elapsed = started.elapsed();
        outcome?;
        released?;
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
            let page = self
                .engine
                .store()
                .find_abandoned(AbandonedQuery {
                    after: after.as_ref(),
                    limit: self.config.batch_size,
                })
                .await?;
            report.batches += 1;
            report.found += page.len() as u64;
            let full = page.len() >= self.config.batch_size as usize;
            after = page.last().map(|op| op.key);
            if !self.drive(page, lease, report).await {
                tracing::warn!("completer lease lost while driving a page; stopping this run");
                return Ok(());
            }
            if !full {
                report.drained = true;
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
        page: Vec<Abandoned>,
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
            // The handler panicked (its claim was released by the engine).
            None => report.failed += 1,
        };
        for op in page {
            let Some(drive) = self.handlers.get(&op.scope) else {
                tracing::debug!(
                    scope = op.scope.as_str(),
                    "no completer handler for this scope"
                );
                report.unhandled += 1;
                continue;
            };
            while tasks.len() >= self.config.concurrency {
                if let Some(done) = renewal.next_done(&mut tasks).await {
                    count(done, report);
                }
            }
            tasks.spawn(drive(self.engine.clone(), op));
        }
        while let Some(done) = renewal.next_done(&mut tasks).await {
            count(done, report);
        }
        renewal.held
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
