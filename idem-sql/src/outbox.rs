//! The transactional outbox on SQLite and PostgreSQL (docs/outbox.md): messages added in the
//! caller's own transaction with one statement, read, marked and pruned by the
//! [`Dispatcher`](idem_core::Dispatcher) through [`OutboxSource`].

use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::Pool;

use crate::dialect::{Backend, SqlQuery};
use crate::error::sql_error;
use crate::migrate::Schema;
use crate::name::TableName;
use idem_core::{Error, MessageId, OutboxMessage, OutboxSource, PendingMessage};

/// The outbox's schema, oldest step first. Its columns are those Debezium's outbox event router
/// reads (`id`, `aggregatetype`, `aggregateid`, `type`, `payload`), so change data capture can
/// read the table as it is; `seq` orders it, `sent_at` is set once the dispatcher published a
/// row. `{pending}` indexes the unsent rows in order, `{sent}` the sent ones by age.
const MIGRATIONS: &str = "
-- Version 1: outbox table, its unsent and sent indexes.
CREATE TABLE IF NOT EXISTS {table} (
    seq {serial} PRIMARY KEY,
    id {uuid} NOT NULL UNIQUE,
    aggregatetype TEXT NOT NULL,
    aggregateid TEXT NOT NULL,
    type TEXT NOT NULL,
    payload {bytes} NOT NULL,
    created_at {timestamp} NOT NULL,
    sent_at {timestamp}
);
CREATE INDEX IF NOT EXISTS {pending} ON {table} (seq) WHERE sent_at IS NULL;
CREATE INDEX IF NOT EXISTS {sent} ON {table} (sent_at) WHERE sent_at IS NOT NULL;
";

/// The most messages one [`SqlOutbox::add`] writes (five parameters each, within SQLite's
/// 32,766).
pub const MAX_OUTBOX_MESSAGES_PER_ADD: usize = 1_000;

/// An outbox table on SQLite or PostgreSQL ([`SqliteOutbox`], [`PostgresOutbox`]).
///
/// [`add`](Self::add) writes messages in the caller's transaction, beside its business write
/// and (in the transactional mode) the claim's completion: one statement, `INSERT … ON
/// CONFLICT (id) DO NOTHING`, so a retried operation, whose messages carry the same
/// [`MessageId`]s, adds no second copy, and a transaction that rolls back leaves no message. A
/// [`Dispatcher`](idem_core::Dispatcher) publishes them through this type's [`OutboxSource`]:
/// one statement to read a page of unsent rows in order, one to mark a page sent, one per
/// batch of old sent rows deleted.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem::{Key, MessageId, OutboxMessage, OutboxSource, SqliteOutbox};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await.map_err(idem::sql_error)?;
/// let outbox = SqliteOutbox::new(pool.clone(), "outbox").await?;
/// let key = Key::derive("orders", "shop-1", "req-9")?;
/// let placed = OutboxMessage::new(MessageId::derive(&key, "placed"), "order", "o-17", "OrderPlaced", b"{}".to_vec())?;
///
/// let mut tx = pool.begin().await.map_err(idem::sql_error)?;
/// // … the business write …
/// assert_eq!(outbox.add(&mut tx, &[placed.clone()]).await?, 1);
/// tx.commit().await.map_err(idem::sql_error)?;
///
/// // A retry of the operation adds nothing.
/// assert_eq!(outbox.add(&mut *pool.acquire().await.map_err(idem::sql_error)?, &[placed]).await?, 0);
/// assert_eq!(outbox.pending(10).await?.len(), 1);
/// # Ok(()) }
/// # }
/// ```
pub struct SqlOutbox<DB: Backend> {
    pool: Pool<DB>,
    table: TableName,
    pending_sql: String,
    prune_sql: String,
}

/// [`SqlOutbox`] on SQLite.
#[cfg(feature = "sqlite")]
pub type SqliteOutbox = SqlOutbox<sqlx::Sqlite>;

/// [`SqlOutbox`] on PostgreSQL.
#[cfg(feature = "postgres")]
pub type PostgresOutbox = SqlOutbox<sqlx::Postgres>;

impl<DB: Backend> fmt::Debug for SqlOutbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlOutbox")
            .field("table", &self.table.as_configured())
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> Clone for SqlOutbox<DB> {
    fn clone(&self) -> Self {
        SqlOutbox {
            pool: self.pool.clone(),
            table: self.table.clone(),
            pending_sql: self.pending_sql.clone(),
            prune_sql: self.prune_sql.clone(),
        }
    }
}

impl<DB: Backend> SqlOutbox<DB> {
    /// The outbox in `table` (a plain SQL identifier of at most 63 bytes; on PostgreSQL
    /// `schema.table` too) on `pool`, created if it does not exist: its migrations, applied
    /// once and recorded in `<table>_migrations`, so any number of processes may call this at
    /// startup. A bad name is [`Error::InvalidConfig`].
    pub async fn new(pool: Pool<DB>, table: &str) -> Result<SqlOutbox<DB>, Error> {
        let table = table_name::<DB>(table)?;
        let schema = Schema {
            table: &table,
            names: &[
                ("{pending}", table.suffixed("_pending")),
                ("{sent}", table.suffixed("_sent")),
            ],
            migrations: MIGRATIONS,
        };
        let mut conn = pool.acquire().await.map_err(sql_error)?;
        schema.migrate::<DB>(&mut *conn).await?;
        drop(conn);
        let d = &DB::DIALECT;
        Ok(SqlOutbox {
            pending_sql: format!(
                "SELECT seq, id, aggregatetype, aggregateid, type, payload, {added} FROM {table} \
                 WHERE sent_at IS NULL ORDER BY seq LIMIT $1",
                added = d.micros_of("created_at"),
            ),
            prune_sql: format!(
                "DELETE FROM {table} WHERE seq IN (SELECT seq FROM {table} \
                 WHERE sent_at IS NOT NULL AND sent_at <= {cutoff} ORDER BY sent_at LIMIT $2{lock})",
                cutoff = d.now_minus("$1"),
                lock = d.lock_batch,
            ),
            pool,
            table,
        })
    }

