//! The databases the SQL stores and the kit run on, and the few things that differ between them.
//!
//! The store protocol, the migrator and the kit are written once, generic over [`Backend`]. What
//! differs per database (the clock expression, placeholders, column types, how a failed
//! statement affects a transaction) is a [`Dialect`], and the handful of sqlx calls that cannot
//! be made generic without a wall of bounds are methods of a sealed trait, stamped out per
//! database.

use std::future::Future;
use std::pin::Pin;

use uuid::Uuid;

/// A boxed, `Send` future borrowing a connection for `'a`.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A query with its bound arguments, as [`Entity::bind`](crate::kit::Entity::bind) receives it.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem::kit::SqlQuery;
/// use sqlx::Sqlite;
/// fn bind_balance(q: SqlQuery<'_, Sqlite>, balance: i64) -> SqlQuery<'_, Sqlite> {
///     q.bind(balance)
/// }
/// # let _ = bind_balance(sqlx::query("SELECT $1"), 5);
/// # }
/// ```
pub type SqlQuery<'q, DB> = sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>;

/// A database the kit runs on: `sqlx::Sqlite` (feature `sqlite`) and `sqlx::Postgres`
/// (feature `postgres`). Sealed: the kit's SQL is written for exactly these two.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// fn runs_on<DB: idem::kit::Backend>() {}
/// runs_on::<sqlx::Sqlite>();
/// # }
/// ```
pub trait Backend: sqlx::Database + private::Ops {}

/// SQL fragments that differ between databases. Placeholders are not among them: statements are
/// written once with numbered placeholders (`$1`), which sqlx binds by their number on SQLite as
/// on PostgreSQL, whatever order they appear in.
pub struct Dialect {
    /// The database's current time, read at each statement (never frozen per transaction).
    pub now: &'static str,
    /// Column type of a timestamp.
    pub timestamp: &'static str,
    /// Column type of a 64-bit integer.
    pub bigint: &'static str,
    /// Column type of a byte string.
    pub bytes: &'static str,
    /// Column type of a UUID.
    pub uuid: &'static str,
    /// Column type of a 64-bit key the database numbers itself, ascending (with `PRIMARY KEY`
    /// after it).
    pub serial: &'static str,
    /// Turns a bound BIGINT of milliseconds into something `now` can be offset by.
    pub millis: &'static str,
    /// `{}` is a timestamp expression or a difference of two: its microseconds (since the Unix
    /// epoch, or in the difference) as a BIGINT.
    pub micros: &'static str,
    /// Appended to the subselect that picks a batch to delete.
    pub lock_batch: &'static str,
    /// Appended to a `SELECT` whose rows the transaction locks until it ends.
    pub lock_rows: &'static str,
    /// Whether a failed statement aborts the whole enclosing transaction (PostgreSQL) rather
    /// than only itself (SQLite).
    pub failed_statement_aborts_transaction: bool,
    /// The statement that opens a transaction which takes the write lock at once (migrations).
    pub begin_write: &'static str,
    /// A query of whether a table exists, naming it `{table}` (quoted) and `{name}` (bare),
    /// each inside a string literal (a validated name holds no quote).
    pub table_exists: &'static str,
    /// Whether a claim can read the live row in the same statement (a data-modifying CTE).
    pub claim_reads_live: bool,
    /// Whether `now` is one instant throughout a statement (SQLite: "now" is the same for
    /// every call within one `sqlite3_step`), so a statement may read it twice for one time;
    /// PostgreSQL's `clock_timestamp()` reads the clock anew at each call.
    pub now_is_one_instant: bool,
    /// Whether the pruner's statements bound their search of the pruner's index by a value
    /// (`$2`) that the pruner binds to [`now`](Self::now), read by a statement of its own just
    /// before (SQLite: it range-searches an index on an expression up to a value, but not up to
    /// `unixepoch('subsec')` nor a subquery of it, and an idle pass would then read the whole
    /// index); otherwise by the clock read once per statement, `(SELECT now)` (PostgreSQL:
    /// compared row by row the volatile `clock_timestamp()` cannot bound an index scan at all).
    pub pruner_binds_now: bool,
    /// Whether the database has one write lock for all its writers (SQLite): a store's writers
    /// in this process may then take turns for it (`Protocol::write_turn`, when the store is
    /// built so) instead of meeting it taken and sleeping in the database's busy handler.
    pub single_writer: bool,
    /// The store's name, as `Debug` shows it (its alias: `SqliteStore`, `PostgresStore`).
    pub store: &'static str,
    /// The builder's name, as `Debug` shows it.
    pub builder: &'static str,
    /// How many expired records a prune batch deletes ([`Store::prune_batch_size`](idem_core::Store::prune_batch_size)).
    pub prune_batch_size: u32,
    /// The table's size on disk in bytes, `$1` naming the table as configured (or NULL where
    /// the database cannot tell).
    pub table_size: &'static str,
}

