//! [`SqlStore<DB>`]: the one store type of both databases ([`SqliteStore`](crate::SqliteStore)
//! and [`PostgresStore`](crate::PostgresStore) are its aliases, as sqlx's `SqlitePool` and
//! `PgPool` are of `Pool<DB>`), with what both share: the `Store` and `TransactionalStore`
//! impls (each operation on the protocol, on a pooled connection or the caller's), the
//! accessors, and the builder's shared settings. What differs per database (opening, pool
//! settings, the schema) is in `sqlite/` and `postgres/`.

use std::fmt;
use std::sync::Arc;

use idem_core::{
    Abandoned, AbandonedQuery, Claim, ClaimOutcome, ClaimRequest, Completion, Error, Key,
    PrunerConfig, Record, StepLog, StepWrite, Store, Token, UncertainOperation,
};

use crate::background::Background;
use crate::claim_order::ClaimOrder;
use crate::dialect::Backend;
use crate::group::Write;
use crate::protocol::Protocol;
use crate::TransactionalStore;

/// Idempotency records in a SQL database: `SqlStore<sqlx::Sqlite>` is
/// [`SqliteStore`](crate::SqliteStore) (feature `sqlite`) and `SqlStore<sqlx::Postgres>` is
/// [`PostgresStore`](crate::PostgresStore) (feature `postgres`). Both run one store protocol,
/// written once; each alias's page says what its database does (the schema, the time source,
/// the round trips, the connection settings). Name the store by its alias; write
/// `SqlStore<DB>` only in code generic over the database.
///
/// Cloning is cheap and shares the connection pools and the background pruner, which stops
/// when the last clone is dropped.
///
/// ```
/// use idem::{SqlStore, SqliteStore};
/// fn table_of<DB: idem::kit::Backend>(store: &SqlStore<DB>) -> &str {
///     store.table()
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let store: SqliteStore = SqliteStore::connect("sqlite::memory:").await?;
/// assert_eq!(table_of(&store), "idem_records");
/// # Ok(()) }
/// ```
pub struct SqlStore<DB: Backend> {
    pub(crate) pool: sqlx::Pool<DB>,
    /// Where `renew` runs: a pool of its own (one connection for a SQLite file, at most two
    /// on PostgreSQL), so that work holding every connection of `pool` cannot starve its own
    /// heartbeat; `pool` itself for an in-memory SQLite database, which lives in the one
    /// connection.
    pub(crate) renew_pool: sqlx::Pool<DB>,
    pub(crate) protocol: Arc<Protocol<DB>>,
    /// The background pruner, stopped when the last clone goes.
    pub(crate) pruner: Background,
}

impl<DB: Backend> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            renew_pool: self.renew_pool.clone(),
            protocol: Arc::clone(&self.protocol),
            pruner: self.pruner.clone(),
        }
    }
}

impl<DB: Backend> fmt::Debug for SqlStore<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(DB::DIALECT.store)
            .field("table", &self.table())
            .field("claim_order", &self.claim_order())
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> SqlStore<DB> {
    /// The connection pool, for running your own statements on the same database.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = idem::SqliteStore::connect("sqlite::memory:").await?;
    /// let n: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
    ///     .fetch_one(store.pool())
    ///     .await
    ///     .map_err(idem::sql_error)?;
    /// println!("{n} records");
    /// # Ok(()) }
    /// ```
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// The name of the records table, as configured.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = idem::SqliteStore::connect("sqlite::memory:").await?;
    /// assert_eq!(store.table(), "idem_records");
    /// # Ok(()) }
    /// ```
    pub fn table(&self) -> &str {
        self.protocol.table().as_configured()
    }

    /// The claim order `start` follows (see [`ClaimOrder`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = idem::SqliteStore::connect("sqlite::memory:").await?;
    /// assert_eq!(store.claim_order(), idem::ClaimOrder::Adaptive);
    /// # Ok(()) }
    /// ```
    pub fn claim_order(&self) -> ClaimOrder {
        self.protocol.claim_order()
    }

    /// Whether this store deletes its expired records in the background (the default; see
    /// the builder's [`pruner`](SqlStoreBuilder::pruner)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = idem::SqliteStore::connect("sqlite::memory:").await?;
    /// assert!(store.prunes_in_background());
    /// # Ok(()) }
    /// ```
    pub fn prunes_in_background(&self) -> bool {
        self.pruner.is_some()
    }

    /// This store without its background pruner, for the pruner itself: a clone holding the
    /// handle would keep the pruner alive for ever.
    pub(crate) fn without_pruner(&self) -> Self {
        SqlStore {
            pruner: None,
            ..self.clone()
        }
    }
}

