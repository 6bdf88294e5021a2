// Transactional mode: the claim, the body and the completion share the caller's transaction.
// The parameter may be a `&mut Transaction` or a `&mut SqliteConnection`, and it stays usable
// after the call.
use idem::{idempotent, SqliteStore, Transactional};
use serde::{Deserialize, Serialize};
use sqlx::{Connection, Sqlite, SqliteConnection, Transaction};

#[derive(Debug, thiserror::Error)]
enum BankError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    request_id: String,
    balance: i64,
}

struct Bank {
    idem: Transactional<SqliteStore>,
}

impl Bank {
    #[idempotent(key = request_id, scope = "deposit", engine = self.idem, transaction = tx, retention = "7d")]
    async fn deposit(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        request_id: String,
        cents: i64,
    ) -> Result<Receipt, BankError> {
        let balance: i64 = sqlx::query_scalar(
            "UPDATE accounts SET balance = balance + $1 WHERE id = 1 RETURNING balance",
        )
        .bind(cents)
        .fetch_one(&mut **tx)
        .await?;
        // The body may move the function's arguments.
        Ok(Receipt { request_id, balance })
    }
}

/// A plain connection works too; so does an `Arc` or reference as `store`.
#[idempotent(key = request_id, engine = idem, transaction = conn, fingerprint = cents)]
async fn withdraw(
    idem: std::sync::Arc<Transactional<SqliteStore>>,
    conn: &mut SqliteConnection,
    request_id: &str,
    cents: i64,
) -> Result<i64, BankError> {
    let balance: i64 = sqlx::query_scalar(
        "UPDATE accounts SET balance = balance - $1 WHERE id = 1 RETURNING balance",
    )
    .bind(cents)
    .fetch_one(&mut *conn)
    .await?;
    Ok(balance)
}

/// An optional key: `None` runs the body without deduplication.
#[idempotent(key = request_id, scope = "note", engine = &idem, transaction = tx)]
async fn note(
    idem: Transactional<SqliteStore>,
    tx: &mut Transaction<'_, Sqlite>,
    request_id: Option<&str>,
) -> Result<u32, BankError> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(7)
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BankError> {
    let store = SqliteStore::connect("sqlite::memory:").await?;
    let bank = Bank { idem: Transactional::new(store.clone()) };
    let mut conn = store.pool().acquire().await?;
    sqlx::query("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
        .execute(&mut *conn)
        .await?;
    sqlx::query("INSERT INTO accounts VALUES (1, 0)").execute(&mut *conn).await?;

    for _ in 0..2 {
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let call = bank.deposit(&mut tx, "req-1".to_string(), 500);
        assert_send(&call);
        let receipt = call.await?;
        assert_eq!(receipt, Receipt { request_id: "req-1".into(), balance: 500 });
        // The transaction is still usable after the call.
        sqlx::query("SELECT 1").execute(&mut *tx).await?;
        tx.commit().await?;
    }

    let idem = std::sync::Arc::new(Transactional::new(store.clone()));
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    assert_eq!(withdraw(idem.clone(), &mut tx, "w-1", 200).await?, 300);
    assert_eq!(withdraw(idem.clone(), &mut tx, "w-1", 200).await?, 300);
    assert!(matches!(
        withdraw(idem, &mut tx, "w-1", 999).await,
        Err(BankError::Idem(idem::Error::KeyReused))
    ));
    tx.commit().await?;

    let idem = Transactional::new(store.clone());
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    assert_eq!(note(idem.clone(), &mut tx, None).await?, 7);
    assert_eq!(note(idem, &mut tx, Some("n-1")).await?, 7);
    tx.commit().await?;
    Ok(())
}
