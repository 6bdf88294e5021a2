//! The databases the kit runs on, and the few things that differ between them.
//!
//! The kit's logic is written once, generic over [`Backend`]. What differs per database (the
//! clock expression, column types, how a failed statement affects a transaction) is a
//! [`Dialect`](private::Dialect), and the handful of sqlx calls that cannot be made generic
//! without a wall of bounds are methods of a sealed trait, stamped out per database.

use std::future::Future;
use std::pin::Pin;

use uuid::Uuid;

/// A boxed, `Send` future borrowing a connection for `'a`.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A query with its bound arguments, as [`Entity::bind`](super::Entity::bind) receives it.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem_core::kit::SqlQuery;
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
/// fn runs_on<DB: idem_core::kit::Backend>() {}
/// runs_on::<sqlx::Sqlite>();
/// # }
/// ```
pub trait Backend: sqlx::Database + private::Ops {}

pub(crate) mod private {
    use super::*;

    /// SQL fragments that differ between databases.
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
        /// Turns a bound BIGINT of milliseconds into something `now` can be offset by.
        pub millis: &'static str,
        /// Appended to the subselect that picks a batch to delete.
        pub lock_batch: &'static str,
        /// Whether a failed statement aborts the whole enclosing transaction (PostgreSQL) rather
        /// than only itself (SQLite).
        pub failed_statement_aborts_transaction: bool,
    }

    impl Dialect {
        /// `now + $param milliseconds`.
        pub fn now_plus(&self, param: &str) -> String {
            format!("({} + {param}{})", self.now, self.millis)
        }

        /// `now - $param milliseconds`.
        pub fn now_minus(&self, param: &str) -> String {
            format!("({} - {param}{})", self.now, self.millis)
        }
    }

    /// The sqlx calls the kit makes, one implementation per database. Not nameable outside the
    /// crate, which seals [`Backend`].
    pub trait Ops: sqlx::Database {
        const DIALECT: Dialect;

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
        fn bind_str<'q>(query: SqlQuery<'q, Self>, value: &'q str) -> SqlQuery<'q, Self>;
        fn bind_bytes<'q>(query: SqlQuery<'q, Self>, value: &'q [u8]) -> SqlQuery<'q, Self>;
        fn bind_uuid(query: SqlQuery<'_, Self>, value: Uuid) -> SqlQuery<'_, Self>;

        fn get_i64(row: &Self::Row, index: usize) -> Result<i64, sqlx::Error>;
        fn get_opt_i64(row: &Self::Row, index: usize) -> Result<Option<i64>, sqlx::Error>;
        fn get_string(row: &Self::Row, index: usize) -> Result<String, sqlx::Error>;
        fn get_bytes(row: &Self::Row, index: usize) -> Result<Vec<u8>, sqlx::Error>;
        fn get_uuid(row: &Self::Row, index: usize) -> Result<Uuid, sqlx::Error>;
    }
}

/// The bodies are the same text for every database; only the types they resolve to differ.
macro_rules! impl_backend {
    ($db:ty, $dialect:expr) => {
        impl private::Ops for $db {
            const DIALECT: private::Dialect = $dialect;

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
            fn bind_str<'q>(query: SqlQuery<'q, Self>, value: &'q str) -> SqlQuery<'q, Self> {
                query.bind(value)
            }
            fn bind_bytes<'q>(query: SqlQuery<'q, Self>, value: &'q [u8]) -> SqlQuery<'q, Self> {
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
            fn get_string(row: &Self::Row, index: usize) -> Result<String, sqlx::Error> {
                sqlx::Row::try_get(row, index)
            }
            fn get_bytes(row: &Self::Row, index: usize) -> Result<Vec<u8>, sqlx::Error> {
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
    private::Dialect {
        // Milliseconds since the epoch: the SQLite store's own expression, so the two keep
        // time alike (it rounds; a plain cast reads some instants one millisecond early).
        now: crate::store::sqlite::NOW,
        timestamp: "INTEGER",
        bigint: "INTEGER",
        bytes: "BLOB",
        uuid: "BLOB",
        millis: "",
        // A single writer: nothing to skip.
        lock_batch: "",
        failed_statement_aborts_transaction: false,
    }
);

#[cfg(feature = "postgres")]
impl_backend!(
    sqlx::Postgres,
    private::Dialect {
        // clock_timestamp(), not now(): now() is frozen for a whole transaction.
        now: "clock_timestamp()",
        timestamp: "TIMESTAMPTZ",
        bigint: "BIGINT",
        bytes: "BYTEA",
        uuid: "UUID",
        millis: " * interval '1 millisecond'",
        lock_batch: " FOR UPDATE SKIP LOCKED",
        failed_statement_aborts_transaction: true,
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
