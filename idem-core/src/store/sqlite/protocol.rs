//! The SQLite store on the shared store protocol: its pools and its [`Protocol`].

use sqlx::sqlite::{Sqlite, SqliteConnection, SqlitePool};

use super::SqliteStore;
use crate::sql::protocol::{sql_store, Protocol, SqlBackend};

impl SqlBackend for SqliteStore {
    type Db = Sqlite;

    fn protocol(&self) -> &Protocol<Sqlite> {
        &self.protocol
    }

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn renew_pool(&self) -> &SqlitePool {
        &self.renew_pool
    }

    /// The default: a batch holds the database's only write lock, so every claim waits for it.
    const PRUNE_BATCH_SIZE: u32 = crate::PrunerConfig::DEFAULT_BATCH_SIZE;
}

sql_store!(SqliteStore, SqliteConnection);
