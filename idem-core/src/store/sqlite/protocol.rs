//! The SQLite store on the shared store protocol: its pools and its [`Protocol`].

use sqlx::sqlite::{Sqlite, SqliteConnection, SqlitePool};

use super::SqliteStore;
use crate::store::sql::protocol::{sql_store, Protocol, SqlBackend};

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
}

sql_store!(SqliteStore, SqliteConnection);
