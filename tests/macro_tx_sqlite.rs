//! `#[idempotent(transaction = …)]` end to end on SQLite (a database file in a temporary
//! directory): the claim, the body's writes and the stored result share the caller's
//! transaction.
#![cfg(feature = "sqlite")]

mod macro_tx_support;

use std::sync::Arc;

use idem::{SqliteStore, Transactional};
use macro_tx_support::Bank;
use sqlx::{Sqlite, SqliteConnection, Transaction};

struct SqliteBank {
    idem: Transactional<SqliteStore>,
    _dir: tempfile::TempDir,
}

impl SqliteBank {
    async fn open() -> SqliteBank {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::builder()
            .max_connections(16)
            .open(dir.path().join("bank.db"))
            .await
            .unwrap();
        for sql in [
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)",
            "INSERT INTO accounts VALUES ('acct', 0)",
            "CREATE TABLE ledger (request_id TEXT NOT NULL, cents INTEGER NOT NULL)",
        ] {
            sqlx::query(sql).execute(store.pool()).await.unwrap();
        }
        SqliteBank {
            idem: Transactional::new(store),
            _dir: dir,
        }
    }
}

impl Bank for SqliteBank {
    type Store = SqliteStore;
    type Conn = SqliteConnection;
    type Tx = Transaction<'static, Sqlite>;

    fn idem(&self) -> &Transactional<SqliteStore> {
        &self.idem
    }

    /// `BEGIN IMMEDIATE`: concurrent deliveries queue for the write lock up front.
    async fn begin(&self) -> Self::Tx {
        let pool = self.idem.store().pool();
        pool.begin_with("BEGIN IMMEDIATE").await.unwrap()
    }

    async fn commit(tx: Self::Tx) {
        tx.commit().await.unwrap();
    }

    async fn add(
        &self,
        conn: &mut SqliteConnection,
        request_id: &str,
        cents: i64,
    ) -> Result<i64, sqlx::Error> {
        let balance = sqlx::query_scalar(
            "UPDATE accounts SET balance = balance + ? WHERE id = 'acct' RETURNING balance",
        )
        .bind(cents)
        .fetch_one(&mut *conn)
        .await?;
        sqlx::query("INSERT INTO ledger (request_id, cents) VALUES (?, ?)")
            .bind(request_id)
            .bind(cents)
            .execute(&mut *conn)
            .await?;
        Ok(balance)
    }

    async fn balance(&self, conn: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT balance FROM accounts WHERE id = 'acct'")
            .fetch_one(conn)
            .await
    }

    async fn committed(&self) -> (i64, i64) {
        let pool = self.idem.store().pool();
        let balance = sqlx::query_scalar("SELECT balance FROM accounts WHERE id = 'acct'")
            .fetch_one(pool)
            .await
            .unwrap();
        let rows = sqlx::query_scalar("SELECT COUNT(*) FROM ledger")
            .fetch_one(pool)
            .await
            .unwrap();
        (balance, rows)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_transaction_leaves_nothing_and_the_retry_applies_once() {
    macro_tx_support::dropped_transaction_leaves_nothing(&SqliteBank::open().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_deliveries_of_each_deposit_apply_once() {
    macro_tx_support::concurrent_deliveries_apply_once(Arc::new(SqliteBank::open().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_error_releases_the_claim() {
    macro_tx_support::error_releases_the_claim(&SqliteBank::open().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_fingerprint_leaves_out_the_transaction() {
    macro_tx_support::default_fingerprint_leaves_out_the_transaction(&SqliteBank::open().await)
        .await;
}
