//! [`RequestHistory::pruner`]: a [`Pruner`] of a history's old ids, with what it needs: the
//! statement that deletes a batch of them, and the lease row in `<table>_pruner`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Pool;
use uuid::Uuid;

use crate::error::sql_error;
use crate::kit::{millis, Backend, ConcurrencyError, RequestHistory};
use idem_core::adapter::{pruner, PruneLease as Lease, PruneTarget as Target};
use idem_core::Error;
use idem_core::{Pruner, PrunerConfig};

impl<DB: Backend> RequestHistory<DB> {
    /// A [`Pruner`] of the request ids in this history (on `pool`) recorded more than
    /// `retention` ago. Each batch is one statement,
    /// `DELETE … WHERE (scope, request_id) IN (SELECT … WHERE created_at < now - retention LIMIT n)`
    /// (`FOR UPDATE SKIP LOCKED` on PostgreSQL), so no statement holds many locks for long; its
    /// lease is the one row of `<table>_pruner`. Checks `retention` (1 ms to 10 years) and
    /// `config` (see [`PrunerConfig`]); otherwise [`Error::InvalidConfig`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use std::time::Duration;
    /// use idem::{kit::RequestHistory, PrunerConfig};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
    /// let history = RequestHistory::<sqlx::Sqlite>::new("request_history")?;
    /// history.ensure_schema(&mut *pool.acquire().await?).await?;
    /// let _ = history.record(&mut *pool.acquire().await?, "deposit", "fresh").await?;
    /// // An id recorded two hours ago.
    /// sqlx::query("INSERT INTO request_history VALUES ('deposit', 'old', CAST(unixepoch('subsec') * 1000 AS INTEGER) - 7200000)")
    ///     .execute(&pool).await?;
    ///
    /// let hour = Duration::from_secs(3600);
    /// let pruner = history.pruner(pool.clone(), hour, PrunerConfig::default())?;
    /// let report = pruner.run_once().await?;
    /// assert_eq!((report.deleted, report.batches, report.drained), (1, 1, true));
    /// assert!(history.contains(&mut *pool.acquire().await?, "deposit", "fresh").await?);
    /// # Ok(()) }
    /// # }
    /// ```
    pub fn pruner(
        &self,
        pool: Pool<DB>,
        retention: Duration,
        config: PrunerConfig,
    ) -> Result<Pruner, Error> {
        let target = History::new(pool, self, retention)?;
        pruner(Arc::new(target), config)
    }
}

/// The ids of one history older than its retention.
pub(crate) struct History<DB: Backend> {
    pool: Pool<DB>,
    name: String,
    retention_ms: i64,
    claim_sql: String,
    release_sql: String,
    delete_sql: String,
}

impl<DB: Backend> History<DB> {
    pub(crate) fn new(
        pool: Pool<DB>,
        history: &RequestHistory<DB>,
        retention: Duration,
    ) -> Result<History<DB>, Error> {
        let retention_ms = millis("retention", retention).map_err(config_error)?;
        let d = &DB::DIALECT;
        let (table, lease_table) = (history.table(), history.lease_table());
        Ok(History {
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
            name: format!("request history {table}"),
            retention_ms,
        })
    }

    async fn execute(&self, query: crate::kit::SqlQuery<'_, DB>) -> Result<u64, Error> {
        let mut conn = self.pool.acquire().await.map_err(sql_error)?;
        Ok(DB::execute(&mut conn, query).await.map_err(sql_error)?)
    }
}

/// A duration the kit refused, as the pruner's error.
fn config_error(e: ConcurrencyError) -> Error {
    match e {
        ConcurrencyError::InvalidConfig(message) => Error::InvalidConfig(message),
        other => Error::InvalidConfig(other.to_string()),
    }
}

#[async_trait]
impl<DB: Backend> Target for History<DB> {
    fn name(&self) -> &str {
        &self.name
    }

    fn label(&self) -> &'static str {
        "history"
    }

    async fn delete_expired(&self, limit: u32) -> Result<u64, Error> {
        let query = DB::bind_i64(
            DB::bind_i64(sqlx::query(&self.delete_sql), self.retention_ms),
            i64::from(limit),
        );
        self.execute(query).await
    }

    fn lease(self: Arc<Self>, length: Duration) -> Box<dyn Lease> {
        Box::new(HistoryLease {
            // The config was checked: a lease is at most ten years, far inside i64 ms.
            length_ms: i64::try_from(length.as_millis()).unwrap_or(i64::MAX),
            holder: Uuid::new_v4().to_string(),
            history: self,
        })
    }
}

/// The one row of `<table>_pruner`, held by a holder id of this run's own.
struct HistoryLease<DB: Backend> {
    history: Arc<History<DB>>,
    holder: String,
    length_ms: i64,
}

#[async_trait]
impl<DB: Backend> Lease for HistoryLease<DB> {
    async fn acquire(&mut self) -> Result<bool, Error> {
        let query = DB::bind_i64(
            DB::bind_str(sqlx::query(&self.history.claim_sql), &self.holder),
            self.length_ms,
        );
        Ok(self.history.execute(query).await? == 1)
    }

    async fn release(&mut self) -> Result<(), Error> {
        let query = DB::bind_str(sqlx::query(&self.history.release_sql), &self.holder);
        self.history.execute(query).await.map(drop)
    }
}