/// Configures a [`SqlStore`] before connecting: [`SqliteStoreBuilder`](crate::SqliteStoreBuilder)
/// and [`PostgresStoreBuilder`](crate::PostgresStoreBuilder) are its aliases, made by
/// `SqliteStore::builder()` and `PostgresStore::builder()`. The settings below are both
/// databases'; each alias's page has its database's own (pool and lock timeouts, durability)
/// and how to finish (open a file, connect to a URL, or use a pool of yours).
///
/// ```
/// let builder = idem::SqliteStore::builder().table("idem_orders").max_connections(4);
/// # let _ = builder;
/// ```
pub struct SqlStoreBuilder<DB: Backend> {
    pub(crate) table: String,
    pub(crate) max_connections: u32,
    pub(crate) claim_order: ClaimOrder,
    pub(crate) pruner: Option<PrunerConfig>,
    pub(crate) migrate_on_connect: bool,
    /// The database's own settings.
    pub(crate) db: DB::Settings,
}

impl<DB: Backend> SqlStoreBuilder<DB> {
    /// The builder of a store with the default settings: table `idem_records`, `max_connections`
    /// as given, the adaptive claim order, the default pruner, migrating on connect.
    pub(crate) fn with(max_connections: u32, db: DB::Settings) -> Self {
        SqlStoreBuilder {
            table: crate::DEFAULT_TABLE.to_owned(),
            max_connections,
            claim_order: ClaimOrder::Adaptive,
            pruner: Some(PrunerConfig::new()),
            migrate_on_connect: true,
            db,
        }
    }

