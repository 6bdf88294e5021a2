//! [`StoreAdmin`] for the SQL stores: one statement per call.
//!
//! A record is live while it holds its key (the records table's `holds_key`): an uncertain
//! claim (lapsed, never resolved) is listed and counted **in progress**, its work having
//! neither completed nor been released; a tombstone (completed, its result's retention over,
//! its key kept) is listed and counted **completed**, the work having completed, and `get`
//! reads it as `RecordState::Expired`. `expired` counts the rows that no longer hold their key
//! and wait for the pruner.

use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;

use crate::dialect::Backend;
use crate::row::holds_key;
use crate::SqlStore;
use idem_core::store::support::store_stats;
use idem_core::Error;
use idem_core::Key;
use idem_core::Record;
use idem_core::Store;
use idem_core::{ListQuery, ListState, StoreAdmin, StoreStats};

/// The records of `keys`, skipping any that expired or went away since they were listed.
async fn records(store: &dyn Store, keys: Vec<Vec<u8>>) -> Result<Vec<Record>, Error> {
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let key = <[u8; 32]>::try_from(key.as_slice()).map_err(|_| {
            crate::corrupt(format!("a stored key is {} bytes, expected 32", key.len()))
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
    fn new<DB: Backend>(store: &SqlStore<DB>) -> Result<AdminSql, Error> {
        let d = &DB::DIALECT;
        let t = store.protocol.table();
        let now = d.now;
        // Live: the record holds its key (uncertain claims and tombstones do).
        let live = holds_key(d);
        Ok(AdminSql {
            // The pruner's lease is a record of the table under a reserved key ($4): not
            // one of the application's, so neither listed nor counted.
            list: format!(
                "SELECT key FROM {t} AS r WHERE {live} AND key <> $4 \
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
                 FROM {t} AS r WHERE key <> $1",
                b = d.bigint,
                // The next end among the rows that end by time: a lease, a retention, or a
                // tombstone whose retention is over. A lapsed uncertain claim never ends.
                oldest = d.micros_of(&format!(
                    "min(CASE WHEN r.expires_at > {now} THEN \
                       CASE WHEN r.state = 1 AND r.result_until > {now} THEN r.result_until \
                            ELSE r.expires_at END END)"
                )),
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
    Ok(idem_core::store::support::records_lease_key()?
        .as_bytes()
        .to_vec())
}

fn state_code(state: Option<ListState>) -> Option<i64> {
    state.map(|s| match s {
        ListState::InProgress => 0,
        ListState::Completed => 1,
        // A state newer than this store (ListState is non-exhaustive): no row has it.
        _ => -1,
    })
}

fn stats(
    (in_progress, completed, expired, oldest_us): (i64, i64, i64, Option<i64>),
    table_bytes: Option<i64>,
) -> StoreStats {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    store_stats(
        count(in_progress),
        count(completed),
        count(expired),
        oldest_us
            .and_then(|us| u64::try_from(us).ok())
            .map(|us| UNIX_EPOCH + Duration::from_micros(us)),
        table_bytes.and_then(|b| u64::try_from(b).ok()),
    )
}

/// A row's column as the admin statements read it.
fn column<T>(read: Result<T, sqlx::Error>) -> Result<T, Error> {
    read.map_err(|e| Error::from(crate::error::sql_error(e)))
}

#[async_trait]
impl<DB: Backend> StoreAdmin for SqlStore<DB> {
    async fn list(&self, query: ListQuery<'_>) -> Result<Vec<Record>, Error> {
        let sql = AdminSql::new(self)?.list;
        let after = query.after.map(|k| k.as_bytes().to_vec());
        let lease = pruner_lease()?;
        let mut statement = sqlx::query::<DB>(&sql);
        statement = DB::bind_opt_i64(statement, state_code(query.state));
        statement = DB::bind_opt_bytes(statement, after.as_deref());
        statement = DB::bind_i64(statement, i64::from(query.limit));
        statement = DB::bind_bytes(statement, &lease);
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let rows = column(DB::fetch_all(&mut conn, statement).await)?;
        drop(conn);
        let keys = rows
            .iter()
            .map(|row| column(DB::get_bytes(row, 0)))
            .collect::<Result<Vec<_>, _>>()?;
        records(self, keys).await
    }

    async fn stats(&self) -> Result<StoreStats, Error> {
        let sql = AdminSql::new(self)?.stats;
        let lease = pruner_lease()?;
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let statement = DB::bind_bytes(sqlx::query::<DB>(&sql), &lease);
        let row = column(DB::fetch_optional(&mut conn, statement).await)?
            .ok_or_else(|| crate::corrupt("the statistics query returned no row".to_owned()))?;
        let counts = (
            column(DB::get_i64(&row, 0))?,
            column(DB::get_i64(&row, 1))?,
            column(DB::get_i64(&row, 2))?,
            column(DB::get_opt_i64(&row, 3))?,
        );
        // Not every database can tell (SQLite's dbstat is a compile-time option): unknown then.
        let statement = DB::bind_str(sqlx::query::<DB>(DB::DIALECT.table_size), self.table());
        let size = match DB::fetch_optional(&mut conn, statement).await {
            Ok(Some(row)) => DB::get_opt_i64(&row, 0).ok().flatten(),
            _ => None,
        };
        Ok(stats(counts, size))
    }

    async fn schema_version(&self) -> Result<i64, Error> {
        let sql = AdminSql::new(self)?.version;
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let row = column(DB::fetch_optional(&mut conn, sqlx::query::<DB>(&sql)).await)?
            .ok_or_else(|| crate::corrupt("the schema version query returned no row".to_owned()))?;
        column(DB::get_i64(&row, 0))
    }
}
