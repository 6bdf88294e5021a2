//! `#[idempotent(transaction = …)]` end to end on PostgreSQL, on the server of
//! `IDEM_TEST_PG_URL` (skipped without it, unless `IDEM_REQUIRE_PG=1`). Every test uses tables
//! of its own and drops them at the end.
#![cfg(feature = "postgres")]

mod macro_tx_support;

use std::future::Future;
use std::sync::Arc;

use idem::{PostgresStore, Transactional};
use idem_test_support::postgres::{drop_store_tables, drop_tables, fresh_store, pg_url};
use macro_tx_support::Bank;
use sqlx::Postgres;

struct PgBank {
    idem: Transactional<PostgresStore>,
    tables: idem_test_support::bank::Tables,
    _keep: (),
}

// READ COMMITTED, the default: a duplicate waits on the first claim's row, then replays.
macro_tx_support::impl_bank!(
    PgBank,
    store = PostgresStore,
    db = Postgres,
    sql = postgres,
    keep = (),
    bigint = "BIGINT",
    begin = "BEGIN"
);

impl PgBank {
    async fn drop_tables(&self) {
        let store = self.idem.store();
        drop_tables(store.pool(), &[&self.tables.accounts, &self.tables.ledger]).await;
        drop_store_tables(store).await;
    }
}

/// Runs `scenario` on a bank of its own on the server of `IDEM_TEST_PG_URL` (or skips), then
/// drops its tables.
async fn on_a_bank<F: Future<Output = ()>>(test: &str, scenario: impl FnOnce(Arc<PgBank>) -> F) {
    let Some(url) = pg_url(test) else { return };
    let store = fresh_store(&url, |b| b.max_connections(16)).await;
    let bank = Arc::new(PgBank::with_tables(store, ()).await);
    scenario(bank.clone()).await;
    bank.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_transaction_leaves_nothing_and_the_retry_applies_once() {
    let test = "dropped_transaction_leaves_nothing_and_the_retry_applies_once";
    on_a_bank(test, macro_tx_support::dropped_transaction_leaves_nothing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_deliveries_of_each_deposit_apply_once() {
    let test = "ten_concurrent_deliveries_of_each_deposit_apply_once";
    on_a_bank(test, macro_tx_support::concurrent_deliveries_apply_once).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_error_releases_the_claim() {
    let test = "an_error_releases_the_claim";
    on_a_bank(test, macro_tx_support::error_releases_the_claim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_fingerprint_leaves_out_the_transaction() {
    let test = "the_default_fingerprint_leaves_out_the_transaction";
    on_a_bank(
        test,
        macro_tx_support::default_fingerprint_leaves_out_the_transaction,
    )
    .await;
}
