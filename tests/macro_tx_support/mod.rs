//! Scenarios of `#[idempotent(transaction = …)]` shared by the `macro_tx_*` integration tests.
//! The attributed functions are generic over [`Bank`], so one copy runs on every database; each
//! test file supplies the database.

use std::collections::HashMap;
use std::future::Future;
use std::ops::DerefMut;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem::{idempotent, Fingerprint, Key, RecordState, Store, Transactional, TransactionalStore};
use idem_test_support::bank::{DELIVERIES, DEPOSITS, DEPOSITS_TOTAL};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

/// A database holding one account at balance 0 and an empty ledger, with a transactional engine
/// whose records live in the same database.
pub trait Bank: Send + Sync + 'static {
    type Store: TransactionalStore<Connection = Self::Conn> + Clone;
    type Conn: Send;
    type Tx: DerefMut<Target = Self::Conn> + Send;

    fn idem(&self) -> &Transactional<Self::Store>;

    /// A transaction on a pooled connection of its own (`BEGIN IMMEDIATE` on SQLite).
    fn begin(&self) -> impl Future<Output = Self::Tx> + Send;

    fn commit(tx: Self::Tx) -> impl Future<Output = ()> + Send;

    /// Adds `cents` to the account and a ledger row, on `conn`; returns the new balance.
    fn add<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        request_id: &'a str,
        cents: i64,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a;

    /// The balance as `conn` sees it.
    fn balance<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a;

    /// The committed balance and ledger row count.
    fn committed(&self) -> impl Future<Output = (i64, i64)> + Send;
}

/// Implements [`Bank`] for `$name`, a struct of `idem` (the engine), `tables`
/// ([`Tables`](idem_test_support::bank::Tables)) and `_keep` (what must live as long as the
/// database), and gives it `with_tables(store, keep)`, which creates the tables; the bodies are
/// the same text on every database, only the types, the integer type and the `BEGIN` statement
/// differ.
macro_rules! impl_bank {
    (
        $name:ident,
        store = $store:ty,
        db = $db:ty,
        sql = $sql:ident,
        keep = $keep:ty,
        bigint = $bigint:literal,
        begin = $begin:literal
    ) => {
        impl $name {
            async fn with_tables(store: $store, keep: $keep) -> $name {
                let tables = idem_test_support::bank::Tables::new("mtx");
                idem_test_support::bank::$sql::create(&tables, store.pool(), $bigint).await;
                $name {
                    idem: Transactional::new(store),
                    tables,
                    _keep: keep,
                }
            }
        }

        impl Bank for $name {
            type Store = $store;
            type Conn = <$db as sqlx::Database>::Connection;
            type Tx = sqlx::Transaction<'static, $db>;

            fn idem(&self) -> &Transactional<$store> {
                &self.idem
            }

            async fn begin(&self) -> Self::Tx {
                let pool = self.idem.store().pool();
                pool.begin_with($begin).await.unwrap()
            }

            async fn commit(tx: Self::Tx) {
                tx.commit().await.unwrap();
            }

            async fn add(
                &self,
                conn: &mut Self::Conn,
                request_id: &str,
                cents: i64,
            ) -> Result<i64, sqlx::Error> {
                idem_test_support::bank::$sql::add(&self.tables, conn, request_id, cents).await
            }

            async fn balance(&self, conn: &mut Self::Conn) -> Result<i64, sqlx::Error> {
                idem_test_support::bank::$sql::balance(&self.tables, conn).await
            }

            async fn committed(&self) -> (i64, i64) {
                let pool = self.idem.store().pool();
                idem_test_support::bank::$sql::committed(&self.tables, pool).await
            }
        }
    };
}
pub(crate) use impl_bank;

#[derive(Debug, thiserror::Error)]
pub enum BankError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    #[error("insufficient funds: balance {balance}, withdrawal {cents}")]
    Insufficient { balance: i64, cents: i64 },
}

/// What a deposit or withdrawal answers. `balance` depends on the order requests ran in, so two
/// runs of one request would be told apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub request_id: String,
    pub cents: i64,
    pub balance: i64,
}

