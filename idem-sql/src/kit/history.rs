//! A table of processed request ids, written in the caller's own transaction.

use std::fmt;
use std::marker::PhantomData;

use super::backend::Backend;
use super::{migrate, name, ConcurrencyError, Recorded};
use crate::migrate::Schema;
use crate::name::TableName;
use idem_core::Key;

/// The history's schema, oldest step first (as
/// [`Migration::parse`](crate::migrate::Migration::parse) reads it); `{index}` is
/// `<table>_created_at`, `{lease_table}` the pruner's `<table>_pruner`.
const MIGRATIONS: &str = "
-- Version 1: history table, its created_at index and the pruner's lease table.
CREATE TABLE IF NOT EXISTS {table} (
    scope TEXT NOT NULL,
    request_id TEXT NOT NULL,
    created_at {timestamp} NOT NULL,
    PRIMARY KEY (scope, request_id)
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (created_at);
CREATE TABLE IF NOT EXISTS {lease_table} (
    id INTEGER PRIMARY KEY,
    holder TEXT NOT NULL,
    lease_until {timestamp} NOT NULL
);
";

/// The table of processed request ids: `(scope, request_id)` is the primary key, `created_at`
/// the database time of the insert (indexed, for its [`pruner`](RequestHistory::pruner)).
///
/// Call [`record`](RequestHistory::record) first in the transaction that does the business
/// write. [`Recorded::Duplicate`] means the request was done before: skip the write. Both
/// commit together or not at all, so a request is applied exactly once. A concurrent duplicate
/// waits for the first transaction on the key and then sees it (PostgreSQL, READ COMMITTED), or
/// waits for the write lock (SQLite), so recording first is also the cheapest place to stop
/// one. Under REPEATABLE READ or SERIALIZABLE PostgreSQL reports a concurrent duplicate as a
/// serialization failure instead: retry the transaction.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem::kit::{Recorded, RequestHistory};
/// # use sqlx::Connection;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
/// sqlx::query("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)").execute(&mut conn).await?;
/// sqlx::query("INSERT INTO accounts VALUES ('alice', 0)").execute(&mut conn).await?;
/// let history = RequestHistory::<sqlx::Sqlite>::new("request_history")?;
/// history.ensure_schema(&mut conn).await?;
///
/// for _delivery in 0..3 {
///     let mut tx = conn.begin().await?;
///     if history.record(&mut tx, "deposit", "req-1").await? == Recorded::Duplicate {
///         continue; // already applied; dropping the transaction writes nothing
///     }
///     sqlx::query("UPDATE accounts SET balance = balance + 10 WHERE id = 'alice'").execute(&mut *tx).await?;
///     tx.commit().await?;
/// }
/// let balance: i64 = sqlx::query_scalar("SELECT balance FROM accounts").fetch_one(&mut conn).await?;
/// assert_eq!(balance, 10);
/// # Ok(()) }
/// # }
/// ```
pub struct RequestHistory<DB> {
    table: TableName,
    lease_table: TableName,
    created_at_index: TableName,
    _db: PhantomData<fn() -> DB>,
}

impl<DB> fmt::Debug for RequestHistory<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestHistory")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl<DB> Clone for RequestHistory<DB> {
    fn clone(&self) -> Self {
        RequestHistory {
            table: self.table.clone(),
            lease_table: self.lease_table.clone(),
            created_at_index: self.created_at_index.clone(),
            _db: PhantomData,
        }
    }
}

impl<DB: Backend> RequestHistory<DB> {
    /// The history kept in the table `table`, a plain SQL identifier (ASCII letters, digits
    /// and `_`, not starting with a digit) of at most 63 bytes. The pruner's lease lives in
    /// `<table>_pruner` and the applied migrations in `<table>_migrations`; a derived name
    /// longer than 63 bytes is cut short and ends in a hash of the whole (docs/stores.md).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use idem::kit::RequestHistory;
    /// assert!(RequestHistory::<sqlx::Sqlite>::new("request_history").is_ok());
    /// assert!(RequestHistory::<sqlx::Sqlite>::new(&"h".repeat(63)).is_ok());
    /// assert!(RequestHistory::<sqlx::Sqlite>::new(&"h".repeat(64)).is_err());
    /// # }
    /// ```
    pub fn new(table: &str) -> Result<RequestHistory<DB>, ConcurrencyError> {
        let table = name("history table", table)?;
        Ok(RequestHistory {
            lease_table: table.suffixed("_pruner"),
            created_at_index: table.suffixed("_created_at"),
            table,
            _db: PhantomData,
        })
    }

