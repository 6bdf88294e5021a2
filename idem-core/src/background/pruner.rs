//! The pruner: it deletes what has expired, either idempotency records from any
//! [`Store`] or request ids from a kit `RequestHistory`, in
//! bounded batches, optionally paced and optionally under a lease so that one node prunes at a
//! time.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{records_lease_key, stop_requested, Background, Lease, RecordsLease};
use crate::error::Error;
use crate::store::{check_duration, Store};

/// The largest batch a pruner deletes in one call.
const MAX_BATCH_SIZE: u32 = 100_000;

/// A spawned pruner paced by cost starts its next run when about this many batches have
/// expired since the last one started.
const RUN_BATCHES: f64 = 4.0;

/// A pruner paced by cost that knows the rate entries expire at steps up when a run deletes
/// more slowly than this many times that rate (it would gain on its backlog too slowly).
const KEEP_AHEAD: f64 = 1.25;

/// How many times the configured batch size a pruner that has stepped up to its whole share may
/// delete in one batch.
const MAX_STEP_UP_BATCH: u32 = 16;

/// The shortest wait between two runs paced by cost.
const MIN_RUN_WAIT: Duration = Duration::from_millis(10);

/// How a [`Pruner`] runs: batches of at most [`batch_size`](PrunerConfig::batch_size) entries
/// (unless set, the store's [`prune_batch_size`](Store::prune_batch_size)), paced by what they
/// cost, in runs scheduled by how fast entries expire, under a [`lease`](PrunerConfig::lease)
/// unless [`without_lease`](PrunerConfig::without_lease).
///
/// **Paced by cost, not by a fixed pause (the default).** After a full batch the pruner waits
/// in proportion to how long that batch took, so that it holds the store for at most its
/// [`share`](PrunerConfig::share) of the time (20 % by default: a batch that took 2 ms is
/// followed by 8 ms for the claims). A cheap store is pruned fast and a loaded one gently, and
/// no pause caps the rate: the pruner deletes up to `share` of what the store can delete in a
/// second.
///
/// **Runs as often as entries expire.** A spawned pruner measures the rate at which entries
/// expired (what each run deleted over the time since the run before it ended) and starts the next
/// run when about four batches have expired again, at least 10 ms and at
/// most [`interval`](PrunerConfig::interval) later. After a run that found nothing it waits
/// twice as long as before (from 10 ms up to the interval), so an idle store is looked at
/// rarely and one that just got busy within about the time it has been idle.
///
/// **The steady-state bound.** While entries expire no faster than the pruner deletes at its
/// share of the store's time, the expired entries left in the store stay below about five
/// batches plus what expires during one run (500 plus a few milliseconds of expiries with the
/// defaults), whatever the rate.
///
/// **Steps up when it falls behind.** When a run deletes more slowly than 1.25 times the
/// measured rate (a store that slowed down under load: every statement then waits behind the
/// claims, and pausing four times that wait starves the pruner), or when a run has gone on
/// without draining the store for twice the wait the schedule chose before it (the rate was
/// measured low; before any rate is known, 5 s and then every 2 s), the pruner steps up one
/// step: its share doubles up to the whole of the time, then its batch doubles up to 16 times
/// `batch_size`. Each run that drains the store steps back one step. So the backlog stays
/// bounded as long as the store can delete, at full speed and in batches of 16 × `batch_size`,
/// faster than entries expire; the claims pay for it only while the pruner is behind. A
/// [`pause`](Self::pause) turns all of this off.
///
/// A fixed [`pause`](PrunerConfig::pause) restores the older pacing: that pause after every
/// full batch, and a run every `interval`, which caps the rate at `batch_size` per pause.
///
/// ```
/// use std::time::Duration;
/// use idem::PrunerConfig;
/// let config = PrunerConfig::new()
///     .batch_size(50)
///     .share(0.1)
///     .interval(Duration::from_secs(300))
///     .max_batches(1_000)
///     .lease(Duration::from_secs(30));
/// # let _ = config;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PrunerConfig {
    /// `None`: the target's own (see [`Pruner::batch_size`]); always `Some` in a [`Pruner`].
    batch_size: Option<u32>,
    /// A fixed pause after each full batch; `None` paces by cost.
    pause: Option<Duration>,
    share: f64,
    interval: Duration,
    max_batches: Option<u32>,
    lease: Option<Duration>,
}

