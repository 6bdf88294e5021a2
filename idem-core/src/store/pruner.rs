//! Deleting expired idempotency records in the background, paced so claims stay fast.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{check_duration, Store};
use crate::error::Error;
use crate::periodic::{stop_requested, Periodic};

/// The largest batch a pruner asks a store to delete in one call.
const MAX_BATCH_SIZE: u32 = 100_000;

/// How a [`RecordPruner`] runs: batches of [`batch_size`](RecordPrunerConfig::batch_size)
/// records with a [`pause`](RecordPrunerConfig::pause) between them, a run every
/// [`interval`](RecordPrunerConfig::interval).
///
/// The defaults (100 records, 200 ms, 60 s) come from the benchmark's scale run
/// (`docs/performance.md`): batches of 1,000 back to back made the claim p99 10 to 50 × worse
/// while a large backlog drained. On SQLite every batch, small or large, costs claims about the
/// same (a claim that meets the single write lock sleeps at least 1 ms), so it is the number of
/// batches per second that counts: 100-record batches 100 ms apart kept it near 3 × on SQLite,
/// 200 ms apart about 2 ×, and PostgreSQL within 1.1 × either way, still removing about 500
/// records a second, 1.8 million an hour. PostgreSQL alone stays within 3 × with 20 ms pauses:
/// a busy PostgreSQL store with a large backlog can take `pause(Duration::from_millis(20))`.
///
/// ```
/// use std::time::Duration;
/// use idem_core::RecordPrunerConfig;
/// let config = RecordPrunerConfig::new()
///     .batch_size(50)
///     .pause(Duration::from_millis(50))
///     .interval(Duration::from_secs(300))
///     .max_batches(1_000);
/// # let _ = config;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordPrunerConfig {
    batch_size: u32,
    pause: Duration,
    interval: Duration,
    max_batches: Option<u32>,
}

impl RecordPrunerConfig {
    /// Records one batch deletes at most, by default.
    ///
    /// ```
    /// assert_eq!(idem_core::RecordPrunerConfig::DEFAULT_BATCH_SIZE, 100);
    /// ```
    pub const DEFAULT_BATCH_SIZE: u32 = 100;

    /// The pause after a full batch, by default.
    ///
    /// ```
    /// assert_eq!(idem_core::RecordPrunerConfig::DEFAULT_PAUSE.as_millis(), 200);
    /// ```
    pub const DEFAULT_PAUSE: Duration = Duration::from_millis(200);

    /// The time between the starts of two runs, by default.
    ///
    /// ```
    /// assert_eq!(idem_core::RecordPrunerConfig::DEFAULT_INTERVAL.as_secs(), 60);
    /// ```
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

    /// The defaults: batches of [100](Self::DEFAULT_BATCH_SIZE) records,
    /// [200 ms](Self::DEFAULT_PAUSE) apart, a run every [60 s](Self::DEFAULT_INTERVAL), and no
    /// cap on batches per run (a run goes on until the store has no expired record left).
    ///
    /// ```
    /// use idem_core::RecordPrunerConfig;
    /// assert_eq!(RecordPrunerConfig::new(), RecordPrunerConfig::default());
    /// ```
    pub fn new() -> RecordPrunerConfig {
        RecordPrunerConfig {
            batch_size: Self::DEFAULT_BATCH_SIZE,
            pause: Self::DEFAULT_PAUSE,
            interval: Self::DEFAULT_INTERVAL,
            max_batches: None,
        }
    }

    /// The most records one [`Store::prune_expired`] call deletes (1 to 100,000). Smaller
    /// batches hold locks (SQLite: the database's only write lock) for less time.
    ///
    /// ```
    /// let _ = idem_core::RecordPrunerConfig::new().batch_size(500);
    /// ```
    pub fn batch_size(mut self, batch_size: u32) -> RecordPrunerConfig {
        self.batch_size = batch_size;
        self
    }

    /// How long to wait after a full batch before the next one, leaving the database to
    /// claims. Zero runs the batches back to back, which drains fastest but slows claims most.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem_core::RecordPrunerConfig::new().pause(Duration::from_millis(50));
    /// ```
    pub fn pause(mut self, pause: Duration) -> RecordPrunerConfig {
        self.pause = pause;
        self
    }