    /// The table, as configured.
    pub fn table(&self) -> &str {
        self.table.as_configured()
    }

    /// Adds `messages` (at most [`MAX_OUTBOX_MESSAGES_PER_ADD`]) in the transaction `conn`,
    /// each unless a message with its id is there already: one statement. Returns how many
    /// were added. A message that fails [`OutboxMessage::check`] is [`Error::InvalidConfig`],
    /// and nothing is written.
    pub async fn add(
        &self,
        conn: &mut DB::Connection,
        messages: &[OutboxMessage],
    ) -> Result<u64, Error> {
        if messages.is_empty() {
            return Ok(0);
        }
        if messages.len() > MAX_OUTBOX_MESSAGES_PER_ADD {
            return Err(Error::InvalidConfig(format!(
                "an outbox add takes at most {MAX_OUTBOX_MESSAGES_PER_ADD} messages, not {}: \
                 split them",
                messages.len()
            )));
        }
        for m in messages {
            m.check()?;
        }
        let now = DB::DIALECT.now;
        let rows: Vec<String> = (0..messages.len())
            .map(|i| {
                let p = i * 5;
                format!(
                    "(${}, ${}, ${}, ${}, ${}, {now})",
                    p + 1,
                    p + 2,
                    p + 3,
                    p + 4,
                    p + 5
                )
            })
            .collect();
        let sql = format!(
            "INSERT INTO {t} (id, aggregatetype, aggregateid, type, payload, created_at) \
             VALUES {rows} ON CONFLICT (id) DO NOTHING",
            t = self.table,
            rows = rows.join(", "),
        );
        let mut query: SqlQuery<'_, DB> = sqlx::query(&sql);
        for m in messages {
            query = DB::bind_uuid(query, m.id.as_uuid());
            query = DB::bind_str(query, &m.aggregate_type);
            query = DB::bind_str(query, &m.aggregate_id);
            query = DB::bind_str(query, &m.kind);
            query = DB::bind_bytes(query, &m.payload);
        }
        Ok(DB::execute(conn, query).await.map_err(sql_error)?)
    }
}

/// The outbox's table name: `schema.table` is allowed on PostgreSQL.
fn table_name<DB: Backend>(table: &str) -> Result<TableName, Error> {
    let qualified = DB::DIALECT.store == "PostgresStore";
    #[cfg(feature = "postgres")]
    if qualified {
        return TableName::qualified("outbox table", table);
    }
    let _ = qualified;
    TableName::new("outbox table", table)
}

#[async_trait]
impl<DB: Backend> OutboxSource for SqlOutbox<DB> {
    async fn pending(&self, limit: u32) -> Result<Vec<PendingMessage>, Error> {
        let query = DB::bind_i64(sqlx::query(&self.pending_sql), i64::from(limit));
        let mut conn = self.pool.acquire().await.map_err(sql_error)?;
        let rows = DB::fetch_all(&mut *conn, query).await.map_err(sql_error)?;
        rows.iter()
            .map(|row| {
                let seq = DB::get_i64(row, 0)?;
                let added = DB::get_i64(row, 6)?;
                Ok(PendingMessage {
                    seq: u64::try_from(seq).unwrap_or_default(),
                    added_at: UNIX_EPOCH
                        + Duration::from_micros(u64::try_from(added).unwrap_or_default()),
                    message: OutboxMessage {
                        id: MessageId::from_uuid(DB::get_uuid(row, 1)?),
                        aggregate_type: DB::get_string(row, 2)?,
                        aggregate_id: DB::get_string(row, 3)?,
                        kind: DB::get_string(row, 4)?,
                        payload: DB::get_bytes(row, 5)?,
                    },
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(|e| Error::Store(sql_error(e)))
    }

    async fn mark_sent(&self, ids: &[MessageId]) -> Result<u64, Error> {
        let mut marked = 0;
        let mut conn = self.pool.acquire().await.map_err(sql_error)?;
        for chunk in ids.chunks(MAX_OUTBOX_MESSAGES_PER_ADD) {
            let params: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "UPDATE {t} SET sent_at = {now} WHERE sent_at IS NULL AND id IN ({params})",
                t = self.table,
                now = DB::DIALECT.now,
                params = params.join(", "),
            );
            let mut query: SqlQuery<'_, DB> = sqlx::query(&sql);
            for id in chunk {
                query = DB::bind_uuid(query, id.as_uuid());
            }
            marked += DB::execute(&mut *conn, query).await.map_err(sql_error)?;
        }
        Ok(marked)
    }

    async fn prune_sent(&self, age: Duration, limit: u32) -> Result<u64, Error> {
        let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        let query = DB::bind_i64(
            DB::bind_i64(sqlx::query(&self.prune_sql), age_ms),
            i64::from(limit),
        );
        let mut conn = self.pool.acquire().await.map_err(sql_error)?;
        Ok(DB::execute(&mut *conn, query).await.map_err(sql_error)?)
    }
}