impl PrunerConfig {
    /// Entries one batch deletes at most, by default: the default of
    /// [`Store::prune_batch_size`], which the memory and SQLite stores keep
    /// (`PostgresStore` says 1,000), and the batch size of a
    /// history pruner.
    ///
    /// ```
    /// assert_eq!(idem::PrunerConfig::DEFAULT_BATCH_SIZE, 100);
    /// ```
    pub const DEFAULT_BATCH_SIZE: u32 = crate::store::DEFAULT_PRUNE_BATCH_SIZE;

    /// The largest share of the time the pruner spends deleting while it catches up, by
    /// default.
    ///
    /// ```
    /// assert_eq!(idem::PrunerConfig::DEFAULT_SHARE, 0.2);
    /// ```
    pub const DEFAULT_SHARE: f64 = 0.2;

    /// The longest time between the starts of two runs, by default.
    ///
    /// ```
    /// assert_eq!(idem::PrunerConfig::DEFAULT_INTERVAL.as_secs(), 60);
    /// ```
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

    /// How long a run holds its lease without renewing it, by default.
    ///
    /// ```
    /// assert_eq!(idem::PrunerConfig::DEFAULT_LEASE.as_secs(), 60);
    /// ```
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

    /// The defaults: batches of the store's [size](Store::prune_batch_size)
    /// ([100](Self::DEFAULT_BATCH_SIZE) entries; 1,000 on PostgreSQL) paced to a
    /// [20 %](Self::DEFAULT_SHARE) share of the store's time, runs as often as entries expire
    /// and at least every [60 s](Self::DEFAULT_INTERVAL), no cap on batches per run (a run goes
    /// on until nothing expired is left), and a [60 s](Self::DEFAULT_LEASE) lease so that one
    /// pruner runs at a time.
    ///
    /// ```
    /// use idem::PrunerConfig;
    /// assert_eq!(PrunerConfig::new(), PrunerConfig::default());
    /// ```
    pub fn new() -> PrunerConfig {
        PrunerConfig {
            batch_size: None,
            pause: None,
            share: Self::DEFAULT_SHARE,
            interval: Self::DEFAULT_INTERVAL,
            max_batches: None,
            lease: Some(Self::DEFAULT_LEASE),
        }
    }