    /// The time between the starts of two runs of a [spawned](RecordPruner::spawn) pruner
    /// (1 ms to 10 years); a run that takes longer delays the next.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem_core::RecordPrunerConfig::new().interval(Duration::from_secs(600));
    /// ```
    pub fn interval(mut self, interval: Duration) -> RecordPrunerConfig {
        self.interval = interval;
        self
    }

    /// Ends a run after `max_batches` full batches even if expired records remain; the next
    /// run goes on from there. Bounds how long one run takes when records expire faster than
    /// the pace allows. By default a run has no cap.
    ///
    /// ```
    /// let _ = idem_core::RecordPrunerConfig::new().max_batches(600);
    /// ```
    pub fn max_batches(mut self, max_batches: u32) -> RecordPrunerConfig {
        self.max_batches = Some(max_batches);
        self
    }

    fn validate(&self) -> Result<(), Error> {
        if !(1..=MAX_BATCH_SIZE).contains(&self.batch_size) {
            return Err(Error::InvalidConfig(format!(
                "record pruner batch size must be 1 to {MAX_BATCH_SIZE}, got {}; the default is {}",
                self.batch_size,
                Self::DEFAULT_BATCH_SIZE
            )));
        }
        if self.max_batches == Some(0) {
            return Err(Error::InvalidConfig(
                "record pruner max_batches must be at least 1; leave it unset for no cap".into(),
            ));
        }
        check_duration("record pruner interval", self.interval)
    }
}

impl Default for RecordPrunerConfig {
    fn default() -> Self {
        RecordPrunerConfig::new()
    }
}

/// What one run of a [`RecordPruner`] did.
///
/// ```
/// use idem_core::RecordPruneReport;
/// let nothing = RecordPruneReport::default();
/// assert_eq!((nothing.deleted, nothing.batches, nothing.drained), (0, 0, false));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordPruneReport {
    /// Records deleted.
    pub deleted: u64,
    /// [`Store::prune_expired`] calls that deleted at least one record.
    pub batches: u32,
    /// From the first batch to the end of the last, pauses included.
    pub elapsed: Duration,
    /// The run stopped because a batch came back short: no expired record was left. `false`
    /// when it hit [`max_batches`](RecordPrunerConfig::max_batches) or was shut down midway.
    pub drained: bool,
}

/// Deletes expired records from any [`Store`] in small batches with a pause between them, so
/// claims running at the same time stay fast.
///
/// A store keeps an expired record until something deletes it (a new claim of the same key
/// replaces it, but most keys never come back). A run calls [`Store::prune_expired`] with the
/// batch size, pauses, and calls again until a batch comes back short. Every run emits one
/// `tracing` event with what it deleted (`INFO`, or `DEBUG` when it deleted nothing) and
/// returns a [`RecordPruneReport`]. Several pruners on one SQL table are safe (each batch is
/// one bounded `DELETE`; PostgreSQL skips rows another pruner has locked), but one per table
/// is enough.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Idempotency, MemoryStore, RecordPruner, RecordPrunerConfig};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let pruner = RecordPruner::new(engine.store().clone(), RecordPrunerConfig::default())?;
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
pub struct RecordPruner {
    store: Arc<dyn Store>,
    config: RecordPrunerConfig,
}

impl fmt::Debug for RecordPruner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordPruner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RecordPruner {
    /// A pruner of `store` (any store, or the `Arc<dyn Store>` an
    /// [`Idempotency`](crate::Idempotency) holds). Checks `config`: batch size 1 to 100,000,
    /// interval 1 ms to 10 years, `max_batches` at least 1; otherwise
    /// [`Error::InvalidConfig`].
    ///
    /// ```
    /// use idem_core::{Error, MemoryStore, RecordPruner, RecordPrunerConfig};
    /// let bad = RecordPrunerConfig::new().batch_size(0);
    /// assert!(matches!(RecordPruner::new(MemoryStore::new(), bad), Err(Error::InvalidConfig(_))));
    /// ```
    pub fn new(store: impl Store, config: RecordPrunerConfig) -> Result<RecordPruner, Error> {
        config.validate()?;
        Ok(RecordPruner {
            store: Arc::new(store),
            config,
        })
    }

    /// Runs once now: deletes expired records batch by batch, pausing after each full batch,
    /// until a batch comes back short (or `max_batches` is reached). On a store error the run
    /// stops and returns it; what earlier batches deleted stays deleted. See [`RecordPruner`]
    /// for an example.
    pub async fn run_once(&self) -> Result<RecordPruneReport, Error> {
        let mut report = RecordPruneReport::default();
        self.run(None, &mut report).await?;
        Ok(report)
    }

