//! [`StoreUrl::connect`]: opening the store a URL names (built with any store that opens by
//! URL).

use std::{sync::Arc, time::Duration};

use super::{StoreUrl, StoreUrlError};
use crate::{store::Store, Error, StoreAdmin};

/// How [`StoreUrl::connect`] opens a store. The defaults are each store builder's own.
///
/// ```
/// use idem::store::url::ConnectOptions;
/// let options = ConnectOptions::new()
///     .namespace("payments")
///     .max_connections(16)
///     .acquire_timeout(std::time::Duration::from_secs(30))
///     .create_table_if_missing(true);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    namespace: Option<String>,
    max_connections: Option<u32>,
    acquire_timeout: Option<Duration>,
    create_table_if_missing: bool,
    /// A missing SQLite file is an error rather than created (unless the URL's `mode` says).
    sqlite_file_must_exist: bool,
    /// `Some(false)`: no background pruner on a SQL store (a one-shot command, a test that
    /// counts rows).
    background_pruner: Option<bool>,
    /// A SQLite store's writers take turns in the process.
    sqlite_writers_take_turns: bool,
}

impl ConnectOptions {
    /// The store builders' defaults; a missing DynamoDB table is an error.
    ///
    /// ```
    /// let options = idem::store::url::ConnectOptions::new();
    /// # let _ = options;
    /// ```
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// Where the records are: the table (SQLite, PostgreSQL with `schema.table` allowed,
    /// DynamoDB) or the key prefix (Redis). Default: [`Scheme::default_namespace`](crate::store::url::Scheme::default_namespace).
    ///
    /// ```
    /// let options = idem::store::url::ConnectOptions::new().namespace("app.idem_records");
    /// # let _ = options;
    /// ```
    pub fn namespace(mut self, namespace: impl Into<String>) -> ConnectOptions {
        self.namespace = Some(namespace.into());
        self
    }

    /// The pool size of the SQL stores (their builders' `max_connections`).
    ///
    /// ```
    /// let options = idem::store::url::ConnectOptions::new().max_connections(16);
    /// # let _ = options;
    /// ```
    pub fn max_connections(mut self, n: u32) -> ConnectOptions {
        self.max_connections = Some(n);
        self
    }

    /// How long a PostgreSQL call waits for a pooled connection (`PostgresStoreBuilder::acquire_timeout`).
    ///
    /// ```
    /// let options = idem::store::url::ConnectOptions::new()
    ///     .acquire_timeout(std::time::Duration::from_secs(30));
    /// # let _ = options;
    /// ```
    pub fn acquire_timeout(mut self, timeout: Duration) -> ConnectOptions {
        self.acquire_timeout = Some(timeout);
        self
    }

    /// Whether a missing DynamoDB table is created (on-demand, with the store's key and TTL);
    /// without it a missing table is [`ConnectError::NoDynamoTable`], so a misspelled name is
    /// an error rather than a new table. The SQL stores always create their table (their
    /// migrations); Redis has none.
    ///
    /// ```
    /// let options = idem::store::url::ConnectOptions::new().create_table_if_missing(true);
    /// # let _ = options;
    /// ```
    pub fn create_table_if_missing(mut self, create: bool) -> ConnectOptions {
        self.create_table_if_missing = create;
        self
    }

    /// Whether a missing SQLite file is created (`true`, the default, as `SqliteStore::open`
    /// and `SqliteStore::connect` do) or is [`ConnectError::NoSqliteFile`] (`false`), so that
    /// a misspelled path is an error rather than a new, empty database: the `idem` command
    /// opens a store this way for every command but `migrate`. A URL that says `mode=rwc`
    /// (create) or `mode=rw` / `mode=ro` (must exist) is followed whatever this says.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # #[cfg(feature = "sqlite")] {
    /// use idem::store::url::{ConnectError, ConnectOptions, StoreUrl};
    /// let dir = tempfile::tempdir()?;
    /// let url = StoreUrl::parse(&format!("sqlite://{}", dir.path().join("idem.db").display()))?;
    /// let err = url.connect(&ConnectOptions::new().create_sqlite_file(false)).await.unwrap_err();
    /// assert!(matches!(err, ConnectError::NoSqliteFile { .. }));
    /// url.connect(&ConnectOptions::new()).await?; // creates it
    /// # }
    /// # Ok(()) }
    /// ```
    pub fn create_sqlite_file(mut self, create: bool) -> ConnectOptions {
        self.sqlite_file_must_exist = !create;
        self
    }