    /// The most entries one batch deletes (1 to 100,000), in place of the store's
    /// [`prune_batch_size`](Store::prune_batch_size). Smaller batches hold locks (SQLite: the
    /// database's only write lock) for less time; fewer, larger batches meet fewer claims. The
    /// stores' own sizes came from the sustained run (3,000 keys/s expiring;
    /// docs/performance.md, "The sustained run"): on SQLite, batches of 100 left the claims' p99
    /// as it was without pruning; on PostgreSQL, 100 raised it 1.45-2.2 × (six runs) and 1,000 by
    /// 1.07-1.30 × (three runs).
    ///
    /// ```
    /// use idem::{MemoryStore, Pruner, PrunerConfig};
    /// let pruner = Pruner::records(MemoryStore::new(), PrunerConfig::new().batch_size(500))?;
    /// assert_eq!(pruner.batch_size(), 500);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn batch_size(mut self, batch_size: u32) -> PrunerConfig {
        self.batch_size = Some(batch_size);
        self
    }

    /// The largest share of the time (above 0, at most 1) the pruner spends deleting while it
    /// catches up: after a batch that took `t`, it waits `t × (1 − share) / share`. 1 runs the
    /// batches back to back, which drains fastest but slows claims most. About this share of
    /// the claims meet a batch where a batch blocks them (SQLite: its only write lock): with a
    /// million scattered expired rows, SQLite's claim p99 was 8.3 × the p99 without pruning at the
    /// default 20 %, and 1.06 × at 1 %, which drained 20 times slower until the pruner stepped up
    /// (docs/performance.md, "A million expired rows on SQLite").
    ///
    /// ```
    /// // A SQLite service whose claims' tail matters more than a fast drain.
    /// let _ = idem::PrunerConfig::new().share(0.01);
    /// ```
    pub fn share(mut self, share: f64) -> PrunerConfig {
        self.share = share;
        self
    }

    /// A fixed pause after each full batch instead of pacing by cost, and a run every
    /// [`interval`](Self::interval) instead of as often as entries expire. It caps the rate at
    /// `batch_size` entries per pause; zero runs the batches back to back.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem::PrunerConfig::new().pause(Duration::from_millis(50));
    /// ```
    pub fn pause(mut self, pause: Duration) -> PrunerConfig {
        self.pause = Some(pause);
        self
    }

    /// The longest time between the starts of two runs of a [spawned](Pruner::spawn) pruner
    /// (1 ms to 10 years; with a fixed [`pause`](Self::pause), the time between them); a run
    /// that takes longer delays the next.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem::PrunerConfig::new().interval(Duration::from_secs(600));
    /// ```
    pub fn interval(mut self, interval: Duration) -> PrunerConfig {
        self.interval = interval;
        self
    }

    /// Ends a run after `max_batches` full batches even if expired entries remain; the next
    /// run goes on from there. Bounds how long one run takes when entries expire faster than
    /// the pace allows. By default a run has no cap.
    ///
    /// ```
    /// let _ = idem::PrunerConfig::new().max_batches(600);
    /// ```
    pub fn max_batches(mut self, max_batches: u32) -> PrunerConfig {
        self.max_batches = Some(max_batches);
        self
    }

    /// Runs under a lease of this length (1 ms to 10 years, longer than a fixed
    /// [pause](Self::pause); a paced pause is at most a quarter of it): a run first takes the lease, renews it before each batch and
    /// releases it at the end, so of any number of pruners (threads, processes, machines) on
    /// one store or history one works at a time and the others report
    /// [`skipped`](PruneReport::skipped). A crashed runner blocks the others for at most one
    /// lease. Make it longer than one batch plus one pause take.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem::PrunerConfig::new().lease(Duration::from_secs(10));
    /// ```
    pub fn lease(mut self, lease: Duration) -> PrunerConfig {
        self.lease = Some(lease);
        self
    }

    /// Runs without a lease: every pruner deletes whenever it runs. Safe (each batch is one
    /// bounded delete; PostgreSQL skips rows another pruner has locked), only redundant when
    /// several run; it saves the lease's statements when only one pruner exists.
    ///
    /// ```
    /// let _ = idem::PrunerConfig::new().without_lease();
    /// ```
    pub fn without_lease(mut self) -> PrunerConfig {
        self.lease = None;
        self
    }

    /// The batch size; set (by the user, or from the target by [`Pruner::new`]) in a pruner.
    fn batch(&self) -> u32 {
        self.batch_size.unwrap_or(Self::DEFAULT_BATCH_SIZE)
    }

    /// Refuses a setting out of range with [`Error::InvalidConfig`].
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if let Some(batch_size) = self.batch_size
            && !(1..=MAX_BATCH_SIZE).contains(&batch_size)
        {
            return Err(Error::InvalidConfig(format!(
                "pruner batch size must be 1 to {MAX_BATCH_SIZE}, got {batch_size}; \
                     leave it unset for the store's own (100; 1,000 on PostgreSQL)"
            )));
        }
        if self.max_batches == Some(0) {
            return Err(Error::InvalidConfig(
                "pruner max_batches must be at least 1; leave it unset for no cap".into(),
            ));
        }
        check_duration("pruner interval", self.interval)?;
        if !(self.share > 0.0 && self.share <= 1.0) {
            return Err(Error::InvalidConfig(format!(
                "pruner share must be above 0 and at most 1 (a fraction of the time), got {}; \
                 the default is {}",
                self.share,
                Self::DEFAULT_SHARE
            )));
        }
        if let (Some(lease), pause) = (self.lease, self.pause) {
            check_duration("pruner lease", lease)?;
            if pause.is_some_and(|pause| lease <= pause) {
                return Err(Error::InvalidConfig(format!(
                    "pruner lease ({lease:?}) must be longer than the pause between batches \
                     ({pause:?}), or another pruner takes over in every pause"
                )));
            }
        }
        Ok(())
    }
}

impl Default for PrunerConfig {
    fn default() -> Self {
        PrunerConfig::new()
    }
}

