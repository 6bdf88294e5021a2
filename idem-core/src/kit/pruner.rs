//! Deleting request ids older than the retention window, one instance at a time.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;
use tokio::sync::watch;
use uuid::Uuid;

use super::backend::Backend;
use super::history::RequestHistory;
use super::{millis, ConcurrencyError, Ident};
use crate::periodic::{stop_requested, Periodic};

/// The largest batch a pruner deletes in one statement.
const MAX_BATCH_SIZE: u32 = 100_000;

/// How a [`Pruner`] runs.
///
/// ```
/// use std::time::Duration;
/// use idem_core::kit::PrunerConfig;
/// let config = PrunerConfig::new(Duration::from_secs(24 * 3600))
///     .interval(Duration::from_secs(600))
///     .batch_size(500)
///     .lease(Duration::from_secs(30));
/// assert_eq!(config.retention(), Duration::from_secs(86_400));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunerConfig {
    retention: Duration,
    interval: Duration,
    batch_size: u32,
    lease: Duration,
}

impl PrunerConfig {
    /// Deletes ids recorded more than `retention` ago. By default it runs every 5 minutes,
    /// deletes 1,000 ids per statement and holds its lease for 60 seconds (renewed before each
    /// batch).
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = idem_core::kit::PrunerConfig::new(Duration::from_secs(3600));
    /// assert_eq!(c.retention(), Duration::from_secs(3600));
    /// ```
    pub fn new(retention: Duration) -> PrunerConfig {
        PrunerConfig {
            retention,
            interval: Duration::from_secs(300),
            batch_size: 1_000,
            lease: Duration::from_secs(60),
        }
    }

    /// How long ids are kept.
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(idem_core::kit::PrunerConfig::new(Duration::from_secs(1)).retention(), Duration::from_secs(1));
    /// ```
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The time between the starts of two runs of a [spawned](Pruner::spawn) pruner.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem_core::kit::PrunerConfig::new(Duration::from_secs(3600)).interval(Duration::from_secs(60));
    /// ```
    pub fn interval(mut self, interval: Duration) -> PrunerConfig {
        self.interval = interval;
        self
    }

    /// The most ids one `DELETE` removes (1 to 100,000).
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem_core::kit::PrunerConfig::new(Duration::from_secs(3600)).batch_size(10_000);
    /// ```
    pub fn batch_size(mut self, batch_size: u32) -> PrunerConfig {
        self.batch_size = batch_size;
        self
    }

    /// How long a run may hold the lease without renewing it; a crashed runner blocks others
    /// for at most this long. Make it longer than one batch takes.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem_core::kit::PrunerConfig::new(Duration::from_secs(3600)).lease(Duration::from_secs(10));
    /// ```
    pub fn lease(mut self, lease: Duration) -> PrunerConfig {
        self.lease = lease;
        self
    }
}

/// What one run of a [`Pruner`] did.
///
/// ```
/// use idem_core::kit::PruneReport;
/// let nothing = PruneReport::default();
/// assert_eq!((nothing.deleted, nothing.batches, nothing.skipped), (0, 0, false));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneReport {
    /// Ids deleted.
    pub deleted: u64,
    /// `DELETE` statements that removed at least one id.
    pub batches: u32,
    /// The most ids one statement removed (at most the batch size).
    pub largest_batch: u64,
    /// Another instance held the lease, so this run did nothing.
    pub skipped: bool,
    /// The run stopped because a batch came back short: nothing older than the retention was
    /// left. `false` when it was skipped, shut down, or lost its lease midway.
    pub drained: bool,
}

