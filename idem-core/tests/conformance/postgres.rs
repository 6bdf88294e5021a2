use std::sync::Arc;

use async_trait::async_trait;
use idem_core::conformance::Harness;
use idem_core::{PostgresStore, Store};
use sqlx::Connection;

use crate::harness::claim_order;

/// A PostgreSQL store on a table of its own in the server named by `IDEM_TEST_PG_URL` (other
/// tests share that server). Without the variable the test prints why and skips, unless
/// `IDEM_REQUIRE_PG=1` (set by `scripts/test`), which makes it a failure. `ORDER` picks the
/// store's claim order (see [`claim_order`]).
pub struct PgHarness<const ORDER: u8> {
    store: PostgresStore,
    url: String,
}

fn pg_url() -> Option<String> {
    crate::pg_env::pg_url(&crate::pg_env::current_test())
}

#[async_trait]
impl<const ORDER: u8> Harness for PgHarness<ORDER> {
    async fn new() -> Option<Self> {
        let url = pg_url()?;
        let table = format!("idem_conf_{:016x}", fastrand::u64(..));
        let store = PostgresStore::builder()
            .table(table)
            .claim_order(claim_order(ORDER))
            // Without the background pruner: the suite counts what `prune_expired` deletes.
            .pruner(None)
            .connect(&url)
            .await
            .expect("connect to IDEM_TEST_PG_URL and create a fresh table");
        Some(PgHarness { store, url })
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }
}

impl<const ORDER: u8> Drop for PgHarness<ORDER> {
    /// Drops the test's tables. Drop cannot await, and the test's runtime may be busy or gone,
    /// so a thread with a runtime of its own does it; failures only leave a stray table.
    fn drop(&mut self) {
        let url = self.url.clone();
        let table = self.store.table().to_owned();
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&url).await {
                    let _ = sqlx::raw_sql(&format!(
                        "DROP TABLE IF EXISTS \"{table}\", \"{table}_migrations\""
                    ))
                    .execute(&mut conn)
                    .await;
                }
            });
        });
        let _ = cleanup.join();
    }
}
