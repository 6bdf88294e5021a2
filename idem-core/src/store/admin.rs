//! What an operator reads of a store: records by state, page by page, and counts. The `idem`
//! command is built on this. The SQL stores answer with a statement each (below); the Redis and
//! DynamoDB stores scan (idem-redis's and idem-dynamodb's `admin.rs`), on `scan` below (`idem::store::support` to them).

use std::time::SystemTime;

use async_trait::async_trait;

use crate::error::Error;
use crate::key::Key;
use crate::record::Record;
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

/// Which records [`StoreAdmin::list`] returns: up to `limit` live records of one state (or of
/// any), in key order, starting after `after`.
///
/// ```
/// use idem::{ListQuery, ListState};
///
/// let first_page = ListQuery { state: Some(ListState::InProgress), after: None, limit: 50 };
/// assert_eq!(first_page.after, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListQuery<'a> {
    /// Records of this state only; `None` for records of any state.
    pub state: Option<ListState>,
    /// The last key of the previous page; `None` for the first page.
    pub after: Option<&'a Key>,
    /// The most records a page holds.
    pub limit: u32,
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
    /// The store's size in bytes, when it tells: the table with its indexes on disk (SQL), the
    /// memory of the records' keys (Redis, `MEMORY USAGE`), the table's size as DynamoDB last
    /// measured it (about every six hours).
    pub table_bytes: Option<u64>,
}

/// A [`StoreStats`] of a store of another crate, which cannot build the `#[non_exhaustive]`
/// struct itself: its fields in order (`idem::store::support`; a field added later is a new
/// argument here).
pub fn store_stats(
    in_progress: u64,
    completed: u64,
    expired: u64,
    oldest_expiry: Option<SystemTime>,
    table_bytes: Option<u64>,
) -> StoreStats {
    StoreStats {
        in_progress,
        completed,
        expired,
        oldest_expiry,
        table_bytes,
    }
}

/// Reading a store as an operator does (the `idem` command's `list`, `stats` and `migrate`).
/// Implemented by [`SqliteStore`](crate::SqliteStore) and
/// [`PostgresStore`](crate::PostgresStore) with one statement per call, and by
/// `RedisStore` (idem-redis) and `DynamoStore` (idem-dynamodb) with a scan of the
/// whole prefix or table (each documents its round trips, and what it keeps of the order).
///
/// ```
/// use idem::{Error, StoreAdmin};
///
/// /// One line for a dashboard: how many keys are running, and how many replay.
/// async fn summary(store: &dyn StoreAdmin) -> Result<String, Error> {
///     let stats = store.stats().await?;
///     Ok(format!("{} running, {} completed", stats.in_progress, stats.completed))
/// }
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// # use idem::{Idempotency, Key, SqliteStore};
/// # let store = SqliteStore::open(":memory:").await?;
/// # Idempotency::new(store.clone()).call(Key::derive("s", "", "k")?).run(async { Ok::<_, Error>(1) }).await?;
/// # assert_eq!(summary(&store).await?, "0 running, 1 completed");
/// # let all = idem::ListQuery { state: None, after: None, limit: 10 };
/// # assert_eq!(store.list(all).await?.len(), 1);
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))] fn main() {}
/// ```
#[async_trait]
pub trait StoreAdmin: Store {
    /// Up to `query.limit` live records (of one state, or all), in key order, starting after
    /// `query.after` (the last key of the previous page). SQL: one statement for the keys, one
    /// read per record.
    async fn list(&self, query: ListQuery<'_>) -> Result<Vec<Record>, Error>;

    /// Counts by state, the oldest expiry, and the store's size. SQL: one statement (two on
    /// PostgreSQL, for the size).
    async fn stats(&self) -> Result<StoreStats, Error>;

    /// The highest schema version applied to the records table (SQL), or the version of the
    /// record layout the store writes (Redis, DynamoDB: a constant, no migrations).
    async fn schema_version(&self) -> Result<i64, Error>;
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql {
    //! `StoreAdmin` for the SQL stores: one statement per call.

    use std::time::{Duration, UNIX_EPOCH};

    use async_trait::async_trait;

    use super::{ListQuery, ListState, StoreAdmin, StoreStats};
    use crate::error::Error;
    use crate::key::Key;
    use crate::record::Record;
    use crate::sql::dialect::private::Ops;
    use crate::sql::protocol::SqlBackend;
    use crate::store::Store;

    /// The records of `keys`, skipping any that expired or went away since they were listed.
    async fn records(store: &dyn Store, keys: Vec<Vec<u8>>) -> Result<Vec<Record>, Error> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let key = <[u8; 32]>::try_from(key.as_slice()).map_err(|_| {
                crate::sql::corrupt(format!("a stored key is {} bytes, expected 32", key.len()))
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
                // The pruner's lease is a record of the table under a reserved key ($4): not
                // one of the application's, so neither listed nor counted.
                list: format!(
                    "SELECT key FROM {t} WHERE {live} AND key <> $4 \
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
                     FROM {t} WHERE key <> $1",
                    b = d.bigint,
                    oldest = d.micros_of(&format!("min(CASE WHEN {live} THEN expires_at END)")),
                ),
                version: format!(
                    "SELECT CAST(coalesce(max(version), 0) AS {}) FROM {}",
                    d.bigint,
                    t.suffixed("_migrations")
                ),
            })
        }
    }

