//! The store named by `--url`, opened through `idem::store::url` (which documents the
//! schemes), and what the commands say about each store.

use std::time::Duration;

use idem::store::url::{ConnectError, ConnectOptions, OpenedStore, StoreUrl};
use idem::{Store, StoreAdmin};

use crate::Failure;

/// An open store.
pub struct Opened(OpenedStore);

/// Where `migrate` and `prune` differ between stores.
pub enum Upkeep {
    /// Migrations applied on open; `prune` deletes expired rows.
    Sql,
    /// Nothing to migrate; the server deletes ended records itself.
    #[cfg(feature = "redis")]
    Redis,
    /// The table created if missing (by `migrate`); `prune` scans and deletes, and DynamoDB's
    /// TTL deletes too, in its own time.
    #[cfg(feature = "dynamodb")]
    Dynamo { created: bool, table: String },
}

impl Opened {
    /// Opens the store at `url` with its records under `table` (a table, or Redis's key prefix).
    /// With `create`, a missing DynamoDB table or SQLite file is created; every other command
    /// leaves a misspelled table or path an error rather than a new, empty store.
    pub async fn open(url: &StoreUrl, table: &str, create: bool) -> Result<Opened, Failure> {
        // A command runs once and reports what it did: no pruner deleting behind it (`prune`
        // is the command for that).
        let options = ConnectOptions::new()
            .namespace(table)
            .create_table_if_missing(create)
            .create_sqlite_file(create)
            .background_pruner(false);
        match url.connect(&options).await {
            Ok(opened) => Ok(Opened(opened)),
            Err(ConnectError::NoDynamoTable { table, endpoint }) => Err(Failure::Usage(format!(
                "no DynamoDB table {table:?} at {endpoint}: check --table (and AWS_REGION), or \
                 create it with `idem migrate`"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    pub fn store(&self) -> &dyn Store {
        self.0.store()
    }

    pub fn admin(&self) -> &dyn StoreAdmin {
        self.0.admin()
    }

    /// An engine over the store, for what an operator does through one (list and resolve
    /// uncertain operations), keeping a resolution for `retention` (the engine's default when
    /// `None`).
    pub fn engine(&self, retention: Option<Duration>) -> Result<idem::Idempotency, Failure> {
        let builder = idem::Idempotency::builder(self.0.clone().into_store());
        let builder = match retention {
            Some(retention) => builder.retention(retention),
            None => builder,
        };
        Ok(builder.build()?)
    }

    pub fn upkeep(&self) -> Upkeep {
        match &self.0 {
            #[cfg(feature = "redis")]
            OpenedStore::Redis(_) => Upkeep::Redis,
            #[cfg(feature = "dynamodb")]
            OpenedStore::DynamoDb {
                store,
                created_table,
            } => Upkeep::Dynamo {
                created: *created_table,
                table: store.table().to_owned(),
            },
            // SQLite and PostgreSQL.
            _ => Upkeep::Sql,
        }
    }

    /// Whether the last `prune_expired` stopped before the end of what it scans, so a call
    /// that deleted less than its batch is not yet the end (DynamoDB's examination budget).
    pub fn prune_unfinished(&self) -> bool {
        match &self.0 {
            #[cfg(feature = "dynamodb")]
            OpenedStore::DynamoDb { store, .. } => store.prune_scan_unfinished(),
            _ => false,
        }
    }

    /// The `stats` labels of the expired count and of the size, as each store means them.
    pub fn stats_labels(&self) -> (&'static str, &'static str) {
        match self.upkeep() {
            Upkeep::Sql => ("expired (to prune)", "table size"),
            #[cfg(feature = "redis")]
            Upkeep::Redis => ("ended (Redis deletes them)", "memory of the records"),
            #[cfg(feature = "dynamodb")]
            Upkeep::Dynamo { .. } => (
                "expired (to prune, or TTL)",
                "table size (DynamoDB's, up to 6 h old)",
            ),
        }
    }
}

/// How long a store gets to answer before the command gives up.
pub const OPEN_WITHIN: Duration = Duration::from_secs(30);
