use std::sync::Arc;

use async_trait::async_trait;
use idem_core::conformance::Harness;
use idem_core::Store;
use idem_sql::SqliteStore;
use tempfile::TempDir;

use crate::harness::claim_order;

/// A SQLite store on a fresh database file; the directory lives (and is deleted) with the harness.
/// `ORDER` picks the store's claim order (see [`claim_order`]); 3 is the adaptive order with the
/// writers taking turns, so that the store's group writes the claims and completions (as in
/// idem-server).
pub struct SqliteHarness<const ORDER: u8> {
    store: SqliteStore,
    _dir: TempDir,
}

#[async_trait]
impl<const ORDER: u8> Harness for SqliteHarness<ORDER> {
    async fn new() -> Option<Self> {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        // Without the background pruner: the suite counts what `prune_expired` deletes.
        let store = SqliteStore::builder()
            .claim_order(claim_order(ORDER))
            .writers_take_turns(ORDER == 3)
            .pruner(None)
            .open(dir.path().join("idem.db"))
            .await
            .expect("open a SQLite store on a fresh file");
        Some(SqliteHarness { store, _dir: dir })
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }
}