impl Dialect {
    /// `now + $param milliseconds`.
    pub fn now_plus(&self, param: &str) -> String {
        format!("({} + {param}{})", self.now, self.millis)
    }

    /// `at + param milliseconds`, for a time `at` read once and used twice in a statement (on
    /// PostgreSQL each `clock_timestamp()` reads the clock anew).
    pub(crate) fn at_plus(&self, at: &str, param: &str) -> String {
        format!("({at} + {param}{})", self.millis)
    }

    /// `now - $param milliseconds`.
    pub fn now_minus(&self, param: &str) -> String {
        format!("({} - {param}{})", self.now, self.millis)
    }

    /// The microseconds of the timestamp (or interval) `expr`, as a BIGINT.
    pub(crate) fn micros_of(&self, expr: &str) -> String {
        self.micros.replace("{}", expr)
    }

    /// `template` with `{now}` and the column types (`{timestamp}`, `{bigint}`, `{bytes}`,
    /// `{uuid}`, `{serial}`) of this database in place.
    pub(crate) fn render(&self, template: &str) -> String {
        template
            .replace("{now}", self.now)
            .replace("{timestamp}", self.timestamp)
            .replace("{bigint}", self.bigint)
            .replace("{bytes}", self.bytes)
            .replace("{uuid}", self.uuid)
            .replace("{serial}", self.serial)
    }
}

pub(crate) mod private {
    use super::*;

    /// The sqlx calls the stores and the kit make, one implementation per database. Not
    /// nameable outside the crate, which seals [`Backend`].
    pub trait Ops: sqlx::Database + sqlx::database::HasStatementCache {
        const DIALECT: Dialect;

        /// A store builder's settings of this database alone.
        type Settings: std::fmt::Debug + Clone + Send + Sync + 'static;

        fn execute<'e, 'q: 'e>(
            conn: &'e mut Self::Connection,
            query: SqlQuery<'q, Self>,
        ) -> BoxFuture<'e, Result<u64, sqlx::Error>>;