    /// Creates the history table, its `created_at` index and the pruner's lease table, if they
    /// do not exist: the history's migrations, applied once in one transaction and recorded in
    /// `<table>_migrations` (the stores' migrator), so any number of processes may run it at
    /// startup together.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// # use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
    /// let history = idem::kit::RequestHistory::<sqlx::Sqlite>::new("request_history")?;
    /// history.ensure_schema(&mut conn).await?;
    /// history.ensure_schema(&mut conn).await?; // idempotent
    /// # Ok(()) }
    /// # }
    /// ```
    pub async fn ensure_schema(&self, conn: &mut DB::Connection) -> Result<(), ConcurrencyError> {
        let schema = Schema {
            table: &self.table,
            names: &[
                ("{index}", self.created_at_index.clone()),
                ("{lease_table}", self.lease_table.clone()),
            ],
            migrations: MIGRATIONS,
        };
        migrate::<DB>(conn, &schema).await
    }

    /// Records that `request_id` of `scope` is being done, in the transaction `conn`:
    /// [`Recorded::New`] the first time, [`Recorded::Duplicate`] when it is already recorded.
    ///
    /// One statement, `INSERT … ON CONFLICT DO NOTHING`: a duplicate is not an error, so the
    /// caller's transaction stays usable (PostgreSQL aborts a transaction on any failed
    /// statement). `scope` and `request_id` are 1 to 255 bytes of printable ASCII; otherwise
    /// nothing is written. See [`RequestHistory`] for an example.
    pub async fn record(
        &self,
        conn: &mut DB::Connection,
        scope: &str,
        request_id: &str,
    ) -> Result<Recorded, ConcurrencyError> {
        // Validates both parts with the rules of idempotency keys.
        Key::derive(scope, "", request_id)?;
        let sql = format!(
            "INSERT INTO {t} (scope, request_id, created_at) VALUES ($1, $2, {now}) \
             ON CONFLICT (scope, request_id) DO NOTHING",
            t = self.table,
            now = DB::DIALECT.now
        );
        let query = DB::bind_str(DB::bind_str(sqlx::query(&sql), scope), request_id);
        Ok(if DB::execute(conn, query).await? == 1 {
            Recorded::New
        } else {
            Recorded::Duplicate
        })
    }

    /// Whether `request_id` of `scope` is recorded (and not pruned yet). One statement.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// # use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
    /// let history = idem::kit::RequestHistory::<sqlx::Sqlite>::new("request_history")?;
    /// history.ensure_schema(&mut conn).await?;
    /// assert!(!history.contains(&mut conn, "deposit", "req-1").await?);
    /// let _ = history.record(&mut conn, "deposit", "req-1").await?;
    /// assert!(history.contains(&mut conn, "deposit", "req-1").await?);
    /// # Ok(()) }
    /// # }
    /// ```
    pub async fn contains(
        &self,
        conn: &mut DB::Connection,
        scope: &str,
        request_id: &str,
    ) -> Result<bool, ConcurrencyError> {
        let sql = format!(
            "SELECT 1 FROM {t} WHERE scope = $1 AND request_id = $2",
            t = self.table
        );
        let query = DB::bind_str(DB::bind_str(sqlx::query(&sql), scope), request_id);
        Ok(DB::fetch_optional(conn, query).await?.is_some())
    }

    pub(crate) fn table(&self) -> &TableName {
        &self.table
    }

    pub(crate) fn lease_table(&self) -> &TableName {
        &self.lease_table
    }
}