/// What one run of a [`Pruner`] did.
///
/// ```
/// use idem::PruneReport;
/// let nothing = PruneReport::default();
/// assert_eq!((nothing.deleted, nothing.batches, nothing.skipped, nothing.drained), (0, 0, false, false));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneReport {
    /// Entries deleted.
    pub deleted: u64,
    /// Batches that deleted at least one entry.
    pub batches: u32,
    /// The most entries one batch deleted (at most the batch size).
    pub largest_batch: u64,
    /// From the first batch to the end of the last, pauses included.
    pub elapsed: Duration,
    /// Another pruner held the lease, so this run deleted nothing.
    pub skipped: bool,
    /// The run stopped because a batch came back short: nothing expired was left. `false`
    /// when it was skipped, hit [`max_batches`](PrunerConfig::max_batches), was shut down
    /// midway or lost its lease.
    pub drained: bool,
}

/// How fast a pruner paced by cost goes: its share of the store's time and its batch size.
/// It starts at the configured ones, steps up when it falls behind what expires (the share
/// doubles up to the whole of the time, then the batch doubles up to
/// [`MAX_STEP_UP_BATCH`] times the configured size) and steps back one step after each run
/// that drained the store.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pace {
    share: f64,
    batch: u32,
}

impl Pace {
    fn of(config: &PrunerConfig) -> Pace {
        Pace {
            share: config.share,
            batch: config.batch(),
        }
    }

    /// One step faster (none when already at the fastest): the share first, then the batch.
    fn faster(&mut self, config: &PrunerConfig) {
        if self.share < 1.0 {
            self.share = (self.share * 2.0).min(1.0);
        } else {
            let most = config
                .batch()
                .saturating_mul(MAX_STEP_UP_BATCH)
                .min(MAX_BATCH_SIZE);
            self.batch = self.batch.saturating_mul(2).min(most);
        }
    }

    /// One step back toward the configured pace: the batch first, then the share.
    fn slower(&mut self, config: &PrunerConfig) {
        if self.batch > config.batch() {
            self.batch = (self.batch / 2).max(config.batch());
        } else if self.share > config.share {
            self.share = (self.share / 2.0).max(config.share);
        }
    }
}

/// What a spawned pruner has measured before a run: the rate entries expire at (a second) and
/// the wait the schedule chose from it before this run.
#[derive(Debug, Clone, Copy)]
struct Measured {
    rate: f64,
    scheduled: Duration,
}

/// When a run that has not drained the store counts as falling behind by its length alone: with
/// a measured rate, after twice the wait the schedule chose before it and again after each
/// further such wait (at least a second each); before any rate is known (a pruner that has not
/// yet drained a store while entries expired), after [`OVERDUE_UNMEASURED`] and then every
/// [`OVERDUE_UNMEASURED_EVERY`].
#[derive(Debug, Clone, Copy)]
struct Overdue {
    at: Duration,
    every: Duration,
}

/// See [`Overdue`].
const OVERDUE_UNMEASURED: Duration = Duration::from_secs(5);
/// See [`Overdue`].
const OVERDUE_UNMEASURED_EVERY: Duration = Duration::from_secs(2);

impl Overdue {
    fn new(measured: Option<Measured>, interval: Duration) -> Overdue {
        let least = Duration::from_secs(1).min(interval);
        match measured {
            Some(Measured { scheduled, .. }) => {
                let every = scheduled.clamp(least, interval);
                Overdue {
                    at: every * 2,
                    every,
                }
            }
            None => Overdue {
                at: OVERDUE_UNMEASURED.min(interval * 2),
                every: OVERDUE_UNMEASURED_EVERY.min(interval),
            },
        }
    }
}

/// Whether a run paced by cost that has deleted `report.deleted` in `calls` full batches so far
/// is falling behind what expires: with a measured rate, when it deletes more slowly than
/// [`KEEP_AHEAD`] times that rate (from its second batch on); and, measured or not, when it has
/// run longer than `overdue` allows without draining the store (the rate may have been measured
/// low, or not at all).
fn behind(
    report: &PruneReport,
    calls: u32,
    measured: Option<Measured>,
    overdue: &mut Overdue,
) -> bool {
    if report.elapsed >= overdue.at {
        overdue.at += overdue.every;
        return true;
    }
    let took = report.elapsed.as_secs_f64();
    measured.is_some_and(|m| {
        calls >= 2 && took > 0.0 && (report.deleted as f64) < m.rate * KEEP_AHEAD * took
    })
}