/// Deletes request ids older than the retention window from a [`RequestHistory`], in bounded
/// batches, until none is left.
///
/// Any number of pruners (threads, processes, machines) may run on one history: a run first
/// claims a lease row in `<table>_pruner` with one conditional upsert, and renews it before
/// each batch, so one runner works at a time and the others report
/// [`skipped`](PruneReport::skipped). Each batch is one statement,
/// `DELETE … WHERE (scope, request_id) IN (SELECT … WHERE created_at < now - retention LIMIT n)`
/// (`FOR UPDATE SKIP LOCKED` on PostgreSQL), so no statement holds many locks for long. Every
/// run emits a `tracing` event at `INFO` with what it removed, and returns a [`PruneReport`].
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use std::time::Duration;
/// use idem_core::kit::{Pruner, PrunerConfig, RequestHistory};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// let history = RequestHistory::<sqlx::Sqlite>::new("request_history")?;
/// history.ensure_schema(&mut *pool.acquire().await?).await?;
/// let _ = history.record(&mut *pool.acquire().await?, "deposit", "fresh").await?;
/// // An id recorded two hours ago.
/// sqlx::query("INSERT INTO request_history VALUES ('deposit', 'old', CAST(unixepoch('subsec') * 1000 AS INTEGER) - 7200000)")
///     .execute(&pool).await?;
///
/// let pruner = Pruner::new(pool.clone(), &history, PrunerConfig::new(Duration::from_secs(3600)))?;
/// let report = pruner.run_once().await?;
/// assert_eq!((report.deleted, report.batches, report.drained), (1, 1, true));
/// assert!(history.contains(&mut *pool.acquire().await?, "deposit", "fresh").await?);
///
/// // Or in the background: a run now and one every interval, until shut down.
/// let mut handle = pruner.spawn();
/// assert_eq!(handle.next_report().await.map(|r| r.deleted), Some(0));
/// handle.shutdown().await;
/// # Ok(()) }
/// # }
/// ```
pub struct Pruner<DB: Backend> {
    pool: Pool<DB>,
    table: Ident,
    holder: String,
    retention_ms: i64,
    lease_ms: i64,
    interval: Duration,
    batch_size: u32,
    claim_sql: String,
    release_sql: String,
    delete_sql: String,
}

impl<DB: Backend> fmt::Debug for Pruner<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pruner")
            .field("table", &self.table)
            .field("holder", &self.holder)
            .field("retention_ms", &self.retention_ms)
            .field("interval", &self.interval)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> Pruner<DB> {
    /// A pruner of `history` on `pool`, with a lease holder id of its own. Checks `config`:
    /// retention, interval and lease between 1 ms and 10 years, batch size 1 to 100,000.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use std::time::Duration;
    /// use idem_core::kit::{Pruner, PrunerConfig, RequestHistory};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
    /// let history = RequestHistory::<sqlx::Sqlite>::new("request_history")?;
    /// let bad = PrunerConfig::new(Duration::from_secs(3600)).batch_size(0);
    /// assert!(Pruner::new(pool, &history, bad).is_err());
    /// # Ok(()) }
    /// # }
    /// ```
    pub fn new(
        pool: Pool<DB>,
        history: &RequestHistory<DB>,
        config: PrunerConfig,
    ) -> Result<Pruner<DB>, ConcurrencyError> {
        let retention_ms = millis("retention", config.retention)?;
        let lease_ms = millis("pruner lease", config.lease)?;
        millis("pruner interval", config.interval)?;
        if !(1..=MAX_BATCH_SIZE).contains(&config.batch_size) {
            return Err(ConcurrencyError::InvalidConfig(format!(
                "batch size must be 1 to {MAX_BATCH_SIZE}, got {}",
                config.batch_size
            )));
        }
        let d = &DB::DIALECT;
        let (table, lease_table) = (history.table(), history.lease_table());
        Ok(Pruner {
            claim_sql: format!(
                "INSERT INTO {lease_table} (id, holder, lease_until) VALUES (1, $1, {until}) \
                 ON CONFLICT (id) DO UPDATE \
                 SET holder = excluded.holder, lease_until = excluded.lease_until \
                 WHERE {lease_table}.lease_until <= {now} OR {lease_table}.holder = excluded.holder",
                until = d.now_plus("$2"),
                now = d.now,
            ),
            release_sql: format!(
                "UPDATE {lease_table} SET lease_until = {now} WHERE id = 1 AND holder = $1",
                now = d.now
            ),
            delete_sql: format!(
                "DELETE FROM {table} WHERE (scope, request_id) IN (\
                    SELECT scope, request_id FROM {table} WHERE created_at < {cutoff} \
                    LIMIT $2{lock})",
                cutoff = d.now_minus("$1"),
                lock = d.lock_batch,
            ),
            pool,
            table: table.clone(),
            holder: Uuid::new_v4().to_string(),
            retention_ms,
            lease_ms,
            interval: config.interval,
            batch_size: config.batch_size,
        })
    }

    /// Runs once now: claims the lease (or reports [`skipped`](PruneReport::skipped)), deletes
    /// expired ids batch by batch until a batch comes back short, and releases the lease.
    /// See [`Pruner`] for an example.
    pub async fn run_once(&self) -> Result<PruneReport, ConcurrencyError> {
        self.run(None).await
    }

    /// Runs in a tokio task: once now and then every interval (a run that overruns delays the
    /// next), until [`PrunerHandle::shutdown`] or the handle is dropped. A failed run is logged
    /// (`tracing`, `WARN`) and the next interval tries again. See [`Pruner`] for an example.
    pub fn spawn(self) -> PrunerHandle {
        let interval = self.interval;
        let pruner = Arc::new(self);
        let inner = Periodic::spawn(interval, move |stop| {
            let pruner = pruner.clone();
            async move {
                match pruner.run(Some(&stop)).await {
                    Ok(report) => Some(report),
                    Err(e) => {
                        tracing::warn!(
                            table = %pruner.table,
                            error = %e,
                            "pruning the request history failed; trying again at the next interval"
                        );
                        None
                    }
                }
            }
        });
        PrunerHandle { inner }
    }

    async fn run(
        &self,
        stop: Option<&watch::Receiver<bool>>,
    ) -> Result<PruneReport, ConcurrencyError> {
        let mut conn = self.pool.acquire().await?;
        let mut report = PruneReport::default();
        if !self.claim(&mut conn).await? {
            report.skipped = true;
            tracing::debug!(table = %self.table, "another pruner holds the lease; skipping this run");
            return Ok(report);
        }
        let outcome = self.delete_batches(&mut conn, stop, &mut report).await;
        let released = DB::execute(
            &mut *conn,
            DB::bind_str(sqlx::query(&self.release_sql), &self.holder),
        )
        .await;
        outcome?;
        released?;
        tracing::info!(
            table = %self.table,
            deleted = report.deleted,
            batches = report.batches,
            drained = report.drained,
            "pruned request history"
        );
        Ok(report)
    }

    async fn delete_batches(
        &self,
        conn: &mut DB::Connection,
        stop: Option<&watch::Receiver<bool>>,
        report: &mut PruneReport,
    ) -> Result<(), ConcurrencyError> {
        let mut first = true;
        loop {
            if stop.is_some_and(stop_requested) {
                return Ok(());
            }
            // The claim doubles as renewal; losing it means another runner took over after our
            // lease ran out, so leave the rest to it.
            if !first && !self.claim(conn).await? {
                tracing::warn!(table = %self.table, "pruner lease lost midway; stopping this run");
                return Ok(());
            }
            first = false;
            let query = DB::bind_i64(
                DB::bind_i64(sqlx::query(&self.delete_sql), self.retention_ms),
                i64::from(self.batch_size),
            );
            let deleted = DB::execute(conn, query).await?;
            if deleted > 0 {
                report.deleted += deleted;
                report.batches += 1;
                report.largest_batch = report.largest_batch.max(deleted);
            }
            if deleted < u64::from(self.batch_size) {
                report.drained = true;
                return Ok(());
            }
        }
    }

    /// Takes the lease if it is free or expired, or extends it if it is ours.
    async fn claim(&self, conn: &mut DB::Connection) -> Result<bool, ConcurrencyError> {
        let query = DB::bind_i64(
            DB::bind_str(sqlx::query(&self.claim_sql), &self.holder),
            self.lease_ms,
        );
        Ok(DB::execute(conn, query).await? == 1)
    }
}