    /// Whether a SQL store deletes its expired records in the background while it lives (its
    /// builder's default, on) — off for a command that runs once and reports what it did.
    /// Redis and DynamoDB expire records by themselves either way.
    ///
    /// ```
    /// let options = idem::store::url::ConnectOptions::new().background_pruner(false);
    /// # let _ = options;
    /// ```
    pub fn background_pruner(mut self, on: bool) -> ConnectOptions {
        self.background_pruner = Some(on);
        self
    }

    /// Whether a SQLite store's writers take turns for its write lock in the process (its
    /// builder's [`writers_take_turns`](crate::SqliteStoreBuilder::writers_take_turns), off by
    /// default): on for a process whose writes to the file are the store's own, such as
    /// idem-server. Other stores ignore it.
    ///
    /// ```
    /// let options = idem::store::url::ConnectOptions::new().sqlite_writers_take_turns(true);
    /// # let _ = options;
    /// ```
    pub fn sqlite_writers_take_turns(mut self, on: bool) -> ConnectOptions {
        self.sqlite_writers_take_turns = on;
        self
    }
}

/// Why [`StoreUrl::connect`] could not open the store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # if cfg!(feature = "sqlite") {
/// use idem::store::url::{ConnectError, ConnectOptions, StoreUrl};
/// let url = StoreUrl::parse("sqlite:///no/such/dir/idem.db?mode=rw").unwrap();
/// let err = url.connect(&ConnectOptions::new()).await.unwrap_err();
/// assert!(matches!(err, ConnectError::NoSqliteFile { .. }));
/// # } }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL cannot be opened by this build.
    #[error(transparent)]
    Url(#[from] StoreUrlError),
    /// A SQLite file that does not exist, where [`ConnectOptions::create_sqlite_file`] is off or
    /// the URL says `mode=rw` or `mode=ro`.
    #[error(
        "no SQLite database at {path:?}: check the path, or add ?mode=rwc to the URL to create it"
    )]
    NoSqliteFile {
        /// The path in the URL.
        path: String,
    },
    /// PostgreSQL refused or could not be reached (the server's or the network's reason).
    #[error("cannot connect to PostgreSQL: {reason}")]
    PostgresUnreachable {
        /// Why: refused, bad password, no such database, …
        reason: String,
    },
    /// No DynamoDB table of that name, and [`ConnectOptions::create_table_if_missing`] is off.
    #[error(
        "no DynamoDB table {table:?} at {endpoint}: check the table name (and AWS_REGION), or \
         create it"
    )]
    NoDynamoTable {
        /// The table looked for.
        table: String,
        /// The endpoint asked.
        endpoint: String,
    },
    /// The store's own refusal: a bad table name or prefix, an unreachable server, missing
    /// credentials.
    #[error(transparent)]
    Store(#[from] Error),
}

/// A store opened by [`StoreUrl::connect`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # if cfg!(feature = "sqlite") {
/// use idem::store::url::{ConnectOptions, StoreUrl};
/// let opened = StoreUrl::parse("sqlite::memory:")?.connect(&ConnectOptions::new()).await?;
/// // The records table, the steps table, what a record keeps past its lease, the steps' journal
/// // and the journal in the record's row.
/// assert_eq!(opened.admin().schema_version().await?, 6);
/// let store = opened.into_store();
/// # let _ = store;
/// # }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum OpenedStore {
    /// From a `sqlite:` URL.
    #[cfg(feature = "sqlite")]
    Sqlite(crate::SqliteStore),
    /// From a `postgres://` URL.
    #[cfg(feature = "postgres")]
    Postgres(crate::PostgresStore),
    /// From a `redis://` or `redis-cluster://` URL.
    #[cfg(feature = "redis")]
    Redis(crate::RedisStore),
    /// From a `dynamodb` URL.
    #[cfg(feature = "dynamodb")]
    DynamoDb {
        /// The store.
        store: crate::DynamoStore,
        /// Whether opening it created its table.
        created_table: bool,
    },
    /// From an `idem+http://` URL: an idem-server.
    #[cfg(feature = "remote")]
    Remote(crate::RemoteStore),
}

impl OpenedStore {
    /// The store, to run work through.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # if cfg!(feature = "sqlite") {
    /// # use idem::store::url::{ConnectOptions, StoreUrl};
    /// let opened = StoreUrl::parse("sqlite::memory:")?.connect(&ConnectOptions::new()).await?;
    /// let store: &dyn idem::Store = opened.store();
    /// # let _ = store;
    /// # }
    /// # Ok(()) }
    /// ```
    pub fn store(&self) -> &dyn Store {
        self.opened()
    }

