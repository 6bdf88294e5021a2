//! The PostgreSQL store on the shared store protocol: its pools and its [`Protocol`].

use sqlx::postgres::{PgConnection, PgPool, Postgres};

use super::PostgresStore;
use crate::store::sql::protocol::{sql_store, Protocol, SqlBackend};

impl SqlBackend for PostgresStore {
    type Db = Postgres;

    fn protocol(&self) -> &Protocol<Postgres> {
        &self.protocol
    }

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn renew_pool(&self) -> &PgPool {
        &self.renew_pool
    }
}

// Transactional mode: use the default `READ COMMITTED` isolation. A duplicate's claim then waits
// on the first transaction's row and, once that commits, reads the committed result with a fresh
// snapshot and replays it. (Under `REPEATABLE READ` or `SERIALIZABLE` the duplicate fails with a
// serialization error instead, SQLSTATE 40001, surfaced as a `StoreErrorKind::Transient` error:
// retry the transaction.)
sql_store!(PostgresStore, PgConnection);