    /// The key of the records pruner's lease row, as stored.
    fn pruner_lease() -> Result<Vec<u8>, Error> {
        Ok(crate::background::records_lease_key()?.as_bytes().to_vec())
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
                async fn list(&self, query: ListQuery<'_>) -> Result<Vec<Record>, Error> {
                    let keys: Vec<Vec<u8>> = sqlx::query_scalar(&AdminSql::new(self)?.list)
                        .bind(state_code(query.state))
                        .bind(query.after.map(|k| k.as_bytes().to_vec()))
                        .bind(i64::from(query.limit))
                        .bind(pruner_lease()?)
                        .fetch_all(self.pool())
                        .await
                        .map_err(crate::sql::error::sql_error)?;
                    records(self, keys).await
                }

                async fn stats(&self) -> Result<StoreStats, Error> {
                    let counts = sqlx::query_as(&AdminSql::new(self)?.stats)
                        .bind(pruner_lease()?)
                        .fetch_one(self.pool())
                        .await
                        .map_err(crate::sql::error::sql_error)?;
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
                    Ok(sqlx::query_scalar(&version)
                        .fetch_one(self.pool())
                        .await
                        .map_err(crate::sql::error::sql_error)?)
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
}

pub(crate) mod scan {
    //! What the scanning stores (Redis, DynamoDB) share: the page kept of a scan, the reads of
    //! its records, and the key's hex form.

    use std::collections::BTreeSet;

    use crate::error::Error;
    use crate::key::Key;
    use crate::record::Record;
    use crate::store::Store;

    /// The `limit` smallest keys after `after` among those a scan offers, in order: what the scanning
    /// stores keep of a listing (memory for `limit` keys, whatever the number of records; a key
    /// offered twice counts once).
    pub struct Smallest {
        keys: BTreeSet<Key>,
        after: Option<Key>,
        limit: usize,
    }

    impl Smallest {
        /// An empty page of at most `limit` keys, all greater than `after` (when given).
        pub fn new(after: Option<&Key>, limit: u32) -> Smallest {
            Smallest {
                keys: BTreeSet::new(),
                after: after.copied(),
                limit: usize::try_from(limit).unwrap_or(usize::MAX),
            }
        }

        /// Keeps `key` if it belongs on the page: after the cursor, not kept already, and
        /// smaller than the largest kept when the page is full (which it then replaces).
        pub fn offer(&mut self, key: Key) {
            if self.limit == 0 || self.after.is_some_and(|a| key <= a) || self.keys.contains(&key) {
                return;
            }
            if self.keys.len() == self.limit {
                match self.keys.last() {
                    Some(largest) if key < *largest => {
                        self.keys.pop_last();
                    }
                    _ => return,
                }
            }
            self.keys.insert(key);
        }

        /// The keys kept, smallest first.
        pub fn into_keys(self) -> impl Iterator<Item = Key> {
            self.keys.into_iter()
        }
    }

    /// The live records of `keys` (read one by one with [`Store::get`]), skipping any that ended or
    /// went away since the scan saw them.
    pub async fn live_records(
        store: &dyn Store,
        keys: impl Iterator<Item = Key>,
    ) -> Result<Vec<Record>, Error> {
        let mut out = Vec::new();
        for key in keys {
            if let Some(record) = store.get(&key).await? {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// A key from the 64 lowercase hex digits the scanning stores write it as.
    pub fn key_from_hex(hex: &str) -> Option<Key> {
        let hex = hex.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.chunks_exact(2)) {
            *byte = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(Key::from_bytes(bytes))
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        #[test]
        fn smallest_keeps_the_limit_smallest_after_the_cursor() {
            let k = |b: u8| Key::from_bytes([b; 32]);
            let mut page = Smallest::new(Some(&k(2)), 3);
            for b in [9, 1, 7, 2, 5, 3, 5, 8] {
                page.offer(k(b));
            }
            assert_eq!(page.into_keys().collect::<Vec<_>>(), [k(3), k(5), k(7)]);
            let mut none = Smallest::new(None, 0);
            none.offer(k(1));
            assert_eq!(none.into_keys().count(), 0);
        }

        #[test]
        fn keys_round_trip_through_hex() {
            let key = Key::derive("s", "c", "k").unwrap();
            assert_eq!(key_from_hex(&key.to_string()), Some(key));
            assert_eq!(key_from_hex("ab"), None);
            assert_eq!(key_from_hex(&"G".repeat(64)), None);
        }
    }
}
