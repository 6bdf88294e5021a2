//! `#[idempotent(transaction = …)]` end to end on PostgreSQL, on the server of
//! `IDEM_TEST_PG_URL` (skipped without it, unless `IDEM_REQUIRE_PG=1`). Every test uses tables
//! of its own and drops them at the end.
#![cfg(feature = "postgres")]

mod macro_tx_support;

use std::sync::Arc;

use idem::{PostgresStore, Transactional};
use macro_tx_support::Bank;
use sqlx::{PgConnection, Postgres, Transaction};

struct PgBank {
    idem: Transactional<PostgresStore>,
    accounts: String,
    ledger: String,
}

impl PgBank {
    async fn open(test: &str) -> Option<PgBank> {
        let url = idem_test_support::postgres::pg_url(test)?;
        let suffix = uuid::Uuid::new_v4().simple();
        let store = PostgresStore::builder()
            .table(format!("idem_mtx_{suffix}"))
            .max_connections(16)
            .connect(&url)
            .await
            .unwrap();
        let bank = PgBank {
            idem: Transactional::new(store),
            accounts: format!("mtx_accounts_{suffix}"),
            ledger: format!("mtx_ledger_{suffix}"),
        };
        for sql in [
            format!(
                "CREATE TABLE {} (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)",
                bank.accounts
            ),
            format!("INSERT INTO {} VALUES ('acct', 0)", bank.accounts),
            format!(
                "CREATE TABLE {} (request_id TEXT NOT NULL, cents BIGINT NOT NULL)",
                bank.ledger
            ),
        ] {
            sqlx::query(&sql).execute(bank.pool()).await.unwrap();
        }
        Some(bank)
    }

    fn pool(&self) -> &sqlx::PgPool {
        self.idem.store().pool()
    }

    async fn drop_tables(&self) {
        let records = self.idem.store().table();
        for table in [
            self.accounts.clone(),
            self.ledger.clone(),
            records.to_owned(),
            format!("{records}_migrations"),
        ] {
            sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                .execute(self.pool())
                .await
                .unwrap();
        }
    }
}

impl Bank for PgBank {
    type Store = PostgresStore;
    type Conn = PgConnection;
    type Tx = Transaction<'static, Postgres>;

    fn idem(&self) -> &Transactional<PostgresStore> {
        &self.idem
    }

    /// READ COMMITTED, the default: a duplicate waits on the first claim's row, then replays.
    async fn begin(&self) -> Self::Tx {
        self.pool().begin().await.unwrap()
    }

    async fn commit(tx: Self::Tx) {
        tx.commit().await.unwrap();
    }

    async fn add(
        &self,
        conn: &mut PgConnection,
        request_id: &str,
        cents: i64,
    ) -> Result<i64, sqlx::Error> {
        let balance = sqlx::query_scalar(&format!(
            "UPDATE {} SET balance = balance + $1 WHERE id = 'acct' RETURNING balance",
            self.accounts
        ))
        .bind(cents)
        .fetch_one(&mut *conn)
        .await?;
        sqlx::query(&format!(
            "INSERT INTO {} (request_id, cents) VALUES ($1, $2)",
            self.ledger
        ))
        .bind(request_id)
        .bind(cents)
        .execute(&mut *conn)
        .await?;
        Ok(balance)
    }

    async fn balance(&self, conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(&format!(
            "SELECT balance FROM {} WHERE id = 'acct'",
            self.accounts
        ))
        .fetch_one(conn)
        .await
    }

    async fn committed(&self) -> (i64, i64) {
        let balance = sqlx::query_scalar(&format!(
            "SELECT balance FROM {} WHERE id = 'acct'",
            self.accounts
        ))
        .fetch_one(self.pool())
        .await
        .unwrap();
        let rows = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", self.ledger))
            .fetch_one(self.pool())
            .await
            .unwrap();
        (balance, rows)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_transaction_leaves_nothing_and_the_retry_applies_once() {
    let test = "dropped_transaction_leaves_nothing_and_the_retry_applies_once";
    let Some(bank) = PgBank::open(test).await else {
        return;
    };
    macro_tx_support::dropped_transaction_leaves_nothing(&bank).await;
    bank.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_deliveries_of_each_deposit_apply_once() {
    let test = "ten_concurrent_deliveries_of_each_deposit_apply_once";
    let Some(bank) = PgBank::open(test).await else {
        return;
    };
    let bank = Arc::new(bank);
    macro_tx_support::concurrent_deliveries_apply_once(bank.clone()).await;
    bank.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_error_releases_the_claim() {
    let Some(bank) = PgBank::open("an_error_releases_the_claim").await else {
        return;
    };
    macro_tx_support::error_releases_the_claim(&bank).await;
    bank.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_fingerprint_leaves_out_the_transaction() {
    let test = "the_default_fingerprint_leaves_out_the_transaction";
    let Some(bank) = PgBank::open(test).await else {
        return;
    };
    macro_tx_support::default_fingerprint_leaves_out_the_transaction(&bank).await;
    bank.drop_tables().await;
}