/// Deletes what has expired, in bounded batches, in the background or on demand: expired
/// idempotency records from any [`Store`] ([`Pruner::records`]), or request ids older than a
/// retention window from a kit `RequestHistory`
/// (`RequestHistory::pruner`, features `sqlite` or
/// `postgres`).
///
/// A store keeps an expired record until something deletes it (a new claim of the same key
/// replaces it, but most keys never come back), and a history keeps every id it recorded. A
/// run takes the [lease](PrunerConfig::lease) (or reports [`skipped`](PruneReport::skipped)),
/// deletes a batch, [pauses](PrunerConfig::pause), renews the lease and deletes again until a
/// batch comes back short, then releases the lease. Every run emits one `tracing` event with
/// what it deleted (`INFO`, or `DEBUG` when it deleted nothing) and returns a [`PruneReport`].
///
/// ```
/// use idem::{Idempotency, MemoryStore, Pruner, PrunerConfig};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let pruner = Pruner::records(engine.store().clone(), PrunerConfig::default())?;
///
/// // One run now...
/// let report = pruner.run_once().await?;
/// assert!(report.drained);
///
/// // ...or in the background: a run now and one every interval, until shut down.
/// let mut handle = pruner.spawn();
/// assert_eq!(handle.next_report().await.map(|r| r.deleted), Some(0));
/// handle.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Pruner {
    target: Arc<dyn Target>,
    config: PrunerConfig,
}

