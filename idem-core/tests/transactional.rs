//! Transactional mode through the engine API ([`Transactional`]): the claim, the business write
//! and the completion commit or roll back together, on the caller's transaction.
//!
//! Every scenario is written once, generic over [`Db`], and runs on SQLite (a database file in a
//! temporary directory) and on PostgreSQL when `IDEM_TEST_PG_URL` is set. Each run uses tables
//! of its own (random suffix) and drops them at the end.
#![cfg(any(feature = "sqlite", feature = "postgres"))]

use std::collections::HashMap;
use std::ops::DerefMut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use idem_core::{
    Error, Key, Outcome, RecordState, Store, Transactional, TransactionalStore, TxStart,
};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

/// Each deposit is delivered this many times at once.
const DELIVERIES: usize = 10;
const DEPOSITS: [(&str, i64); 5] = [
    ("req-a", 1),
    ("req-b", 20),
    ("req-c", 300),
    ("req-d", 4_000),
    ("req-e", 50_000),
];
const DEPOSITS_TOTAL: i64 = 54_321;

/// What a deposit or withdrawal answers; `balance` depends on the order the requests ran in,
/// so two runs of one request would be told apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    request_id: String,
    cents: i64,
    balance: i64,
}

#[derive(Debug, thiserror::Error)]
enum BankError {
    #[error(transparent)]
    Idem(#[from] Error),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    #[error("insufficient funds: balance {balance}, withdrawal {cents}")]
    Insufficient { balance: i64, cents: i64 },
}

/// The business tables of one test run: `accounts (id, balance)` holding "acct" at 0, and
/// `ledger (request_id, cents)`, one row per applied request.
struct Tables {
    accounts: String,
    ledger: String,
}

impl Tables {
    fn new() -> Tables {
        let suffix = uuid::Uuid::new_v4().simple();
        Tables {
            accounts: format!("tx_accounts_{suffix}"),
            ledger: format!("tx_ledger_{suffix}"),
        }
    }

    /// `bigint` is the database's 64-bit integer type. SQLite accepts `$n` placeholders too, so
    /// every statement is written once.
    fn schema(&self, bigint: &str) -> [String; 3] {
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

    fn add_sql(&self) -> String {
        format!(
            "UPDATE {} SET balance = balance + $1 WHERE id = 'acct' RETURNING balance",
            self.accounts
        )
    }

    fn ledger_sql(&self) -> String {
        format!(
            "INSERT INTO {} (request_id, cents) VALUES ($1, $2)",
            self.ledger
        )
    }

    fn balance_sql(&self) -> String {
        format!("SELECT balance FROM {} WHERE id = 'acct'", self.accounts)
    }

    fn ledger_count_sql(&self) -> String {
        format!("SELECT COUNT(*) FROM {}", self.ledger)
    }
}

/// What differs between the databases: how to open one, how to begin a transaction, and the
/// sqlx types. The scenarios below see only this.
#[async_trait]
trait Db: Sized + Send + Sync + 'static {
    type Store: TransactionalStore<Connection = Self::Conn> + Clone;
    type Conn: Send;
    type Tx: DerefMut<Target = Self::Conn> + Send;

    fn idem(&self) -> &Transactional<Self::Store>;

    fn tables(&self) -> &Arc<Tables>;

    /// A transaction on a pooled connection of its own. On SQLite it is `BEGIN IMMEDIATE`:
    /// concurrent writers then queue for the write lock at the start instead of failing when a
    /// read transaction tries to become a write transaction.
    async fn begin(&self) -> Self::Tx;

    async fn commit(tx: Self::Tx);

    /// The business write, in the caller's transaction: adds `cents` to the account and a
    /// ledger row; returns the new balance.
    async fn apply(
        conn: &mut Self::Conn,
        tables: &Tables,
        request_id: &str,
        cents: i64,
    ) -> Result<i64, sqlx::Error>;

    /// The balance as `conn` sees it.
    async fn balance_in(conn: &mut Self::Conn, tables: &Tables) -> Result<i64, sqlx::Error>;

    /// The committed balance and ledger row count.
    async fn committed(&self) -> (i64, i64);

