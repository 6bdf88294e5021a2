use std::sync::Arc;

use async_trait::async_trait;
use idem_core::conformance::Harness;
use idem_core::Store;
use idem_sql::PostgresStore;
use idem_test_support::postgres::{drop_store_tables_now, fresh_store, pg_url};

use crate::harness::claim_order;

/// A PostgreSQL store on a table of its own in the server named by `IDEM_TEST_PG_URL` (other
/// tests share that server). Without the variable the test prints why and skips, unless
/// `IDEM_REQUIRE_PG=1` (set by `scripts/test`), which makes it a failure. `ORDER` picks the
/// store's claim order (see [`claim_order`]).
pub struct PgHarness<const ORDER: u8> {
    store: PostgresStore,
    url: String,
}

#[async_trait]
impl<const ORDER: u8> Harness for PgHarness<ORDER> {
    async fn new() -> Option<Self> {
        let url = pg_url(&idem_test_support::current_test())?;
        // Without the background pruner: the suite counts what `prune_expired` deletes.
        let store = fresh_store(&url, |b| b.claim_order(claim_order(ORDER)).pruner(None)).await;
        Some(PgHarness { store, url })
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }
}

impl<const ORDER: u8> Drop for PgHarness<ORDER> {
    /// Drops the test's tables (from a runtime of its own: Drop cannot await).
    fn drop(&mut self) {
        drop_store_tables_now(&self.url, self.store.table());
    }
}