impl fmt::Debug for Pruner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pruner")
            .field("target", &self.target.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Pruner {
    /// A pruner of the expired records of `store` (any store, or the `Arc<dyn Store>` an
    /// [`Idempotency`](crate::Idempotency) holds), through [`Store::prune_expired`].
    ///
    /// Its lease is a record of the store itself, under the reserved key
    /// `Key::derive("idem.pruner", "", "records")`: claimed with [`Store::claim`], renewed with
    /// [`Store::renew`], released with [`Store::abort`], so it keeps the store's own rules
    /// (atomic claim, fencing, database time). Checks `config` (see [`PrunerConfig`]);
    /// otherwise [`Error::InvalidConfig`].
    ///
    /// ```
    /// use idem::{Error, MemoryStore, Pruner, PrunerConfig};
    /// let bad = PrunerConfig::new().batch_size(0);
    /// assert!(matches!(Pruner::records(MemoryStore::new(), bad), Err(Error::InvalidConfig(_))));
    /// ```
    pub fn records(store: impl Store, config: PrunerConfig) -> Result<Pruner, Error> {
        Pruner::new(Arc::new(Records(Arc::new(store))), config)
    }

    /// Checks `config` and settles its batch size: the one it names, or the target's.
    pub(crate) fn new(target: Arc<dyn Target>, mut config: PrunerConfig) -> Result<Pruner, Error> {
        config.validate()?;
        if config.batch_size.is_none() {
            let own = target.batch_size();
            if !(1..=MAX_BATCH_SIZE).contains(&own) {
                return Err(Error::InvalidConfig(format!(
                    "the store's prune_batch_size() is {own}, not 1 to {MAX_BATCH_SIZE}; \
                     set PrunerConfig::batch_size"
                )));
            }
            config.batch_size = Some(own);
        }
        Ok(Pruner { target, config })
    }

    /// The most entries one batch deletes before the pruner [steps up](PrunerConfig): the
    /// config's [`batch_size`](PrunerConfig::batch_size) if it names one, otherwise the store's
    /// [`prune_batch_size`](Store::prune_batch_size) (for a history,
    /// [`PrunerConfig::DEFAULT_BATCH_SIZE`]).
    ///
    /// ```
    /// use idem::{MemoryStore, Pruner, PrunerConfig};
    /// let pruner = Pruner::records(MemoryStore::new(), PrunerConfig::new())?;
    /// assert_eq!(pruner.batch_size(), PrunerConfig::DEFAULT_BATCH_SIZE);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn batch_size(&self) -> u32 {
        self.config.batch()
    }

    /// Runs once now: takes the lease (or reports [`skipped`](PruneReport::skipped)), deletes
    /// batch by batch, pausing after each full batch, until a batch comes back short (or
    /// `max_batches` is reached), and releases the lease. On an error the run stops and returns
    /// it; what earlier batches deleted stays deleted. See [`Pruner`] for an example.
    pub async fn run_once(&self) -> Result<PruneReport, Error> {
        let mut report = PruneReport::default();
        self.run(None, &mut Pace::of(&self.config), None, &mut report)
            .await?;
        Ok(report)
    }

    /// Runs in a tokio task (call it inside a runtime): once now and then every interval,
    /// until [`PrunerHandle::shutdown`] or the handle is dropped. A failed run is logged
    /// (`tracing`, `WARN`) and the next interval tries again. See [`Pruner`] for an example.
    pub fn spawn(self) -> PrunerHandle {
        PrunerHandle::spawn(self)
    }

    /// One run, filling `report` as it goes so a failed run still tells what it did.
    /// `pace` is where the pruner's pace stands (stepped up or back here); `measured` what a
    /// spawned pruner has measured so far.
    async fn run(
        &self,
        stop: Option<&mut watch::Receiver<bool>>,
        pace: &mut Pace,
        measured: Option<Measured>,
        report: &mut PruneReport,
    ) -> Result<(), Error> {
        let mut lease = match self.config.lease {
            Some(length) => {
                let mut lease = self.target.clone().lease(length);
                if !lease.acquire().await? {
                    report.skipped = true;
                    tracing::debug!(
                        target_name = self.target.name(),
                        "another pruner holds the lease; skipping this run"
                    );
                    return Ok(());
                }
                Some(lease)
            }
            None => None,
        };
        let outcome = self
            .delete_batches(stop, &mut lease, pace, measured, report)
            .await;
        let released = match lease.as_mut() {
            Some(lease) => lease.release().await,
            None => Ok(()),
        };
        outcome?;
        released?;
        if report.deleted > 0 {
            tracing::info!(
                target_name = self.target.name(),
                deleted = report.deleted,
                batches = report.batches,
                elapsed_ms = report.elapsed.as_millis() as u64,
                drained = report.drained,
                share = pace.share,
                batch_size = pace.batch,
                "pruned expired entries"
            );
        } else {
            tracing::debug!(
                target_name = self.target.name(),
                elapsed_ms = report.elapsed.as_millis() as u64,
                drained = report.drained,
                "nothing expired to prune"
            );
        }
        Ok(())
    }

    async fn delete_batches(
        &self,
        mut stop: Option<&mut watch::Receiver<bool>>,
        lease: &mut Option<Box<dyn Lease>>,
        pace: &mut Pace,
        measured: Option<Measured>,
        report: &mut PruneReport,
    ) -> Result<(), Error> {
        let started = Instant::now();
        let mut calls = 0u32;
        let mut overdue = Overdue::new(measured, self.config.interval);
        loop {
            let batch_size = pace.batch;
            if stop.as_deref().is_some_and(stop_requested) {
                return Ok(());
            }
            // Taking the lease again renews it; failing means another pruner took over after
            // ours ran out, so leave the rest to it.
            if calls > 0
                && let Some(lease) = lease.as_mut()
                && !lease.acquire().await?
            {
                tracing::warn!(
                    target_name = self.target.name(),
                    "pruner lease lost midway; stopping this run"
                );
                return Ok(());
            }
            let batch_started = Instant::now();
            let deleted = self.target.delete_expired(batch_size).await;
            let batch_took = batch_started.elapsed();
            report.elapsed = started.elapsed();
            let deleted = deleted?;
            calls = calls.saturating_add(1);
            if deleted > 0 {
                crate::observe::pruned(self.target.label(), deleted);
                report.deleted += deleted;
                report.batches += 1;
                report.largest_batch = report.largest_batch.max(deleted);
            }
            if deleted < u64::from(batch_size) {
                report.drained = true;
                return Ok(());
            }
            if self.config.max_batches.is_some_and(|max| calls >= max) {
                return Ok(());
            }
            if self.config.pause.is_none() && behind(report, calls, measured, &mut overdue) {
                pace.faster(&self.config);
            }
            if !self
                .pause(
                    self.pause_after(batch_took, pace.share),
                    stop.as_deref_mut(),
                )
                .await
            {
                return Ok(());
            }
        }
    }

    /// The pause after a full batch that took `took`: the fixed pause, or what leaves the store
    /// `1 − share` of the time (the pace's share), at most a quarter of the lease (so it is
    /// renewed in time) and at most the interval.
    fn pause_after(&self, took: Duration, share: f64) -> Duration {
        if let Some(pause) = self.config.pause {
            return pause;
        }
        let mut pause = took.mul_f64((1.0 - share) / share);
        if let Some(lease) = self.config.lease {
            pause = pause.min(lease / 4);
        }
        pause.min(self.config.interval)
    }

    /// How long a spawned pruner waits, from the start of a run that went as `report` says,
    /// before the next; `last` is the wait chosen before this run, `rate` the expiry rate
    /// measured so far (entries a second, smoothed; updated here). With a fixed pause, or after
    /// a skipped run: the interval. After a run that deleted nothing: twice `last`, from
    /// [`MIN_RUN_WAIT`] up to the interval, so an idle store is looked at less and less often
    /// and a store that just got busy soon. Otherwise the time about [`RUN_BATCHES`] batches
    /// take to expire at the measured rate, at least [`MIN_RUN_WAIT`]. What a drained run
    /// deleted expired over `window`: from the end of the last run that drained the store
    /// (nothing expired was left then) and deleted something to the end of this one; unknown
    /// until one has, and again after a run that found nothing expired.
    fn next_run(
        &self,
        report: &PruneReport,
        window: Option<Duration>,
        last: Duration,
        rate: &mut Option<f64>,
    ) -> Duration {
        let interval = self.config.interval;
        let shortest = MIN_RUN_WAIT.min(interval);
        if self.config.pause.is_some() || report.skipped {
            return interval;
        }
        if report.deleted == 0 {
            return (last * 2).clamp(shortest, interval);
        }
        if !report.drained {
            // Cut short (max_batches, a lost lease): entries are waiting.
            return shortest;
        }
        let Some(window) = window.filter(|w| !w.is_zero()) else {
            // The first run's backlog says nothing of the rate: measure it over a short window.
            return shortest;
        };
        let measured = report.deleted as f64 / window.as_secs_f64();
        // Half the old estimate, half the new: one short window does not swing the schedule.
        let smoothed = rate.map_or(measured, |old| (old + measured) / 2.0);
        *rate = Some(smoothed);
        let wait =
            Duration::try_from_secs_f64(RUN_BATCHES * f64::from(self.config.batch()) / smoothed)
                .unwrap_or(interval);
        wait.clamp(shortest, interval)
    }

    /// Waits out the pause between batches; `false` when a stop came first.
    async fn pause(&self, pause: Duration, stop: Option<&mut watch::Receiver<bool>>) -> bool {
        if pause.is_zero() {
            return true;
        }
        let sleep = tokio::time::sleep(pause);
        match stop {
            None => {
                sleep.await;
                true
            }
            Some(stop) => tokio::select! {
                _ = sleep => true,
                _ = stop.changed() => false,
            },
        }
    }
}