/// Deposits once per `(account, request_id)`: the claim, the write and the receipt commit with
/// the caller's transaction.
#[idempotent(
    key = request_id,
    caller = account,
    scope = "deposit",
    engine = bank.idem(),
    transaction = tx,
    fingerprint = cents,
    retention = "7d",
)]
pub async fn deposit<B: Bank>(
    bank: &B,
    tx: &mut B::Conn,
    account: &str,
    request_id: &str,
    cents: i64,
) -> Result<Receipt, BankError> {
    let balance = bank.add(tx, request_id, cents).await?;
    Ok(Receipt {
        request_id: request_id.to_owned(),
        cents,
        balance,
    })
}

/// Withdraws once per request; more than the balance is an error, which releases the claim.
/// No `fingerprint`: the default one hashes `cents`, leaving out `bank` (which `engine` is taken
/// from), the transaction and the key.
#[idempotent(key = request_id, scope = "withdraw", engine = bank.idem(), transaction = tx)]
pub async fn withdraw<B: Bank>(
    bank: &B,
    tx: &mut B::Conn,
    request_id: &str,
    cents: i64,
) -> Result<Receipt, BankError> {
    let balance = bank.balance(tx).await?;
    if balance < cents {
        return Err(BankError::Insufficient { balance, cents });
    }
    let balance = bank.add(tx, request_id, -cents).await?;
    Ok(Receipt {
        request_id: request_id.to_owned(),
        cents,
        balance,
    })
}

async fn record<B: Bank>(bank: &B, key: &Key) -> Option<RecordState> {
    let record = bank.idem().store().get(key).await.unwrap();
    record.map(|r| r.state)
}

/// A transaction dropped after the attributed call returned (a crash before the commit) leaves
/// neither the deposit nor the claim. The retry applies the deposit once and keeps the receipt
/// for the `ttl` (7 days, not the engine's 24 hours); a further retry replays it.
pub async fn dropped_transaction_leaves_nothing<B: Bank>(bank: Arc<B>) {
    let bank = &*bank;
    let key = Key::derive("deposit", "acct", "req-1").unwrap();

    let mut tx = bank.begin().await;
    let receipt = deposit(bank, &mut tx, "acct", "req-1", 500).await.unwrap();
    assert_eq!(receipt.balance, 500);
    // The connection is usable after the call: it was only reborrowed.
    assert_eq!(bank.balance(&mut tx).await.unwrap(), 500);
    drop(tx);
    assert_eq!(
        bank.committed().await,
        (0, 0),
        "the deposit was rolled back"
    );
    assert_eq!(record(bank, &key).await, None, "the claim was rolled back");

    let mut tx = bank.begin().await;
    let applied = deposit(bank, &mut tx, "acct", "req-1", 500).await.unwrap();
    B::commit(tx).await;
    assert_eq!(applied, receipt);
    assert_eq!(bank.committed().await, (500, 1));
    let Some(RecordState::Completed(cached)) = record(bank, &key).await else {
        panic!("the receipt was not stored");
    };
    // Database time against this machine's: allow a minute either way.
    let kept = cached
        .expires_at
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    let week = Duration::from_secs(7 * 24 * 3600);
    assert!(
        kept > week - Duration::from_secs(60) && kept < week + Duration::from_secs(60),
        "kept for {kept:?}, not the ttl of 7 days"
    );

    let mut tx = bank.begin().await;
    let replayed = deposit(bank, &mut tx, "acct", "req-1", 500).await.unwrap();
    B::commit(tx).await;
    assert_eq!(replayed, applied);
    assert_eq!(bank.committed().await, (500, 1), "the replay wrote nothing");

    // The same key with another amount is refused, and nothing is written.
    let mut tx = bank.begin().await;
    let reused = deposit(bank, &mut tx, "acct", "req-1", 900).await;
    B::commit(tx).await;
    assert!(
        matches!(reused, Err(BankError::Idem(idem::Error::KeyReused))),
        "{reused:?}"
    );
    assert_eq!(bank.committed().await, (500, 1));
}

