//! What an operator reads of a SQL store: records by state, page by page, and counts. The `idem`
//! command is built on this.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::error::Error;
use crate::key::Key;
use crate::record::Record;
use crate::store::sql::dialect::private::Ops;
use crate::store::sql::protocol::SqlBackend;
use crate::store::Store;

/// Which records [`StoreAdmin::list`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListState {
    /// Records whose work is running.
    InProgress,
    /// Completed records.
    Completed,
}

/// Counts of a store's records, from [`StoreAdmin::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Live records whose work is running.
    pub in_progress: u64,
    /// Live completed records.
    pub completed: u64,
    /// Records whose lease or retention has ended, not yet pruned.
    pub expired: u64,
    /// The earliest end of lease or retention among the live records.
    pub oldest_expiry: Option<SystemTime>,
    /// The table's size on disk with its indexes, when the database tells.
    pub table_bytes: Option<u64>,
}

/// Reading a store as an operator does (the `idem` command's `list`, `stats` and `migrate`).
/// Implemented by [`SqliteStore`](crate::SqliteStore) and
/// [`PostgresStore`](crate::PostgresStore).
///
/// ```
/// use idem_core::{Error, Idempotency, Key, SqliteStore, StoreAdmin};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let store = SqliteStore::open(":memory:").await?;
/// Idempotency::new(store.clone()).call(Key::derive("s", "", "k")?).run(async { Ok::<_, Error>(1) }).await?;
/// let stats = store.stats().await?;
/// assert_eq!((stats.in_progress, stats.completed), (0, 1));
/// assert_eq!(store.list(None, None, 10).await?.len(), 1);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait StoreAdmin: Store {
    /// Up to `limit` live records (of one state, or all), in key order, starting after `after`
    /// (the last key of the previous page). One statement for the keys, one read per record.
    async fn list(
        &self,
        state: Option<ListState>,
        after: Option<&Key>,
        limit: u32,
    ) -> Result<Vec<Record>, Error>;

    /// Counts by state, the oldest expiry, and the table's size. One statement (two on
    /// PostgreSQL, for the size).
    async fn stats(&self) -> Result<StoreStats, Error>;

    /// The highest schema version applied to the records table.
    async fn schema_version(&self) -> Result<i64, Error>;
}

/// The records of `keys`, skipping any that expired or went away since they were listed.
async fn records(store: &dyn Store, keys: Vec<Vec<u8>>) -> Result<Vec<Record>, Error> {
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let key = <[u8; 32]>::try_from(key.as_slice()).map_err(|_| {
            super::sql::corrupt(format!("a stored key is {} bytes, expected 32", key.len()))
        })?;
        if let Some(record) = store.get(&Key::from_bytes(key)).await? {
            out.push(record);
        }
    }
    Ok(out)
}

/// The statements of [`StoreAdmin`] for one database, from its dialect and the store's table.
struct AdminSql {
    list: String,
    stats: String,
    version: String,
}

impl AdminSql {
    fn new<S: SqlBackend>(store: &S) -> Result<AdminSql, Error> {
        let d = &<S::Db as Ops>::DIALECT;
        let t = store.protocol().table();
        let now = d.now;
        let live = format!("expires_at > {now}");
        Ok(AdminSql {
            list: format!(
                "SELECT key FROM {t} WHERE {live} \
                 AND (CAST($1 AS {bigint}) IS NULL OR state = $1) \
                 AND (CAST($2 AS {bytes}) IS NULL OR key > $2) \
                 ORDER BY key LIMIT $3",
                bigint = d.bigint,
                bytes = d.bytes,
            ),
            stats: format!(
                "SELECT \
                   CAST(coalesce(sum(CASE WHEN state = 0 AND {live} THEN 1 ELSE 0 END), 0) AS {b}), \
                   CAST(coalesce(sum(CASE WHEN state = 1 AND {live} THEN 1 ELSE 0 END), 0) AS {b}), \
                   CAST(coalesce(sum(CASE WHEN {live} THEN 0 ELSE 1 END), 0) AS {b}), \
                   {oldest} \
                 FROM {t}",
                b = d.bigint,
                oldest = d.micros_of(&format!("min(CASE WHEN {live} THEN expires_at END)")),
            ),
            version: format!(
                "SELECT CAST(coalesce(max(version), 0) AS {}) FROM {}",
                d.bigint,
                t.suffixed("table", "_migrations")?
            ),
        })
    }
}

fn state_code(state: Option<ListState>) -> Option<i64> {
    state.map(|s| match s {
        ListState::InProgress => 0,
        ListState::Completed => 1,
    })
}

fn stats(
    (in_progress, completed, expired, oldest_us): (i64, i64, i64, Option<i64>),
    table_bytes: Option<i64>,
) -> StoreStats {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    StoreStats {
        in_progress: count(in_progress),
        completed: count(completed),
        expired: count(expired),
        oldest_expiry: oldest_us
            .and_then(|us| u64::try_from(us).ok())
            .map(|us| UNIX_EPOCH + Duration::from_micros(us)),
        table_bytes: table_bytes.and_then(|b| u64::try_from(b).ok()),
    }
}

/// `impl StoreAdmin` for a SQL store; `$size` asks the database for the table's size on disk
/// (`$1`: the table's name as configured), or fails where it cannot tell.
macro_rules! sql_admin {
    ($store:ty, $size:expr) => {
        #[async_trait]
        impl StoreAdmin for $store {
            async fn list(
                &self,
                state: Option<ListState>,
                after: Option<&Key>,
                limit: u32,
            ) -> Result<Vec<Record>, Error> {
                let keys: Vec<Vec<u8>> = sqlx::query_scalar(&AdminSql::new(self)?.list)
                    .bind(state_code(state))
                    .bind(after.map(|k| k.as_bytes().to_vec()))
                    .bind(i64::from(limit))
                    .fetch_all(self.pool())
                    .await?;
                records(self, keys).await
            }

            async fn stats(&self) -> Result<StoreStats, Error> {
                let counts = sqlx::query_as(&AdminSql::new(self)?.stats)
                    .fetch_one(self.pool())
                    .await?;
                // Not every build of SQLite can tell (dbstat is a compile-time option).
                let size: Option<i64> = sqlx::query_scalar($size)
                    .bind(self.table())
                    .fetch_one(self.pool())
                    .await
                    .ok()
                    .flatten();
                Ok(stats(counts, size))
            }

            async fn schema_version(&self) -> Result<i64, Error> {
                let version = AdminSql::new(self)?.version;
                Ok(sqlx::query_scalar(&version).fetch_one(self.pool()).await?)
            }
        }
    };
}

#[cfg(feature = "sqlite")]
sql_admin!(
    crate::SqliteStore,
    "SELECT sum(pgsize) FROM dbstat WHERE name = $1 OR tbl_name = $1"
);

#[cfg(feature = "postgres")]
sql_admin!(
    crate::PostgresStore,
    "SELECT pg_total_relation_size(to_regclass($1))"
);