/// What a [`Pruner`] deletes from: the only part that differs between records and history ids
/// (a kit's `RequestHistory` implements it beside its store).
#[async_trait]
pub trait Target: Send + Sync + 'static {
    /// What it prunes, for log events.
    fn name(&self) -> &str;

    /// The `target` label of `idem_pruned_total`: `records` or `history`.
    fn label(&self) -> &'static str;

    /// Deletes at most `limit` expired entries; how many went.
    async fn delete_expired(&self, limit: u32) -> Result<u64, Error>;

    /// The batch size when the config names none.
    fn batch_size(&self) -> u32 {
        PrunerConfig::DEFAULT_BATCH_SIZE
    }

    /// A lease of `length` that a run takes, renews and releases (not yet taken).
    fn lease(self: Arc<Self>, length: Duration) -> Box<dyn Lease>;
}

/// The expired records of a store.
struct Records(Arc<dyn Store>);

#[async_trait]
impl Target for Records {
    fn name(&self) -> &str {
        "idempotency records"
    }

    fn label(&self) -> &'static str {
        "records"
    }

    async fn delete_expired(&self, limit: u32) -> Result<u64, Error> {
        self.0.prune_expired(limit).await
    }

    fn batch_size(&self) -> u32 {
        self.0.prune_batch_size()
    }

    fn lease(self: Arc<Self>, length: Duration) -> Box<dyn Lease> {
        Box::new(RecordsLease::new(self.0.clone(), records_lease_key, length))
    }
}