        fn fetch_optional<'e, 'q: 'e>(
            conn: &'e mut Self::Connection,
            query: SqlQuery<'q, Self>,
        ) -> BoxFuture<'e, Result<Option<Self::Row>, sqlx::Error>>;

        fn fetch_all<'e, 'q: 'e>(
            conn: &'e mut Self::Connection,
            query: SqlQuery<'q, Self>,
        ) -> BoxFuture<'e, Result<Vec<Self::Row>, sqlx::Error>>;

        fn bind_i64(query: SqlQuery<'_, Self>, value: i64) -> SqlQuery<'_, Self>;
        fn bind_opt_i64(query: SqlQuery<'_, Self>, value: Option<i64>) -> SqlQuery<'_, Self>;
        fn bind_bool(query: SqlQuery<'_, Self>, value: bool) -> SqlQuery<'_, Self>;
        fn bind_str<'q>(query: SqlQuery<'q, Self>, value: &'q str) -> SqlQuery<'q, Self>;
        fn bind_bytes<'q>(query: SqlQuery<'q, Self>, value: &'q [u8]) -> SqlQuery<'q, Self>;
        fn bind_opt_bytes<'q>(
            query: SqlQuery<'q, Self>,
            value: Option<&'q [u8]>,
        ) -> SqlQuery<'q, Self>;
        fn bind_uuid(query: SqlQuery<'_, Self>, value: Uuid) -> SqlQuery<'_, Self>;

        fn get_i64(row: &Self::Row, index: usize) -> Result<i64, sqlx::Error>;
        fn get_opt_i64(row: &Self::Row, index: usize) -> Result<Option<i64>, sqlx::Error>;
        fn get_bool(row: &Self::Row, index: usize) -> Result<bool, sqlx::Error>;
        fn get_string(row: &Self::Row, index: usize) -> Result<String, sqlx::Error>;
        fn get_bytes(row: &Self::Row, index: usize) -> Result<Vec<u8>, sqlx::Error>;
        fn get_opt_bytes(row: &Self::Row, index: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;
        fn get_uuid(row: &Self::Row, index: usize) -> Result<Uuid, sqlx::Error>;
    }
}

pub(crate) use private::Ops;

/// The bodies are the same text for every database; only the types they resolve to differ.
macro_rules! impl_backend {
    ($db:ty, $settings:ty, $dialect:expr) => {
        impl private::Ops for $db {
            const DIALECT: Dialect = $dialect;
            type Settings = $settings;

            fn execute<'e, 'q: 'e>(
                conn: &'e mut Self::Connection,
                query: SqlQuery<'q, Self>,
            ) -> BoxFuture<'e, Result<u64, sqlx::Error>> {
                Box::pin(async move { Ok(query.execute(conn).await?.rows_affected()) })
            }

            fn fetch_optional<'e, 'q: 'e>(
                conn: &'e mut Self::Connection,
                query: SqlQuery<'q, Self>,
            ) -> BoxFuture<'e, Result<Option<Self::Row>, sqlx::Error>> {
                Box::pin(query.fetch_optional(conn))
            }

            fn fetch_all<'e, 'q: 'e>(
                conn: &'e mut Self::Connection,
                query: SqlQuery<'q, Self>,
            ) -> BoxFuture<'e, Result<Vec<Self::Row>, sqlx::Error>> {
                Box::pin(query.fetch_all(conn))
            }

            fn bind_i64(query: SqlQuery<'_, Self>, value: i64) -> SqlQuery<'_, Self> {
                query.bind(value)
            }
            fn bind_opt_i64(query: SqlQuery<'_, Self>, value: Option<i64>) -> SqlQuery<'_, Self> {
                query.bind(value)
            }
            fn bind_bool(query: SqlQuery<'_, Self>, value: bool) -> SqlQuery<'_, Self> {
                query.bind(value)
            }
            fn bind_str<'q>(query: SqlQuery<'q, Self>, value: &'q str) -> SqlQuery<'q, Self> {
                query.bind(value)
            }
            fn bind_bytes<'q>(query: SqlQuery<'q, Self>, value: &'q [u8]) -> SqlQuery<'q, Self> {
                query.bind(value)
            }
            fn bind_opt_bytes<'q>(
                query: SqlQuery<'q, Self>,
                value: Option<&'q [u8]>,
            ) -> SqlQuery<'q, Self> {
                query.bind(value)
            }
            fn bind_uuid(query: SqlQuery<'_, Self>, value: Uuid) -> SqlQuery<'_, Self> {
                query.bind(value)
            }

            fn get_i64(row: &Self::Row, index: usize) -> Result<i64, sqlx::Error> {
                sqlx::Row::try_get(row, index)
            }
            fn get_opt_i64(row: &Self::Row, index: usize) -> Result<Option<i64>, sqlx::Error> {
                sqlx::Row::try_get(row, index)
            }
            fn get_bool(row: &Self::Row, index: usize) -> Result<bool, sqlx::Error> {
                sqlx::Row::try_get(row, index)
            }
            fn get_string(row: &Self::Row, index: usize) -> Result<String, sqlx::Error> {
                sqlx::Row::try_get(row, index)
            }
            fn get_bytes(row: &Self::Row, index: usize) -> Result<Vec<u8>, sqlx::Error> {
                sqlx::Row::try_get(row, index)
            }
            fn get_opt_bytes(
                row: &Self::Row,
                index: usize,
            ) -> Result<Option<Vec<u8>>, sqlx::Error> {
                sqlx::Row::try_get(row, index)
            }
            fn get_uuid(row: &Self::Row, index: usize) -> Result<Uuid, sqlx::Error> {
                sqlx::Row::try_get(row, index)
            }
        }

        impl Backend for $db {}
    };
}

#[cfg(feature = "sqlite")]
impl_backend!(
    sqlx::Sqlite,
    crate::sqlite::Settings,
    Dialect {
        // Milliseconds since the epoch. `round`, not a plain cast: `unixepoch('subsec')` is a
        // float that may land just below the millisecond. SQLite evaluates `'now'` once per
        // statement, so every comparison inside one statement sees the same instant.
        now: "CAST(round(unixepoch('subsec') * 1000) AS INTEGER)",
        timestamp: "INTEGER",
        bigint: "INTEGER",
        bytes: "BLOB",
        uuid: "BLOB",
        // The rowid: the largest plus one, so a new row sorts after every row there.
        serial: "INTEGER",
        millis: "",
        micros: "(({}) * 1000)",
        // A single writer: nothing to skip.
        lock_batch: "",
        // `BEGIN IMMEDIATE` already holds the one write lock.
        lock_rows: "",
        failed_statement_aborts_transaction: false,
        begin_write: "BEGIN IMMEDIATE",
        table_exists:
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{name}')",
        // No data-modifying CTE in SQLite.
        claim_reads_live: false,
        now_is_one_instant: true,
        pruner_binds_now: true,
        single_writer: true,
        store: "SqliteStore",
        builder: "SqliteStoreBuilder",
        // The default: a batch holds the database's only write lock, so every claim waits for
        // it.
        prune_batch_size: idem_core::PrunerConfig::DEFAULT_BATCH_SIZE,
        // Not every build of SQLite can tell (dbstat is a compile-time option).
        table_size: "SELECT sum(pgsize) FROM dbstat WHERE name = $1 OR tbl_name = $1",
    }
);