    /// Runs in a tokio task (call it inside a runtime): once now and then every interval,
    /// until [`RecordPrunerHandle::shutdown`] or the handle is dropped. A failed run is logged
    /// (`tracing`, `WARN`) and the next interval tries again. See [`RecordPruner`] for an
    /// example.
    pub fn spawn(self) -> RecordPrunerHandle {
        let interval = self.config.interval;
        let inner = Periodic::spawn(interval, move |mut stop| {
            let pruner = self.clone();
            async move {
                let mut report = RecordPruneReport::default();
                match pruner.run(Some(&mut stop), &mut report).await {
                    Ok(()) => Some(report),
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            deleted = report.deleted,
                            batches = report.batches,
                            "pruning expired idempotency records failed; trying again at the next interval"
                        );
                        None
                    }
                }
            }
        });
        RecordPrunerHandle { inner }
    }

    /// One run, filling `report` as it goes so a failed run still tells what it did.
    async fn run(
        &self,
        mut stop: Option<&mut watch::Receiver<bool>>,
        report: &mut RecordPruneReport,
    ) -> Result<(), Error> {
        let started = Instant::now();
        let batch_size = self.config.batch_size;
        let mut calls = 0u32;
        loop {
            if stop.as_deref().is_some_and(stop_requested) {
                break;
            }
            let deleted = self.store.prune_expired(batch_size).await;
            report.elapsed = started.elapsed();
            let deleted = deleted?;
            calls = calls.saturating_add(1);
            if deleted > 0 {
                report.deleted += deleted;
                report.batches += 1;
            }
            if deleted < u64::from(batch_size) {
                report.drained = true;
                break;
            }
            if self.config.max_batches.is_some_and(|max| calls >= max) {
                break;
            }
            if !self.pause(stop.as_deref_mut()).await {
                break;
            }
        }
        if report.deleted > 0 {
            tracing::info!(
                deleted = report.deleted,
                batches = report.batches,
                elapsed_ms = report.elapsed.as_millis() as u64,
                drained = report.drained,
                "pruned expired idempotency records"
            );
        } else {
            tracing::debug!(
                elapsed_ms = report.elapsed.as_millis() as u64,
                drained = report.drained,
                "no expired idempotency records to prune"
            );
        }
        Ok(())
    }

    /// Waits out the pause between batches; `false` when a stop came first.
    async fn pause(&self, stop: Option<&mut watch::Receiver<bool>>) -> bool {
        if self.config.pause.is_zero() {
            return true;
        }
        let sleep = tokio::time::sleep(self.config.pause);
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

/// Controls a [spawned](RecordPruner::spawn) pruner. Dropping it stops the pruner too (after
/// the batch in progress); [`shutdown`](RecordPrunerHandle::shutdown) also waits for that.
///
/// ```
/// use idem_core::{MemoryStore, RecordPruner, RecordPrunerConfig};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let mut handle = RecordPruner::new(MemoryStore::new(), RecordPrunerConfig::default())?.spawn();
/// let first = handle.next_report().await;
/// assert_eq!(first, handle.last_report());
/// handle.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RecordPrunerHandle {
    inner: Periodic<RecordPruneReport>,
}

impl RecordPrunerHandle {
    /// The report of the latest successful run, if any.
    ///
    /// ```
    /// use idem_core::{MemoryStore, RecordPruner, RecordPrunerConfig};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let handle = RecordPruner::new(MemoryStore::new(), RecordPrunerConfig::default())?.spawn();
    /// // The first run has not had a chance to start yet.
    /// assert_eq!(handle.last_report(), None);
    /// # Ok(()) }
    /// ```
    pub fn last_report(&self) -> Option<RecordPruneReport> {
        self.inner.last_report()
    }

    /// Waits for the next successful run and returns its report; `None` once the pruner has
    /// stopped. See [`RecordPrunerHandle`] for an example.
    pub async fn next_report(&mut self) -> Option<RecordPruneReport> {
        self.inner.next_report().await
    }

    /// Stops the pruner after the batch in progress (a pause is cut short) and waits for it.
    /// A panic inside the pruner task is resumed here. See [`RecordPrunerHandle`] for an
    /// example.
    pub async fn shutdown(self) {
        self.inner.shutdown().await
    }
}