/// Controls a [spawned](Pruner::spawn) pruner. Dropping it stops the pruner too (after the
/// batch in progress); [`shutdown`](PrunerHandle::shutdown) also waits for that.
///
/// ```
/// use idem::{MemoryStore, Pruner, PrunerConfig};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let mut handle = Pruner::records(MemoryStore::new(), PrunerConfig::default())?.spawn();
/// let first = handle.next_report().await;
/// assert_eq!(first, handle.last_report());
/// handle.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PrunerHandle(Background<PruneReport>);

impl PrunerHandle {
    /// Runs `pruner` at once and then every interval until the handle stops it. A run that
    /// overruns the interval delays the next.
    fn spawn(pruner: Pruner) -> PrunerHandle {
        PrunerHandle(Background::spawn(|mut stop_rx, report_tx| async move {
            let mut wait = Duration::ZERO;
            // The wait chosen after the previous run (its start to this one's).
            let mut last = Duration::ZERO;
            // When the last run that drained the store ended (nothing expired was left then),
            // and the expiry rate measured so far.
            let mut drained_at: Option<Instant> = None;
            let mut rate = None;
            let mut pace = Pace::of(&pruner.config);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    // A `true` sent or the handle dropped: stop either way.
                    _ = stop_rx.changed() => break,
                }
                let started = Instant::now();
                let mut report = PruneReport::default();
                let measured = rate.map(|rate| Measured {
                    rate,
                    scheduled: last,
                });
                let next = match pruner
                    .run(Some(&mut stop_rx), &mut pace, measured, &mut report)
                    .await
                {
                    Ok(()) => {
                        // Everything this run deleted expired since the last drained run ended:
                        // that is the window of the rate.
                        let ended = Instant::now();
                        let window = drained_at.map(|at| ended.duration_since(at));
                        if report.drained {
                            pace.slower(&pruner.config);
                            // A run that found nothing expired opens no window: entries may
                            // start to expire at any moment after it, and a window taking in
                            // that quiet spell would measure too low a rate (with batches of
                            // 1,000 at 3,000 expiries a second, a 30 s wait). The next run that
                            // deletes measures afresh.
                            drained_at = (report.deleted > 0).then_some(ended);
                        } else if report.skipped {
                            // Another pruner deletes meanwhile: measure afresh.
                            drained_at = None;
                        }
                        let next = pruner.next_run(&report, window, last, &mut rate);
                        report_tx.send_replace(Some(report));
                        next
                    }
                    Err(e) => {
                        tracing::warn!(
                            target_name = pruner.target.name(),
                            error = %e,
                            deleted = report.deleted,
                            batches = report.batches,
                            "pruning failed; trying again at the next interval"
                        );
                        pruner.config.interval
                    }
                };
                if stop_requested(&stop_rx) {
                    break;
                }
                // Measured from this run's start; a run that took longer starts the next at once.
                last = next;
                wait = next.saturating_sub(started.elapsed());
            }
        }))
    }

    /// The report of the latest successful run, if any.
    ///
    /// ```
    /// use idem::{MemoryStore, Pruner, PrunerConfig};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let handle = Pruner::records(MemoryStore::new(), PrunerConfig::default())?.spawn();
    /// // The first run has not had a chance to start yet.
    /// assert_eq!(handle.last_report(), None);
    /// # Ok(()) }
    /// ```
    pub fn last_report(&self) -> Option<PruneReport> {
        self.0.last_report()
    }

    /// Waits for the next successful run and returns its report; `None` once the pruner has
    /// stopped. See [`PrunerHandle`] for an example.
    pub async fn next_report(&mut self) -> Option<PruneReport> {
        self.0.next_report().await
    }

    /// [`shutdown`](Self::shutdown) through a shared handle (a store's clones share their
    /// pruner's, and close it with this), without resuming a panic: the pruner stops after the
    /// batch in progress and releases its lease; the handle reports nothing more.
    ///
    /// ```
    /// use idem::{MemoryStore, Pruner, PrunerConfig};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let mut handle = Pruner::records(MemoryStore::new(), PrunerConfig::default())?.spawn();
    /// handle.stop().await;
    /// assert_eq!(handle.next_report().await, None);
    /// # Ok(()) }
    /// ```
    pub async fn stop(&self) {
        self.0.stop().await;
    }

    /// Stops the pruner after the batch in progress (a pause is cut short), lets it release
    /// its lease, and waits for it. A panic inside the pruner task is resumed here. See
    /// [`PrunerHandle`] for an example.
    pub async fn shutdown(self) {
        self.0.shutdown().await
    }
}