#[cfg(feature = "postgres")]
impl_backend!(
    sqlx::Postgres,
    crate::postgres::Settings,
    Dialect {
        // clock_timestamp(), not now(): now() is frozen for a whole transaction.
        now: "clock_timestamp()",
        timestamp: "TIMESTAMPTZ",
        bigint: "BIGINT",
        bytes: "BYTEA",
        uuid: "UUID",
        serial: "BIGINT GENERATED BY DEFAULT AS IDENTITY",
        millis: " * interval '1 millisecond'",
        micros: "(extract(epoch from ({})) * 1000000)::bigint",
        lock_batch: " FOR UPDATE SKIP LOCKED",
        lock_rows: " FOR UPDATE",
        failed_statement_aborts_transaction: true,
        begin_write: "BEGIN",
        // Through the search path when unqualified, as the statements name it.
        table_exists: "SELECT to_regclass('{table}') IS NOT NULL",
        claim_reads_live: true,
        now_is_one_instant: false,
        pruner_binds_now: false,
        single_writer: false,
        store: "PostgresStore",
        builder: "PostgresStoreBuilder",
        // Ten times the default: in the sustained run (3,000 keys/s expiring), batches of 100
        // raised the claims' p99 1.45-2.2 × over a run without pruning, and batches of 1,000 by
        // 1.07-1.30 × (docs/performance.md, "The sustained run"). A batch locks only the
        // expired rows it deletes (`SKIP LOCKED` passes over rows others hold), so only a claim
        // of one of those keys waits for it.
        prune_batch_size: 1_000,
        table_size: "SELECT pg_total_relation_size(to_regclass($1))",
    }
);

/// Whether `e` is a unique-key violation, told by the driver's error kind (SQLSTATE 23505 on
/// PostgreSQL, extended code 2067/1555 on SQLite), never by message text.
pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use sqlx::{Connection, Row};

    use super::private::Ops;

    /// The SQLite clock must read whole milliseconds exactly. `unixepoch('subsec')` is the
    /// float `ms / 1000.0`, and multiplying it back by 1000 lands just below `ms` for about one
    /// instant in four between 2^30 s and 2^40 ms (2004) and between 2^31 s and 2^41 ms
    /// (2038-39), where a plain cast reads one millisecond early. SQLite reads `'now'` once per
    /// statement, at an instant the test cannot choose, so the expression is evaluated instead at
    /// fixed instants in those stretches (and today's) by giving `unixepoch` an explicit time:
    /// the same path as `'now'`, which SQLite also holds as whole milliseconds.
    #[tokio::test]
    async fn sqlite_clock_reads_whole_milliseconds_exactly() {
        let now = <sqlx::Sqlite as Ops>::DIALECT.now;
        assert_eq!(now.matches("unixepoch('subsec')").count(), 1, "{now}");
        let at = now.replace(
            "unixepoch('subsec')",
            "unixepoch(ms / 1000.0, 'unixepoch', 'subsec')",
        );
        let sql = format!(
            "WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n < 4999), \
                  t(ms) AS (SELECT 1090000000000 + n FROM i \
                            UNION ALL SELECT 1700000000000 + n FROM i \
                            UNION ALL SELECT 2147483645500 + n FROM i) \
             SELECT count(*), sum({at} <> ms), min(CASE WHEN {at} <> ms THEN ms END) FROM t"
        );
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .unwrap();
        let row = sqlx::query(&sql).fetch_one(&mut conn).await.unwrap();
        let (total, wrong, first): (i64, i64, Option<i64>) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(total, 15_000);
        assert_eq!(
            wrong, 0,
            "{now} reads {wrong} of {total} instants one millisecond off, the first at {first:?} ms"
        );
    }
}