    /// The records table (default `idem_records`); its ledger of applied migrations is
    /// `<table>_migrations` and its steps table `<table>_steps`. A plain identifier,
    /// `[A-Za-z_][A-Za-z0-9_]{0,62}` (at most 63 bytes, PostgreSQL's limit); on PostgreSQL
    /// `schema.name` too (the schema must exist), and on SQLite not starting with `sqlite_`
    /// (reserved by SQLite). A derived name longer than 63 bytes is cut short and ends in a
    /// hash of the whole (docs/stores.md). Names are quoted, so on PostgreSQL `Idem` and `idem`
    /// are two tables. A bad name fails connecting with [`Error::InvalidConfig`] before
    /// anything touches the database. Several tables make independent stores in one database.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let err = idem::SqliteStore::builder().table("bad-name").connect("sqlite::memory:").await;
    /// assert!(matches!(err, Err(idem::Error::InvalidConfig(_))));
    /// let builder = idem::PostgresStore::builder().table("app.idem_records");
    /// # let _ = builder;
    /// # }
    /// ```
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// The most connections the pool opens (SQLite: default 8, and at least 1; SQLite runs one
    /// writer at a time, so more connections only add concurrent readers, and an in-memory
    /// database always uses one. PostgreSQL: default 10; 0 fails connecting with
    /// [`Error::InvalidConfig`]). Ignored by `from_pool`, whose pool keeps its own.
    ///
    /// ```
    /// let builder = idem::SqliteStore::builder().max_connections(2);
    /// # let _ = builder;
    /// ```
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Whether `start` claims first, reads first, or picks by the recent traffic (the default,
    /// [`ClaimOrder::Adaptive`]). See [`ClaimOrder`] for what each costs.
    ///
    /// ```
    /// let builder = idem::SqliteStore::builder().claim_order(idem::ClaimOrder::ReadFirst);
    /// # let _ = builder;
    /// ```
    pub fn claim_order(mut self, order: ClaimOrder) -> Self {
        self.claim_order = order;
        self
    }

    /// The pruner the store runs in the background while it lives: on by default, with
    /// [`PrunerConfig::new`]; a config of your own, or `None` to turn it off.
    ///
    /// It is [`Pruner::records`](idem_core::Pruner::records) on the store, spawned on the tokio
    /// runtime that connects: it deletes expired records in bounded batches, paced to a share
    /// of the store's time, under a lease kept in the table itself, so that of all the
    /// processes and nodes sharing a table one prunes at a time. It stops when the last clone
    /// of the store is dropped (after the batch in progress, releasing its lease). Turn it off
    /// where something else prunes the table (a [`Pruner`](idem_core::Pruner) you spawn and
    /// watch yourself, a scheduled `idem prune`), in a short-lived process such as a
    /// command-line tool, or in a test that counts rows: its lease is a row of the table while
    /// a run lasts.
    ///
    /// ```
    /// use idem::PrunerConfig;
    /// let quiet = idem::SqliteStore::builder().pruner(None);
    /// let gentle = idem::PostgresStore::builder().pruner(PrunerConfig::new().share(0.05));
    /// # let _ = (quiet, gentle);
    /// ```
    pub fn pruner(mut self, config: impl Into<Option<PrunerConfig>>) -> Self {
        self.pruner = config.into();
        self
    }

    /// Whether connecting creates or upgrades the schema (`true`, the default) or only checks
    /// it (`false`): then connecting needs no right to create tables, and a schema missing or
    /// older than this idem needs fails with
    /// [`Error::SchemaNotMigrated`](idem_core::Error::SchemaNotMigrated) instead. Bring the
    /// schema up to date before with the builder's `migrate`, or by applying its `schema_sql`
    /// (the `.sql` files shipped in `idem-sql/sql/`) with your own tools.
    ///
    /// ```
    /// let builder = idem::SqliteStore::builder().migrate_on_connect(false);
    /// # let _ = builder;
    /// ```
    pub fn migrate_on_connect(mut self, migrate: bool) -> Self {
        self.migrate_on_connect = migrate;
        self
    }
}

impl<DB: Backend> Clone for SqlStoreBuilder<DB> {
    fn clone(&self) -> Self {
        SqlStoreBuilder {
            table: self.table.clone(),
            max_connections: self.max_connections,
            claim_order: self.claim_order,
            pruner: self.pruner.clone(),
            migrate_on_connect: self.migrate_on_connect,
            db: self.db.clone(),
        }
    }
}

impl<DB: Backend> fmt::Debug for SqlStoreBuilder<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(DB::DIALECT.builder)
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("claim_order", &self.claim_order)
            .field("pruner", &self.pruner)
            .field("migrate_on_connect", &self.migrate_on_connect)
            .field("settings", &self.db)
            .finish()
    }
}

/// A completion's retention and key retention in milliseconds, refused when out of range.
fn completion_millis(completion: &Completion<'_>) -> Result<(i64, i64), Error> {
    let retention = crate::millis("retention", completion.retention)?;
    Ok((
        retention,
        crate::key_retention_millis(completion.key_retention)?,
    ))
}

