//! `#[idempotent(transaction = …)]` end to end on SQLite (a database file in a temporary
//! directory): the claim, the body's writes and the stored result share the caller's
//! transaction.
#![cfg(feature = "sqlite")]

mod macro_tx_support;

use std::sync::Arc;

use idem::{SqliteStore, Transactional};
use macro_tx_support::Bank;
use sqlx::Sqlite;

struct SqliteBank {
    idem: Transactional<SqliteStore>,
    tables: idem_test_support::bank::Tables,
    _keep: tempfile::TempDir,
}

// `BEGIN IMMEDIATE`: concurrent deliveries queue for the write lock up front.
macro_tx_support::impl_bank!(
    SqliteBank,
    store = SqliteStore,
    db = Sqlite,
    sql = sqlite,
    keep = tempfile::TempDir,
    bigint = "INTEGER",
    begin = "BEGIN IMMEDIATE"
);

impl SqliteBank {
    async fn open() -> Arc<SqliteBank> {
        let (store, dir) = idem_test_support::bank::sqlite::store().await;
        Arc::new(SqliteBank::with_tables(store, dir).await)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_transaction_leaves_nothing_and_the_retry_applies_once() {
    macro_tx_support::dropped_transaction_leaves_nothing(SqliteBank::open().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_deliveries_of_each_deposit_apply_once() {
    macro_tx_support::concurrent_deliveries_apply_once(SqliteBank::open().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_error_releases_the_claim() {
    macro_tx_support::error_releases_the_claim(SqliteBank::open().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_fingerprint_leaves_out_the_transaction() {
    macro_tx_support::default_fingerprint_leaves_out_the_transaction(SqliteBank::open().await)
        .await;
}
