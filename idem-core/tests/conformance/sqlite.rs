use std::sync::Arc;

use async_trait::async_trait;
use idem_core::{SqliteStore, Store};
use tempfile::TempDir;

use crate::harness::Harness;

/// A SQLite store on a fresh database file; the directory lives (and is deleted) with the harness.
pub struct SqliteHarness {
    store: SqliteStore,
    _dir: TempDir,
}

#[async_trait]
impl Harness for SqliteHarness {
    async fn new() -> Option<Self> {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let store = SqliteStore::open(dir.path().join("idem.db"))
            .await
            .expect("open a SQLite store on a fresh file");
        Some(SqliteHarness { store, _dir: dir })
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }
}
