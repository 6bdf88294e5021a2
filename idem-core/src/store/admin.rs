//! What an operator reads of a SQL store: records by state, page by page, and counts. The `idem`
//! command is built on this.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::error::Error;
use crate::key::Key;
use crate::record::Record;
#[cfg(feature = "sqlite")]
use crate::store::sql::dialect::private::Ops;
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

fn state_code(state: Option<ListState>) -> Option<i16> {
    state.map(|s| match s {
        ListState::InProgress => 0,
        ListState::Completed => 1,
    })
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl StoreAdmin for crate::SqliteStore {
    async fn list(
        &self,
        state: Option<ListState>,
        after: Option<&Key>,
        limit: u32,
    ) -> Result<Vec<Record>, Error> {
        let now = <sqlx::Sqlite as Ops>::DIALECT.now;
        let sql = format!(
            r#"SELECT key FROM "{}" WHERE expires_at > {now}
               AND (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR key > ?2)
               ORDER BY key LIMIT ?3"#,
            self.table()
        );
        let keys: Vec<Vec<u8>> = sqlx::query_scalar(&sql)
            .bind(state_code(state))
            .bind(after.map(|k| k.as_bytes().to_vec()))
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await?;
        records(self, keys).await
    }

    async fn stats(&self) -> Result<StoreStats, Error> {
        let now = <sqlx::Sqlite as Ops>::DIALECT.now;
        let sql = format!(
            r#"SELECT
                 coalesce(sum(state = 0 AND expires_at > {now}), 0),
                 coalesce(sum(state = 1 AND expires_at > {now}), 0),
                 coalesce(sum(expires_at <= {now}), 0),
                 (SELECT min(expires_at) FROM "{t}" WHERE expires_at > {now})
               FROM "{t}""#,
            t = self.table()
        );
        let (in_progress, completed, expired, oldest): (i64, i64, i64, Option<i64>) =
            sqlx::query_as(&sql).fetch_one(self.pool()).await?;
        // dbstat is a compile-time option of SQLite; without it the size is unknown.
        let table_bytes: Option<i64> =
            sqlx::query_scalar("SELECT sum(pgsize) FROM dbstat WHERE name = ?1 OR tbl_name = ?1")
                .bind(self.table())
                .fetch_one(self.pool())
                .await
                .ok()
                .flatten();
        Ok(StoreStats {
            in_progress: count(in_progress),
            completed: count(completed),
            expired: count(expired),
            oldest_expiry: oldest
                .and_then(|ms| u64::try_from(ms).ok())
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
            table_bytes: table_bytes.and_then(|b| u64::try_from(b).ok()),
        })
    }

    async fn schema_version(&self) -> Result<i64, Error> {
        let sql = format!(
            r#"SELECT coalesce(max(version), 0) FROM "{}_migrations""#,
            self.table()
        );
        Ok(sqlx::query_scalar(&sql).fetch_one(self.pool()).await?)
    }
}

/// `schema.table` or `table`, each part quoted (validated names hold no quote).
#[cfg(feature = "postgres")]
fn pg_quoted(table: &str, suffix: &str) -> String {
    match table.split_once('.') {
        Some((schema, name)) => format!("\"{schema}\".\"{name}{suffix}\""),
        None => format!("\"{table}{suffix}\""),
    }
}

#[cfg(feature = "postgres")]
#[async_trait]
impl StoreAdmin for crate::PostgresStore {
    async fn list(
        &self,
        state: Option<ListState>,
        after: Option<&Key>,
        limit: u32,
    ) -> Result<Vec<Record>, Error> {
        let sql = format!(
            "SELECT key FROM {} WHERE expires_at > clock_timestamp() \
             AND ($1::smallint IS NULL OR state = $1) AND ($2::bytea IS NULL OR key > $2) \
             ORDER BY key LIMIT $3",
            pg_quoted(self.table(), "")
        );
        let keys: Vec<Vec<u8>> = sqlx::query_scalar(&sql)
            .bind(state_code(state))
            .bind(after.map(|k| k.as_bytes().to_vec()))
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await?;
        records(self, keys).await
    }

    async fn stats(&self) -> Result<StoreStats, Error> {
        let t = pg_quoted(self.table(), "");
        let sql = format!(
            "SELECT \
               count(*) FILTER (WHERE state = 0 AND expires_at > clock_timestamp()), \
               count(*) FILTER (WHERE state = 1 AND expires_at > clock_timestamp()), \
               count(*) FILTER (WHERE expires_at <= clock_timestamp()), \
               (extract(epoch FROM min(expires_at) FILTER (WHERE expires_at > clock_timestamp())) \
                 * 1000)::bigint, \
               pg_total_relation_size('{}') \
             FROM {t}",
            t.replace('\'', "''")
        );
        let (in_progress, completed, expired, oldest, bytes): (i64, i64, i64, Option<i64>, i64) =
            sqlx::query_as(&sql).fetch_one(self.pool()).await?;
        Ok(StoreStats {
            in_progress: count(in_progress),
            completed: count(completed),
            expired: count(expired),
            oldest_expiry: oldest
                .and_then(|ms| u64::try_from(ms).ok())
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
            table_bytes: u64::try_from(bytes).ok(),
        })
    }

    async fn schema_version(&self) -> Result<i64, Error> {
        let sql = format!(
            "SELECT coalesce(max(version), 0)::bigint FROM {}",
            pg_quoted(self.table(), "_migrations")
        );
        Ok(sqlx::query_scalar(&sql).fetch_one(self.pool()).await?)
    }
}