    /// The store's records as an operator sees them: look up, list, count, evict, prune.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # if cfg!(feature = "sqlite") {
    /// # use idem::store::url::{ConnectOptions, StoreUrl};
    /// let opened = StoreUrl::parse("sqlite::memory:")?.connect(&ConnectOptions::new()).await?;
    /// assert_eq!(opened.admin().stats().await?.in_progress, 0);
    /// # }
    /// # Ok(()) }
    /// ```
    pub fn admin(&self) -> &dyn StoreAdmin {
        self.opened()
    }

    /// The store behind either view.
    fn opened(&self) -> &dyn StoreAndAdmin {
        match self {
            #[cfg(feature = "sqlite")]
            OpenedStore::Sqlite(s) => s,
            #[cfg(feature = "postgres")]
            OpenedStore::Postgres(s) => s,
            #[cfg(feature = "redis")]
            OpenedStore::Redis(s) => s,
            #[cfg(feature = "dynamodb")]
            OpenedStore::DynamoDb { store, .. } => store,
            #[cfg(feature = "remote")]
            OpenedStore::Remote(s) => s,
        }
    }

    /// Closes the store cleanly once its last call is done: a SQLite store stops its pruner,
    /// checkpoints its log and closes its connections, so its `-wal` and `-shm` files go
    /// (`SqliteStore::close`); the other stores have nothing to close. Clones (and the store
    /// [`into_store`](Self::into_store) gave) share what it closes. idem-server calls it when it
    /// stops.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # #[cfg(feature = "sqlite")] {
    /// # use idem::store::url::{ConnectOptions, StoreUrl};
    /// let dir = tempfile::tempdir()?;
    /// let url = StoreUrl::parse(&format!("sqlite://{}", dir.path().join("idem.db").display()))?;
    /// let opened = url.connect(&ConnectOptions::new()).await?;
    /// let engine = idem::Idempotency::new(opened.clone().into_store());
    /// // … serve calls through `engine` …
    /// opened.close().await?;
    /// assert!(!dir.path().join("idem.db-wal").exists());
    /// # let _ = engine;
    /// # }
    /// # Ok(()) }
    /// ```
    pub async fn close(&self) -> Result<(), Error> {
        match self {
            #[cfg(feature = "sqlite")]
            OpenedStore::Sqlite(s) => s.close().await,
            #[allow(unreachable_patterns)]
            _ => Ok(()),
        }
    }

    /// The store, shared, for [`Idempotency::new`](crate::Idempotency::new) or a pruner.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # if cfg!(feature = "sqlite") {
    /// # use idem::store::url::{ConnectOptions, StoreUrl};
    /// let opened = StoreUrl::parse("sqlite::memory:")?.connect(&ConnectOptions::new()).await?;
    /// let idem = idem::Idempotency::new(opened.into_store());
    /// # let _ = idem;
    /// # }
    /// # Ok(()) }
    /// ```
    pub fn into_store(self) -> Arc<dyn Store> {
        match self {
            #[cfg(feature = "sqlite")]
            OpenedStore::Sqlite(s) => Arc::new(s),
            #[cfg(feature = "postgres")]
            OpenedStore::Postgres(s) => Arc::new(s),
            #[cfg(feature = "redis")]
            OpenedStore::Redis(s) => Arc::new(s),
            #[cfg(feature = "dynamodb")]
            OpenedStore::DynamoDb { store, .. } => Arc::new(store),
            #[cfg(feature = "remote")]
            OpenedStore::Remote(s) => Arc::new(s),
        }
    }
}

