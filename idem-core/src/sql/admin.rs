//! [`StoreAdmin`] for the SQL stores: one statement per call.

use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;

use crate::error::Error;
use crate::key::Key;
use crate::record::Record;
use crate::sql::dialect::private::Ops;
use crate::sql::protocol::SqlBackend;
use crate::store::admin::{ListQuery, ListState, StoreAdmin, StoreStats};
use crate::store::support::store_stats;
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
    Ok(crate::store::support::records_lease_key()?
        .as_bytes()
        .to_vec())
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
