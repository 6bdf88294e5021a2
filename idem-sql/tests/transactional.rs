//! Transactional mode through the engine API ([`Transactional`]): the claim, the business write
//! and the completion commit or roll back together, on the caller's transaction.
//!
//! Every scenario is written once, generic over [`Db`], and runs on SQLite (a database file in a
//! temporary directory) and on PostgreSQL when `IDEM_TEST_PG_URL` is set. Each run uses tables
//! of its own (random suffix) and drops them at the end.
#![cfg(any(feature = "sqlite", feature = "postgres"))]

use std::collections::HashMap;
use std::future::Future;
use std::ops::DerefMut;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{ClaimOutcome, ClaimRequest, Error, Key, OnLapse, Outcome, RecordState, Store};
use idem_sql::{Transactional, TransactionalStore, TxClaimOutcome};
use idem_test_support::bank::{Tables, DELIVERIES, DEPOSITS, DEPOSITS_TOTAL};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

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

/// What differs between the databases: how to open one, how to begin a transaction, and the
/// sqlx types. The scenarios below see only this.
#[async_trait]
trait Db: Sized + Send + Sync + 'static {
    type Store: TransactionalStore<Connection = Self::Conn> + Clone;
    type Conn: Send;
    type Tx: DerefMut<Target = Self::Conn> + Send;

    /// A database with the business tables (and the records table) of its own for `test`;
    /// `None` when the test skips.
    async fn open(test: &str) -> Option<Self>;

    fn idem(&self) -> &Transactional<Self::Store>;

    /// Transactional mode over the same store with another `retention` and `key_retention`.
    fn with_retention(
        &self,
        retention: Duration,
        key_retention: Duration,
    ) -> Transactional<Self::Store>;

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
    book(db, conn, "deposit", request_id, cents).await
}

/// Withdraws through [`Transactional::run`]; more than the balance fails with
/// [`BankError::Insufficient`] before anything is written.
async fn withdraw<D: Db>(
    db: &D,
    conn: &mut D::Conn,
    request_id: &str,
    cents: i64,
) -> Result<Outcome<Receipt>, BankError> {
    book(db, conn, "withdraw", request_id, cents).await
}