impl StoreUrl {
    /// Opens the store this URL names, as [`ConnectOptions`] say, applying a SQL store's
    /// migrations. A missing SQLite file is created unless the URL says `mode=rw` or `mode=ro`
    /// or [`ConnectOptions::create_sqlite_file`] is off; PostgreSQL is
    /// reached with one connection first, so a refusal says why (bad password, no database)
    /// rather than a pool timeout; DynamoDB's client comes from the environment
    /// (`DynamoStore::client_from_env`). Bound it with
    /// a timeout of your own: an unreachable host can take the stores' connect timeouts.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # #[cfg(feature = "sqlite")] {
    /// use idem::store::url::{ConnectOptions, OpenedStore, StoreUrl};
    /// let dir = tempfile::tempdir()?;
    /// let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    /// let opened = StoreUrl::parse(&url)?
    ///     .connect(&ConnectOptions::new().namespace("payments"))
    ///     .await?;
    /// assert!(matches!(opened, OpenedStore::Sqlite(_)));
    /// # }
    /// # Ok(()) }
    /// ```
    pub async fn connect(&self, options: &ConnectOptions) -> Result<OpenedStore, ConnectError> {
        /// The options both SQL store builders take (they share no trait), applied to `$builder`.
        #[cfg(any(feature = "sqlite", feature = "postgres"))]
        macro_rules! sql_options {
            ($builder:expr, $namespace:expr, $options:expr) => {{
                let mut builder = $builder;
                if let Some(table) = $namespace {
                    builder = builder.table(table);
                }
                if let Some(n) = $options.max_connections {
                    builder = builder.max_connections(n);
                }
                if $options.background_pruner == Some(false) {
                    builder = builder.pruner(None);
                }
                builder
            }};
        }
        let namespace = options.namespace.as_deref();
        match self {
            #[cfg(feature = "sqlite")]
            StoreUrl::Sqlite(url) => {
                let missing = crate::SqliteStore::missing_file(url, !options.sqlite_file_must_exist)?;
                if let Some(path) = missing {
                    return Err(ConnectError::NoSqliteFile { path });
                }
                let builder = sql_options!(crate::SqliteStore::builder(), namespace, options)
                    .writers_take_turns(options.sqlite_writers_take_turns);
                Ok(OpenedStore::Sqlite(builder.connect(url).await?))
            }
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => {
                use crate::sqlx::Connection;
                let probe = crate::sqlx::PgConnection::connect(url).await.map_err(|e| {
                    ConnectError::PostgresUnreachable {
                        reason: e.to_string(),
                    }
                })?;
                // The probe only had to open; how it closes changes nothing.
                let _ = probe.close().await;
                let mut builder = sql_options!(crate::PostgresStore::builder(), namespace, options);
                if let Some(timeout) = options.acquire_timeout {
                    builder = builder.acquire_timeout(timeout);
                }
                Ok(OpenedStore::Postgres(builder.connect(url).await?))
            }
            #[cfg(feature = "redis")]
            StoreUrl::Redis(url) => Ok(OpenedStore::Redis(
                redis_builder(namespace).connect(url).await?,
            )),
            #[cfg(feature = "redis")]
            StoreUrl::RedisCluster(nodes) => Ok(OpenedStore::Redis(
                redis_builder(namespace).connect_cluster(nodes).await?,
            )),
            #[cfg(feature = "dynamodb")]
            StoreUrl::DynamoDb { endpoint } => {
                connect_dynamo(endpoint, namespace, options.create_table_if_missing).await
            }
            // Nothing is sent until the first call: the server's routes need no set-up.
            #[cfg(feature = "remote")]
            StoreUrl::Remote { server, token } => {
                let mut builder = crate::RemoteStore::builder(server.clone(), token.clone());
                if let Some(namespace) = namespace {
                    builder = builder.namespace(namespace);
                }
                Ok(OpenedStore::Remote(builder.build()?))
            }
            #[allow(unreachable_patterns)]
            other => Err(ConnectError::Url(StoreUrlError::NotBuilt {
                url: other.scheme().prefixes()[0].to_owned(),
                scheme: other.scheme(),
            })),
        }
    }
}

#[cfg(feature = "redis")]
fn redis_builder(prefix: Option<&str>) -> crate::RedisStoreBuilder {
    let builder = crate::RedisStore::builder();
    match prefix {
        Some(prefix) => builder.prefix(prefix),
        None => builder,
    }
}

#[cfg(feature = "dynamodb")]
async fn connect_dynamo(
    endpoint: &str,
    table: Option<&str>,
    create: bool,
) -> Result<OpenedStore, ConnectError> {
    use crate::DynamoStore;

    let table = table.unwrap_or(super::Scheme::DynamoDb.default_namespace());
    let client = DynamoStore::client_from_env(endpoint)?;
    let described = client.describe_table().table_name(table).send().await;
    let missing = matches!(&described, Err(e) if e
        .as_service_error()
        .is_some_and(|e| e.is_resource_not_found_exception()));
    // Any other failure: the builder's own check below reports it.
    if missing && !create {
        return Err(ConnectError::NoDynamoTable {
            table: table.to_owned(),
            endpoint: endpoint.to_owned(),
        });
    }
    if missing {
        DynamoStore::create_table(&client, table).await?;
    }
    let store = DynamoStore::builder().table(table).build(client).await?;
    Ok(OpenedStore::DynamoDb {
        store,
        created_table: missing,
    })
}

/// A store and its operator's view, one object (each opened store is both).
trait StoreAndAdmin: Store + StoreAdmin {}

impl<S: Store + StoreAdmin> StoreAndAdmin for S {}