    async fn drop_tables(&self);
}

/// Deposits through [`Transactional::run`] on `conn`, keyed by the request id.
async fn deposit<D: Db>(
    db: &D,
    conn: &mut D::Conn,
    request_id: &str,
    cents: i64,
) -> Result<Outcome<Receipt>, BankError> {
    let key = Key::derive("deposit", "acct", request_id).map_err(Error::from)?;
    let tables = db.tables().clone();
    let request_id = request_id.to_owned();
    db.idem()
        .call(key)
        .run(conn, move |conn| {
            Box::pin(async move {
                let balance = D::apply(conn, &tables, &request_id, cents).await?;
                Ok(Receipt {
                    request_id,
                    cents,
                    balance,
                })
            })
        })
        .await
}

/// Withdraws through [`Transactional::run`]; more than the balance fails with
/// [`BankError::Insufficient`] before anything is written.
async fn withdraw<D: Db>(
    db: &D,
    conn: &mut D::Conn,
    request_id: &str,
    cents: i64,
) -> Result<Outcome<Receipt>, BankError> {
    let key = Key::derive("withdraw", "acct", request_id).map_err(Error::from)?;
    let tables = db.tables().clone();
    let request_id = request_id.to_owned();
    db.idem()
        .call(key)
        .run(conn, move |conn| {
            Box::pin(async move {
                let balance = D::balance_in(conn, &tables).await?;
                if balance < cents {
                    return Err(BankError::Insufficient { balance, cents });
                }
                let balance = D::apply(conn, &tables, &request_id, -cents).await?;
                Ok(Receipt {
                    request_id,
                    cents,
                    balance,
                })
            })
        })
        .await
}

async fn record_of<D: Db>(db: &D, key: &Key) -> Option<RecordState> {
    db.idem()
        .store()
        .get(key)
        .await
        .unwrap()
        .map(|record| record.state)
}

/// A crash between the business write and the completion (the transaction is dropped, never
/// committed) leaves neither the write nor the claim, whether it happens between `begin` and
/// `finish` or inside a cancelled `run`. The retry then applies the deposit once, and a further
/// retry replays it.
async fn dropped_transaction_leaves_nothing<D: Db>(db: &D) {
    let key = Key::derive("deposit", "acct", "req-1").unwrap();

    // Crash 1: claimed and written by hand, then the transaction is dropped.
    let mut tx = db.begin().await;
    let TxStart::Run(_claim) = db.idem().call(key).begin::<Receipt>(&mut tx).await.unwrap() else {
        panic!("a new key must be claimed");
    };
    let balance = D::apply(&mut tx, db.tables(), "req-1", 500).await.unwrap();
    assert_eq!(balance, 500, "the write is visible inside the transaction");
    drop(tx);
    assert_eq!(db.committed().await, (0, 0), "the write was rolled back");
    assert_eq!(record_of(db, &key).await, None, "the claim was rolled back");

    // Crash 2: the `run` future is dropped after its work wrote, then the transaction too.
    let mut tx = db.begin().await;
    let (wrote, written) = tokio::sync::oneshot::channel::<()>();
    let tables = db.tables().clone();
    let run = db.idem().call(key).run(&mut tx, move |conn| {
        Box::pin(async move {
            D::apply(conn, &tables, "req-1", 500).await?;
            wrote.send(()).unwrap();
            // The process "dies" here: the caller drops this future.
            std::future::pending::<Result<Receipt, BankError>>().await
        })
    });
    tokio::select! {
        outcome = run => panic!("the work never finishes, yet run returned {outcome:?}"),
        signal = written => signal.unwrap(),
    }
    drop(tx);
    assert_eq!(db.committed().await, (0, 0));
    assert_eq!(record_of(db, &key).await, None);

    // The retry applies the deposit once.
    let mut tx = db.begin().await;
    let fresh = deposit(db, &mut tx, "req-1", 500).await.unwrap();
    D::commit(tx).await;
    assert!(!fresh.is_replayed());
    assert_eq!(db.committed().await, (500, 1));
    assert!(matches!(
        record_of(db, &key).await,
        Some(RecordState::Completed(_))
    ));

    // A further retry replays the stored receipt and writes nothing.
    let mut tx = db.begin().await;
    let replayed = deposit(db, &mut tx, "req-1", 500).await.unwrap();
    D::commit(tx).await;
    assert!(replayed.is_replayed());
    assert_eq!(replayed.value(), fresh.value());
    assert_eq!(db.committed().await, (500, 1));
}

/// Every deposit delivered 10 times at once, each delivery in a transaction of its own, is
/// applied once, and every delivery of one deposit gets the same receipt.
async fn concurrent_deliveries_apply_once<D: Db>(db: Arc<D>) {
    let mut deliveries = JoinSet::new();
    for _ in 0..DELIVERIES {
        for (request_id, cents) in DEPOSITS {
            let db = db.clone();
            deliveries.spawn(async move {
                let mut tx = db.begin().await;
                let outcome = deposit(&*db, &mut tx, request_id, cents).await?;
                D::commit(tx).await;
                Ok::<_, BankError>((request_id, outcome))
            });
        }
    }
    let mut answers: HashMap<&str, Vec<Outcome<Receipt>>> = HashMap::new();
    while let Some(delivered) = deliveries.join_next().await {
        let (request_id, outcome) = delivered.unwrap().unwrap();
        answers.entry(request_id).or_default().push(outcome);
    }

    assert_eq!(answers.len(), DEPOSITS.len());
    for (request_id, outcomes) in &answers {
        assert_eq!(outcomes.len(), DELIVERIES);
        let fresh = outcomes.iter().filter(|o| !o.is_replayed()).count();
        assert_eq!(fresh, 1, "{request_id} ran {fresh} times");
        let first = outcomes[0].value();
        assert!(
            outcomes.iter().all(|o| o.value() == first),
            "{request_id}: deliveries got different receipts: {outcomes:?}"
        );
        assert_eq!(first.request_id, *request_id);
    }
    assert_eq!(
        db.committed().await,
        (DEPOSITS_TOTAL, DEPOSITS.len() as i64)
    );
}

/// An `Err` from the work releases the claim inside the transaction, so committing leaves the
/// key free: the retry runs the work again, and once it succeeds it is replayed.
async fn error_releases_the_claim<D: Db>(db: &D) {
    let key = Key::derive("withdraw", "acct", "w-1").unwrap();

    let mut tx = db.begin().await;
    let refused = withdraw(db, &mut tx, "w-1", 300).await;
    assert!(
        matches!(
            refused,
            Err(BankError::Insufficient {
                balance: 0,
                cents: 300
            })
        ),
        "{refused:?}"
    );
    // The transaction is still usable (PostgreSQL refuses anything after a failed statement).
    D::commit(tx).await;
    assert_eq!(record_of(db, &key).await, None, "the key is free");
    assert_eq!(db.committed().await, (0, 0));

    let mut tx = db.begin().await;
    deposit(db, &mut tx, "d-1", 500).await.unwrap();
    D::commit(tx).await;

    let mut tx = db.begin().await;
    let paid = withdraw(db, &mut tx, "w-1", 300).await.unwrap();
    D::commit(tx).await;
    assert!(!paid.is_replayed(), "the retry ran the work again");
    assert_eq!(paid.value().balance, 200);

    let mut tx = db.begin().await;
    let again = withdraw(db, &mut tx, "w-1", 300).await.unwrap();
    D::commit(tx).await;
    assert!(again.is_replayed());
    assert_eq!(again.value(), paid.value());
    assert_eq!(db.committed().await, (200, 2));
}

/// A completed key replays its stored result without running the work, through `run` and
/// through `begin`.
async fn completed_key_replays_without_running<D: Db>(db: &D) {
    let key = Key::derive("deposit", "acct", "req-9").unwrap();
    let mut tx = db.begin().await;
    let fresh = deposit(db, &mut tx, "req-9", 700).await.unwrap();
    D::commit(tx).await;

    let ran = Arc::new(AtomicBool::new(false));
    let mut tx = db.begin().await;
    let flag = ran.clone();
    let replayed = db
        .idem()
        .call(key)
        .run(&mut tx, move |_conn| {
            Box::pin(async move {
                flag.store(true, Ordering::SeqCst);
                Ok::<Receipt, BankError>(Receipt {
                    request_id: "other".into(),
                    cents: 1,
                    balance: 1,
                })
            })
        })
        .await
        .unwrap();
    assert!(
        !ran.load(Ordering::SeqCst),
        "the work ran for a completed key"
    );
    assert_eq!(replayed, Outcome::Replayed(fresh.value().clone()));

    match db.idem().call(key).begin::<Receipt>(&mut tx).await.unwrap() {
        TxStart::Replayed(receipt) => assert_eq!(&receipt, fresh.value()),
        TxStart::Run(claim) => panic!("a completed key was claimed again: {claim:?}"),
    }
    D::commit(tx).await;
    assert_eq!(db.committed().await, (700, 1));
}

/// Implements [`Db`] for one database; the bodies are the same text for both, only the types
/// and the `BEGIN` statement differ.
macro_rules! impl_db {
    ($name:ident, store = $store:ty, db = $db:ty, begin = $begin:literal) => {
        #[async_trait]
        impl Db for $name {
            type Store = $store;
            type Conn = <$db as sqlx::Database>::Connection;
            type Tx = sqlx::Transaction<'static, $db>;

            fn idem(&self) -> &Transactional<$store> {
                &self.idem
            }

            fn tables(&self) -> &Arc<Tables> {
                &self.tables
            }

            async fn begin(&self) -> Self::Tx {
                self.idem.store().pool().begin_with($begin).await.unwrap()
            }

            async fn commit(tx: Self::Tx) {
                tx.commit().await.unwrap();
            }

            async fn apply(
                conn: &mut Self::Conn,
                tables: &Tables,
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

            async fn balance_in(
                conn: &mut Self::Conn,
                tables: &Tables,
            ) -> Result<i64, sqlx::Error> {
                sqlx::query_scalar(&tables.balance_sql())
                    .fetch_one(&mut *conn)
                    .await
            }

            async fn committed(&self) -> (i64, i64) {
                let pool = self.idem.store().pool();
                let balance = sqlx::query_scalar(&self.tables.balance_sql())
                    .fetch_one(pool)
                    .await
                    .unwrap();
                let rows = sqlx::query_scalar(&self.tables.ledger_count_sql())
                    .fetch_one(pool)
                    .await
                    .unwrap();
                (balance, rows)
            }

            async fn drop_tables(&self) {
                let pool = self.idem.store().pool();
                let store_table = self.idem.store().table();
                for table in [
                    self.tables.accounts.clone(),
                    self.tables.ledger.clone(),
                    store_table.to_owned(),
                    format!("{store_table}_migrations"),
                ] {
                    sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                        .execute(pool)
                        .await
                        .unwrap();
                }
            }
        }
    };
}

/// Runs a scenario on `$db`: opens it (or skips), runs, drops the tables.
macro_rules! tests_for {
    ($db:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn dropped_transaction_leaves_nothing_and_the_retry_applies_once() {
            let Some(db) =
                $db::open("dropped_transaction_leaves_nothing_and_the_retry_applies_once").await
            else {
                return;
            };
            super::dropped_transaction_leaves_nothing(&db).await;
            db.drop_tables().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn ten_concurrent_deliveries_of_each_deposit_apply_once() {
            let Some(db) = $db::open("ten_concurrent_deliveries_of_each_deposit_apply_once").await
            else {
                return;
            };
            let db = Arc::new(db);
            super::concurrent_deliveries_apply_once(db.clone()).await;
            db.drop_tables().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn an_error_releases_the_claim_and_commit_leaves_the_key_free() {
            let Some(db) =
                $db::open("an_error_releases_the_claim_and_commit_leaves_the_key_free").await
            else {
                return;
            };
            super::error_releases_the_claim(&db).await;
            db.drop_tables().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_completed_key_replays_without_running_the_work() {
            let Some(db) = $db::open("a_completed_key_replays_without_running_the_work").await
            else {
                return;
            };
            super::completed_key_replays_without_running(&db).await;
            db.drop_tables().await;
        }
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::sync::Arc;

    use async_trait::async_trait;
    use idem_core::{SqliteStore, Transactional};
    use sqlx::Connection;

    use super::{Db, Tables};

    pub struct Sqlite {
        idem: Transactional<SqliteStore>,
        tables: Arc<Tables>,
        _dir: tempfile::TempDir,
    }

    impl Sqlite {
        /// A database file of its own, with room for every delivery to hold a connection.
        async fn open(_test: &str) -> Option<Sqlite> {
            let dir = tempfile::tempdir().unwrap();
            let store = SqliteStore::builder()
                .max_connections(16)
                .open(dir.path().join("bank.db"))
                .await
                .unwrap();
            let tables = Tables::new();
            let mut conn = store.pool().acquire().await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            for sql in tables.schema("INTEGER") {
                sqlx::query(&sql).execute(&mut *tx).await.unwrap();
            }
            tx.commit().await.unwrap();
            Some(Sqlite {
                idem: Transactional::new(store),
                tables: Arc::new(tables),
                _dir: dir,
            })
        }
    }

    impl_db!(
        Sqlite,
        store = SqliteStore,
        db = sqlx::Sqlite,
        begin = "BEGIN IMMEDIATE"
    );

    tests_for!(Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::Arc;

    use async_trait::async_trait;
    use idem_core::{PostgresStore, Transactional};
    use sqlx::Connection;

    use super::{Db, Tables};

    pub struct Postgres {
        idem: Transactional<PostgresStore>,
        tables: Arc<Tables>,
    }

    impl Postgres {
        /// A records table and business tables of their own on the server of
        /// `IDEM_TEST_PG_URL`; without it the test is skipped, unless `IDEM_REQUIRE_PG=1` makes
        /// that a failure.
        async fn open(test: &str) -> Option<Postgres> {
            let url = idem_test_support::postgres::pg_url(test)?;
            let store = PostgresStore::builder()
                .table(format!("idem_tx_{}", uuid::Uuid::new_v4().simple()))
                .max_connections(16)
                .connect(&url)
                .await
                .unwrap();
            let tables = Tables::new();
            let mut conn = store.pool().acquire().await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            for sql in tables.schema("BIGINT") {
                sqlx::query(&sql).execute(&mut *tx).await.unwrap();
            }
            tx.commit().await.unwrap();
            Some(Postgres {
                idem: Transactional::new(store),
                tables: Arc::new(tables),
            })
        }
    }

    // READ COMMITTED, the default: a duplicate waits on the first claim's row, then replays.
    impl_db!(
        Postgres,
        store = PostgresStore,
        db = sqlx::Postgres,
        begin = "BEGIN"
    );

    tests_for!(Postgres);
}