#[async_trait::async_trait]
impl<DB: Backend> Store for SqlStore<DB> {
    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        let lease = crate::millis("lease", request.lease)?;
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let via = crate::protocol::Via::Pool;
        self.protocol.start(via, &mut conn, request, lease).await
    }

    async fn complete(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error> {
        if let Some(group) = self.protocol.group() {
            let (retention, key_retention) = completion_millis(&completion)?;
            let write = Write::complete(claim, &completion, retention, key_retention);
            return crate::fenced(group.write(write).await?);
        }
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let _turn = self.protocol.write_turn().await?;
        TransactionalStore::complete_in(self, &mut conn, claim, completion).await
    }

    async fn abort(&self, claim: &Claim) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let _turn = self.protocol.write_turn().await?;
        TransactionalStore::abort_in(self, &mut conn, claim).await
    }

    async fn renew(&self, claim: &Claim, lease: std::time::Duration) -> Result<(), Error> {
        let lease = crate::millis("lease", lease)?;
        let mut conn = self
            .renew_pool
            .acquire()
            .await
            .map_err(crate::error::sql_error)?;
        let _turn = self.protocol.write_turn().await?;
        self.protocol.renew(&mut conn, claim, lease).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        self.protocol.get(&mut conn, key).await
    }

    async fn evict(&self, key: &Key) -> Result<bool, Error> {
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let _turn = self.protocol.write_turn().await?;
        self.protocol.evict(&mut conn, key).await
    }

    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let _turn = self.protocol.write_turn().await?;
        self.protocol.prune_expired(&mut conn, limit).await
    }

    fn prune_batch_size(&self) -> u32 {
        DB::DIALECT.prune_batch_size
    }

    /// One statement on PostgreSQL (one query on SQLite) for a new operation, whose steps are
    /// begun without a write; a retry or a takeover adds `begin_steps`' upsert.
    async fn claim_steps(
        &self,
        request: ClaimRequest<'_>,
        retention: std::time::Duration,
    ) -> Result<(ClaimOutcome, Option<StepLog>), Error> {
        let lease = crate::millis("lease", request.lease)?;
        let retention = crate::millis("retention", retention)?;
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        self.protocol
            .start_steps(&mut conn, request, lease, retention)
            .await
    }

    async fn begin_steps(
        &self,
        claim: &Claim,
        retention: std::time::Duration,
    ) -> Result<StepLog, Error> {
        let retention = crate::millis("retention", retention)?;
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let _turn = self.protocol.write_turn().await?;
        self.protocol
            .steps()
            .begin::<DB>(&mut conn, claim, retention, false)
            .await
    }

    async fn take_uncertain(
        &self,
        key: &Key,
        token: Token,
        lease: std::time::Duration,
    ) -> Result<Claim, Error> {
        let lease = crate::millis("lease", lease)?;
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let _turn = self.protocol.write_turn().await?;
        self.protocol
            .take_uncertain(&mut conn, key, token, lease)
            .await
    }

    async fn find_uncertain(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<UncertainOperation>, Error> {
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        self.protocol
            .find_uncertain(&mut conn, query.after, query.limit)
            .await
    }

    async fn find_abandoned(&self, query: AbandonedQuery<'_>) -> Result<Vec<Abandoned>, Error> {
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        self.protocol
            .steps()
            .find_abandoned::<DB>(&mut conn, query.after, query.limit)
            .await
    }

    async fn write_step(&self, claim: &Claim, step: StepWrite<'_>) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await.map_err(crate::error::sql_error)?;
        let _turn = self.protocol.write_turn().await?;
        TransactionalStore::write_step_in(self, &mut conn, claim, step).await
    }
}

impl<DB: Backend> crate::protocol::Sealed for SqlStore<DB> {}

#[async_trait::async_trait]
impl<DB: Backend> TransactionalStore for SqlStore<DB> {
    type Connection = DB::Connection;

    async fn claim_in(
        &self,
        conn: &mut DB::Connection,
        request: ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, Error> {
        let lease = crate::millis("lease", request.lease)?;
        let via = crate::protocol::Via::Transaction;
        self.protocol.start(via, conn, request, lease).await
    }

    async fn complete_in(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        completion: Completion<'_>,
    ) -> Result<(), Error> {
        let (retention, key_retention) = completion_millis(&completion)?;
        self.protocol
            .complete(conn, claim, completion, retention, key_retention)
            .await
    }

    async fn abort_in(&self, conn: &mut DB::Connection, claim: &Claim) -> Result<(), Error> {
        self.protocol.abort(conn, claim).await
    }

    async fn write_step_in(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        step: StepWrite<'_>,
    ) -> Result<(), Error> {
        let retention = crate::millis("retention", step.retention)?;
        self.protocol
            .steps()
            .write::<DB>(conn, claim, step, retention)
            .await
    }
}