/// A deposit or (`scope` "withdraw") a withdrawal of `cents`, keyed by the request id in
/// `scope`.
async fn book<D: Db>(
    db: &D,
    conn: &mut D::Conn,
    scope: &'static str,
    request_id: &str,
    cents: i64,
) -> Result<Outcome<Receipt>, BankError> {
    let key = Key::derive(scope, "acct", request_id).map_err(Error::from)?;
    let tables = db.tables().clone();
    let request_id = request_id.to_owned();
    db.idem()
        .call(key)
        .run(conn, move |conn| {
            Box::pin(async move {
                let added = if scope == "withdraw" {
                    let balance = D::balance_in(conn, &tables).await?;
                    if balance < cents {
                        return Err(BankError::Insufficient { balance, cents });
                    }
                    -cents
                } else {
                    cents
                };
                let balance = D::apply(conn, &tables, &request_id, added).await?;
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
async fn dropped_transaction_leaves_nothing<D: Db>(db: Arc<D>) {
    let db = &*db;
    let key = Key::derive("deposit", "acct", "req-1").unwrap();

    // Crash 1: claimed and written by hand, then the transaction is dropped.
    let mut tx = db.begin().await;
    let TxClaimOutcome::Run(_claim) = db.idem().call(key).claim::<Receipt>(&mut tx).await.unwrap()
    else {
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
async fn error_releases_the_claim<D: Db>(db: Arc<D>) {
    let db = &*db;
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
async fn completed_key_replays_without_running<D: Db>(db: Arc<D>) {
    let db = &*db;
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

    match db.idem().call(key).claim::<Receipt>(&mut tx).await.unwrap() {
        TxClaimOutcome::Replayed(receipt) => assert_eq!(&receipt, fresh.value()),
        TxClaimOutcome::Run(claim) => panic!("a completed key was claimed again: {claim:?}"),
    }
    D::commit(tx).await;
    assert_eq!(db.committed().await, (700, 1));
}

/// Past the lease in transactional mode. Its completions keep the policy's `key_retention`:
/// once the result's retention ends, a retry gets `Error::ResultExpired` (since the retention's
/// end, as `get` reads the tombstone) and the work does not run. A key that a claim made outside
/// any transaction with `OnLapse::Uncertain` left uncertain is `Error::Uncertain` naming it.
/// Neither writes anything.
async fn expired_and_uncertain_keys_are_refused<D: Db>(db: Arc<D>) {
    let db = &*db;
    let retention = Duration::from_millis(500);
    let idem = db.with_retention(retention, Duration::from_secs(3600));
    assert_eq!(idem.policy().key_retention(), Duration::from_secs(3600));
    let ran = Arc::new(AtomicUsize::new(0));
    let key = Key::derive("deposit", "acct", "req-expiring").unwrap();
    let mut tx = db.begin().await;
    assert_eq!(
        counted_deposit(db, &idem, &mut tx, key, &ran)
            .await
            .unwrap(),
        Outcome::Fresh(100)
    );
    D::commit(tx).await;
    tokio::time::sleep(retention * 2).await;
    let mut tx = db.begin().await;
    let since = match counted_deposit(db, &idem, &mut tx, key, &ran).await {
        Err(BankError::Idem(Error::ResultExpired { since })) => since,
        other => panic!("a retry past the retention must not run: {other:?}"),
    };
    drop(tx);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(
        record_of(db, &key).await,
        Some(RecordState::Expired { since })
    );

    let store = db.idem().store();
    let uncertain = Key::derive("deposit", "acct", "req-uncertain").unwrap();
    let lease = Duration::from_millis(300);
    let request = ClaimRequest::new(&uncertain, lease).on_lapse(OnLapse::Uncertain);
    let ClaimOutcome::Claimed(_dead) = store.claim(request).await.unwrap() else {
        panic!("a new key is claimed");
    };
    tokio::time::sleep(lease * 2).await;
    let mut tx = db.begin().await;
    match counted_deposit(db, &idem, &mut tx, uncertain, &ran).await {
        Err(BankError::Idem(Error::Uncertain { operation, .. })) => {
            assert_eq!(operation, uncertain)
        }
        other => panic!("an uncertain key must not run: {other:?}"),
    }
    drop(tx);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(db.committed().await, (100, 1));
}

/// A deposit of 100 through `idem`, counting its runs in `ran`.
async fn counted_deposit<D: Db>(
    db: &D,
    idem: &Transactional<D::Store>,
    conn: &mut D::Conn,
    key: Key,
    ran: &Arc<AtomicUsize>,
) -> Result<Outcome<u32>, BankError> {
    let (tables, ran) = (db.tables().clone(), ran.clone());
    idem.call(key)
        .run(conn, move |conn| {
            Box::pin(async move {
                ran.fetch_add(1, Ordering::SeqCst);
                D::apply(conn, &tables, "req-expiring", 100).await?;
                Ok::<u32, BankError>(100)
            })
        })
        .await
}

/// Implements [`Db`] for one database, a struct of `idem`, `tables` and `_keep` (what must live
/// as long as the database) with an inherent `records(test)` that opens the records store; the
/// bodies are the same text for both, only the types, the integer type and the `BEGIN`
/// statement differ.
macro_rules! impl_db {
    (
        $name:ident,
        store = $store:ty,
        db = $db:ty,
        sql = $sql:ident,
        bigint = $bigint:literal,
        begin = $begin:literal
    ) => {
        #[async_trait]
        impl Db for $name {
            type Store = $store;
            type Conn = <$db as sqlx::Database>::Connection;
            type Tx = sqlx::Transaction<'static, $db>;

            async fn open(test: &str) -> Option<Self> {
                let (store, keep) = Self::records(test).await?;
                let tables = Tables::new("tx");
                idem_test_support::bank::$sql::create(&tables, store.pool(), $bigint).await;
                Some($name {
                    idem: Transactional::new(store),
                    tables: Arc::new(tables),
                    _keep: keep,
                })
            }

            fn idem(&self) -> &Transactional<$store> {
                &self.idem
            }

            fn with_retention(
                &self,
                retention: std::time::Duration,
                key_retention: std::time::Duration,
            ) -> Transactional<$store> {
                Transactional::builder(self.idem.store().clone())
                    .retention(retention)
                    .key_retention(key_retention)
                    .build()
                    .unwrap()
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
                idem_test_support::bank::$sql::add(tables, conn, request_id, cents).await
            }

            async fn balance_in(
                conn: &mut Self::Conn,
                tables: &Tables,
            ) -> Result<i64, sqlx::Error> {
                idem_test_support::bank::$sql::balance(tables, conn).await
            }

            async fn committed(&self) -> (i64, i64) {
                let pool = self.idem.store().pool();
                idem_test_support::bank::$sql::committed(&self.tables, pool).await
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

/// Opens a database of its own for `test` (or skips), runs `scenario` on it, drops its tables.
async fn on_a_db<D: Db, F: Future<Output = ()>>(test: &str, scenario: impl FnOnce(Arc<D>) -> F) {
    let Some(db) = D::open(test).await else {
        return;
    };
    let db = Arc::new(db);
    scenario(db.clone()).await;
    db.drop_tables().await;
}

/// The scenarios on `$db`, one test each.
macro_rules! tests_for {
    ($db:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn dropped_transaction_leaves_nothing_and_the_retry_applies_once() {
            let test = "dropped_transaction_leaves_nothing_and_the_retry_applies_once";
            on_a_db(test, super::dropped_transaction_leaves_nothing::<$db>).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn ten_concurrent_deliveries_of_each_deposit_apply_once() {
            let test = "ten_concurrent_deliveries_of_each_deposit_apply_once";
            on_a_db(test, super::concurrent_deliveries_apply_once::<$db>).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn an_error_releases_the_claim_and_commit_leaves_the_key_free() {
            let test = "an_error_releases_the_claim_and_commit_leaves_the_key_free";
            on_a_db(test, super::error_releases_the_claim::<$db>).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn expired_and_uncertain_keys_are_refused_without_running() {
            let test = "expired_and_uncertain_keys_are_refused_without_running";
            on_a_db(test, super::expired_and_uncertain_keys_are_refused::<$db>).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_completed_key_replays_without_running_the_work() {
            let test = "a_completed_key_replays_without_running_the_work";
            on_a_db(test, super::completed_key_replays_without_running::<$db>).await;
        }
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::sync::Arc;

    use async_trait::async_trait;
    use idem_sql::{SqliteStore, Transactional};

    use super::{on_a_db, Db, Tables};

    pub struct Sqlite {
        idem: Transactional<SqliteStore>,
        tables: Arc<Tables>,
        _keep: tempfile::TempDir,
    }

    impl Sqlite {
        /// A database file of its own, with room for every delivery to hold a connection.
        async fn records(_test: &str) -> Option<(SqliteStore, tempfile::TempDir)> {
            Some(idem_test_support::bank::sqlite::store().await)
        }
    }

    impl_db!(
        Sqlite,
        store = SqliteStore,
        db = sqlx::Sqlite,
        sql = sqlite,
        bigint = "INTEGER",
        begin = "BEGIN IMMEDIATE"
    );

    tests_for!(Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::Arc;

    use async_trait::async_trait;
    use idem_sql::{PostgresStore, Transactional};
    use idem_test_support::postgres::{fresh_store, pg_url};

    use super::{on_a_db, Db, Tables};

    pub struct Postgres {
        idem: Transactional<PostgresStore>,
        tables: Arc<Tables>,
        _keep: (),
    }

    impl Postgres {
        /// A records table of its own on the server of `IDEM_TEST_PG_URL`; without it the test
        /// is skipped, unless `IDEM_REQUIRE_PG=1` makes that a failure.
        async fn records(test: &str) -> Option<(PostgresStore, ())> {
            let url = pg_url(test)?;
            Some((fresh_store(&url, |b| b.max_connections(16)).await, ()))
        }
    }

    // READ COMMITTED, the default: a duplicate waits on the first claim's row, then replays.
    impl_db!(
        Postgres,
        store = PostgresStore,
        db = sqlx::Postgres,
        sql = postgres,
        bigint = "BIGINT",
        begin = "BEGIN"
    );

    tests_for!(Postgres);
}