/// Every deposit delivered 10 times at once, each delivery in its own transaction, is applied
/// once, and all deliveries of one deposit get the same receipt.
pub async fn concurrent_deliveries_apply_once<B: Bank>(bank: Arc<B>) {
    let mut deliveries = JoinSet::new();
    for _ in 0..DELIVERIES {
        for (request_id, cents) in DEPOSITS {
            let bank = bank.clone();
            deliveries.spawn(async move {
                let mut tx = bank.begin().await;
                let receipt = deposit(&*bank, &mut tx, "acct", request_id, cents).await?;
                B::commit(tx).await;
                Ok::<_, BankError>((request_id, receipt))
            });
        }
    }
    let mut receipts: HashMap<&str, Vec<Receipt>> = HashMap::new();
    while let Some(delivered) = deliveries.join_next().await {
        let (request_id, receipt) = delivered.unwrap().unwrap();
        receipts.entry(request_id).or_default().push(receipt);
    }
    assert_eq!(receipts.len(), DEPOSITS.len());
    for (request_id, got) in &receipts {
        assert_eq!(got.len(), DELIVERIES);
        assert!(
            got.iter().all(|r| r == &got[0]),
            "{request_id}: deliveries got different receipts: {got:?}"
        );
        assert_eq!(got[0].request_id, *request_id);
    }
    // One ledger row per deposit: each body ran once.
    assert_eq!(
        bank.committed().await,
        (DEPOSITS_TOTAL, DEPOSITS.len() as i64)
    );
}

/// An error from the body releases the claim in the transaction; after the commit the key is
/// free, the retry runs the body again, and its success is replayed.
pub async fn error_releases_the_claim<B: Bank>(bank: Arc<B>) {
    let bank = &*bank;
    let key = Key::derive("withdraw", "", "w-1").unwrap();
    let mut tx = bank.begin().await;
    let refused = withdraw(bank, &mut tx, "w-1", 300).await;
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
    B::commit(tx).await;
    assert_eq!(record(bank, &key).await, None);

    let mut tx = bank.begin().await;
    deposit(bank, &mut tx, "acct", "d-1", 500).await.unwrap();
    let paid = withdraw(bank, &mut tx, "w-1", 300).await.unwrap();
    let again = withdraw(bank, &mut tx, "w-1", 300).await.unwrap();
    B::commit(tx).await;
    assert_eq!(paid.balance, 200);
    assert_eq!(again, paid, "replayed within the same transaction");
    assert_eq!(bank.committed().await, (200, 2));
}

/// Without `fingerprint`, the transactional mode hashes the arguments less the engine's
/// `bank`, the transaction and the key: the record holds the fingerprint of `{"cents": 100}`,
/// and the key reused with another amount is refused.
pub async fn default_fingerprint_leaves_out_the_transaction<B: Bank>(bank: Arc<B>) {
    let bank = &*bank;
    let mut tx = bank.begin().await;
    deposit(bank, &mut tx, "acct", "d-2", 500).await.unwrap();
    let paid = withdraw(bank, &mut tx, "w-2", 100).await.unwrap();
    B::commit(tx).await;
    let key = Key::derive("withdraw", "", "w-2").unwrap();
    let stored = bank.idem().store().get(&key).await.unwrap().unwrap();
    let only_cents = Fingerprint::of_json(&serde_json::json!({ "cents": 100 })).unwrap();
    // The digest, its policy version (derived by the attribute) set aside.
    assert_eq!(
        stored.fingerprint.map(|f| f.with_policy(0)),
        Some(only_cents)
    );

    let mut tx = bank.begin().await;
    let reused = withdraw(bank, &mut tx, "w-2", 999).await;
    B::commit(tx).await;
    assert!(
        matches!(reused, Err(BankError::Idem(idem::Error::KeyReused))),
        "{reused:?}"
    );
    let mut tx = bank.begin().await;
    let replayed = withdraw(bank, &mut tx, "w-2", 100).await.unwrap();
    B::commit(tx).await;
    assert_eq!(replayed, paid);
    assert_eq!(bank.committed().await, (400, 2), "withdrawn once");
}