/// Controls a [spawned](Pruner::spawn) pruner. Dropping it stops the pruner too (after the
/// batch in progress); [`shutdown`](PrunerHandle::shutdown) also waits for that.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use std::time::Duration;
/// use idem_core::kit::{Pruner, PrunerConfig, RequestHistory};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// # let history = RequestHistory::<sqlx::Sqlite>::new("request_history")?;
/// # history.ensure_schema(&mut *pool.acquire().await?).await?;
/// let mut handle = Pruner::new(pool, &history, PrunerConfig::new(Duration::from_secs(3600)))?.spawn();
/// let first = handle.next_report().await;
/// assert_eq!(first, handle.last_report());
/// handle.shutdown().await;
/// # Ok(()) }
/// # }
/// ```
#[derive(Debug)]
pub struct PrunerHandle {
    inner: Periodic<PruneReport>,
}

impl PrunerHandle {
    /// The report of the latest successful run, if any.
    pub fn last_report(&self) -> Option<PruneReport> {
        self.inner.last_report()
    }

    /// Waits for the next successful run and returns its report; `None` once the pruner has
    /// stopped.
    pub async fn next_report(&mut self) -> Option<PruneReport> {
        self.inner.next_report().await
    }

    /// Stops the pruner after the batch in progress, releases its lease, and waits for it.
    /// A panic inside the pruner task is resumed here.
    pub async fn shutdown(self) {
        self.inner.shutdown().await
    }
}
