//! The database a steps test runs on, SQLite or PostgreSQL, as a store handle of its own:
//! shared by `steps_kill.rs` and `completer.rs` (each test binary compiles its own copy of
//! `support` and adds the methods it needs in an `impl Db` of its own).

use std::time::Duration;

use idem_core::Idempotency;

/// A store handle (with its own pool) on the test's database.
#[derive(Clone)]
pub enum Db {
    Sqlite(idem_sql::SqliteStore),
    #[cfg(feature = "postgres")]
    Postgres(idem_sql::PostgresStore),
}

impl Db {
    /// The store of `table` on `db`: `sqlite:<path>`, or a PostgreSQL URL. No pruner.
    pub async fn open(db: &str, table: &str) -> Db {
        if let Some(path) = db.strip_prefix("sqlite:") {
            let store = idem_sql::SqliteStore::builder()
                .table(table)
                .pruner(None)
                .open(path)
                .await
                .unwrap();
            return Db::Sqlite(store);
        }
        #[cfg(feature = "postgres")]
        {
            let store = idem_sql::PostgresStore::builder()
                .table(table)
                .pruner(None)
                .connect(db)
                .await
                .unwrap();
            Db::Postgres(store)
        }
        #[cfg(not(feature = "postgres"))]
        unreachable!("PostgreSQL runs need the postgres feature")
    }

    /// An engine on this store whose lease is `lease`.
    pub fn engine(&self, lease: Duration) -> Idempotency {
        let builder = match self {
            Db::Sqlite(s) => Idempotency::builder(s.clone()),
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => Idempotency::builder(s.clone()),
        };
        builder.lease(lease).build().unwrap()
    }

    /// Runs `sql` (one or more statements).
    pub async fn exec(&self, sql: &str) {
        match self {
            Db::Sqlite(s) => sqlx::raw_sql(sql).execute(s.pool()).await.map(|_| ()),
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => sqlx::raw_sql(sql).execute(s.pool()).await.map(|_| ()),
        }
        .unwrap();
    }
}
