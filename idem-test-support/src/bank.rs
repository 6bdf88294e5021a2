//! The bank the transactional tests pay into, whether through the engine API
//! (`idem-sql/tests/transactional.rs`), the `#[idempotent(transaction = …)]` attribute
//! (`tests/macro_tx_*.rs`) or the concurrency kit (`idem-sql/tests/kit_strategies.rs`): the
//! deposits each delivers many times at once, and the business tables, one account and a
//! ledger, as SQL that SQLite and PostgreSQL both run (SQLite accepts `$n` placeholders too).

/// Each deposit is delivered this many times at once.
pub const DELIVERIES: usize = 10;

/// The deposits: a request id and an amount in cents.
pub const DEPOSITS: [(&str, i64); 5] = [
    ("req-a", 1),
    ("req-b", 20),
    ("req-c", 300),
    ("req-d", 4_000),
    ("req-e", 50_000),
];

/// What [`DEPOSITS`] add up to, applied once each.
pub const DEPOSITS_TOTAL: i64 = 54_321;

/// The business tables of one test run, named with a suffix of their own: `accounts (id,
/// balance)` holding `acct` at 0, and `ledger (request_id, cents)`, one row per applied request.
///
/// ```
/// let tables = idem_test_support::bank::Tables::new("tx");
/// assert!(tables.schema("BIGINT")[0].starts_with("CREATE TABLE tx_accounts_"));
/// ```
#[derive(Debug, Clone)]
pub struct Tables {
    /// The accounts table.
    pub accounts: String,
    /// The ledger.
    pub ledger: String,
}

impl Tables {
    /// Fresh names: `<prefix>_accounts_<hex>` and `<prefix>_ledger_<hex>`.
    pub fn new(prefix: &str) -> Tables {
        Tables {
            accounts: crate::unique_name(&format!("{prefix}_accounts")),
            ledger: crate::unique_name(&format!("{prefix}_ledger")),
        }
    }

    /// The statements that create both tables and the account; `bigint` is the database's
    /// 64-bit integer type (`INTEGER` on SQLite, `BIGINT` on PostgreSQL).
    pub fn schema(&self, bigint: &str) -> [String; 3] {
        [
            format!(
                "CREATE TABLE {} (id TEXT PRIMARY KEY, balance {bigint} NOT NULL)",
                self.accounts
            ),
            format!(
                "INSERT INTO {} (id, balance) VALUES ('acct', 0)",
                self.accounts
            ),
            format!(
                "CREATE TABLE {} (request_id TEXT NOT NULL, cents {bigint} NOT NULL)",
                self.ledger
            ),
        ]
    }

    /// Adds `$1` cents to the account and returns the new balance.
    pub fn add_sql(&self) -> String {
        format!(
            "UPDATE {} SET balance = balance + $1 WHERE id = 'acct' RETURNING balance",
            self.accounts
        )
    }

    /// Writes the ledger row of request `$1`, `$2` cents.
    pub fn ledger_sql(&self) -> String {
        format!(
            "INSERT INTO {} (request_id, cents) VALUES ($1, $2)",
            self.ledger
        )
    }

    /// The account's balance.
    pub fn balance_sql(&self) -> String {
        format!("SELECT balance FROM {} WHERE id = 'acct'", self.accounts)
    }

    /// How many rows the ledger holds.
    pub fn ledger_count_sql(&self) -> String {
        format!("SELECT COUNT(*) FROM {}", self.ledger)
    }
}

/// The writes and reads of [`Tables`] on one database: the same text for each, a macro because
/// sqlx's types differ.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! bank_sql {
    ($db:ty) => {
        use super::Tables;

        /// A connection of the database.
        type Conn = <$db as sqlx::Database>::Connection;

        /// Creates the tables and the account through `pool`; `bigint` as in [`Tables::schema`].
        pub async fn create(tables: &Tables, pool: &sqlx::Pool<$db>, bigint: &str) {
            for sql in tables.schema(bigint) {
                sqlx::query(&sql).execute(pool).await.unwrap();
            }
        }

        /// Adds `cents` to the account and a ledger row for `request_id`, on `conn` (in the
        /// caller's transaction); the new balance.
        pub async fn add(
            tables: &Tables,
            conn: &mut Conn,
            request_id: &str,
            cents: i64,
        ) -> Result<i64, sqlx::Error> {
            let balance = sqlx::query_scalar(&tables.add_sql())
                .bind(cents)
                .fetch_one(&mut *conn)
                .await?;
            sqlx::query(&tables.ledger_sql())
                .bind(request_id)
                .bind(cents)
                .execute(&mut *conn)
                .await?;
            Ok(balance)
        }

        /// The balance as `conn` sees it.
        pub async fn balance(tables: &Tables, conn: &mut Conn) -> Result<i64, sqlx::Error> {
            sqlx::query_scalar(&tables.balance_sql())
                .fetch_one(conn)
                .await
        }

        /// The committed balance and ledger row count.
        pub async fn committed(tables: &Tables, pool: &sqlx::Pool<$db>) -> (i64, i64) {
            let balance = sqlx::query_scalar(&tables.balance_sql())
                .fetch_one(pool)
                .await
                .unwrap();
            let rows = sqlx::query_scalar(&tables.ledger_count_sql())
                .fetch_one(pool)
                .await
                .unwrap();
            (balance, rows)
        }
    };
}

/// [`Tables`] on SQLite (the same functions as `postgres` has, on PostgreSQL).
#[cfg(feature = "sqlite")]
pub mod sqlite {
    bank_sql!(sqlx::Sqlite);

    /// A store in a database file of its own (in the directory returned with it, deleted when
    /// dropped), with room for every delivery to hold a connection.
    pub async fn store() -> (idem_sql::SqliteStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = idem_sql::SqliteStore::builder()
            .max_connections(16)
            .open(dir.path().join("bank.db"))
            .await
            .unwrap();
        (store, dir)
    }
}

/// [`Tables`] on PostgreSQL: create them, pay in, read the balance.
///
/// ```no_run
/// # async fn doc(pool: sqlx::PgPool) {
/// use idem_test_support::bank::{postgres, Tables};
///
/// let tables = Tables::new("doc");
/// postgres::create(&tables, &pool, "BIGINT").await;
/// let mut conn = pool.acquire().await.unwrap();
/// assert_eq!(postgres::add(&tables, &mut conn, "req-1", 5).await.unwrap(), 5);
/// assert_eq!(postgres::committed(&tables, &pool).await, (5, 1));
/// # }
/// ```
#[cfg(feature = "postgres")]
pub mod postgres {
    bank_sql!(sqlx::Postgres);
}
