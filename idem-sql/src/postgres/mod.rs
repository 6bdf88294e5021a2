//! The PostgresStore (its docs hold the schema, the time source and the round trips).
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions, Postgres};
use sqlx::Connection;

use crate::background;
use crate::error::sql_error;
use crate::name::TableName;
use crate::protocol::Protocol;
use crate::store::{SqlStore, SqlStoreBuilder};
use idem_core::Error;

mod schema;

/// The size of the pool `renew` runs on. Renewals are rare (one per third of a lease per running
/// claim) and short; two keep one slow renewal from holding up the others.
const RENEW_CONNECTIONS: u32 = 2;

/// Records in a PostgreSQL table: the store for services with more than one process or node.
///
/// A claim is one conditional `INSERT … ON CONFLICT DO UPDATE` statement, leases and expiry use
/// the server's clock, and a replay costs one round trip while most traffic is replays (see
/// [`ClaimOrder`](crate::ClaimOrder)). See the sections below for the
/// schema, the round trips of each call and the SQL features it relies on.
///
/// Cloning is cheap: clones share the connection pool.
///
/// ```no_run
/// use std::time::Duration;
/// use idem::{Key, PostgresStore, ClaimOutcome, ClaimRequest, Store};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let store = PostgresStore::connect("postgres://postgres@127.0.0.1/postgres").await?;
/// let key = Key::derive("deposit", "alice", "req-1")?;
/// match store.claim(ClaimRequest::new(&key, Duration::from_secs(30))).await? {
///     ClaimOutcome::Claimed(claim) => { /* run the work, then store.complete(&claim, …) */ }
///     ClaimOutcome::Completed(cached) => { /* replay cached.response */ }
///     ClaimOutcome::Locked { retry_after } => { /* another node is running it */ }
///     ClaimOutcome::Uncertain { since } => { /* its holder died with OnLapse::Uncertain */ }
///     ClaimOutcome::Expired { since } => { /* completed; its result expired at `since` */ }
/// }
/// # Ok(()) }
/// ```
///
/// (feature `postgres`).
///
/// # Pointing idem at your database
///
/// ```no_run
/// use idem::PostgresStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// // Creates (or upgrades) the table `idem_records` and its expiry index on first connect.
/// let store = PostgresStore::connect("postgres://app:secret@db.internal/app").await?;
///
/// // Or: your own table name (optionally schema-qualified), on a pool you share with your own
/// // queries, made with the store's pool options (no ping before every statement).
/// let builder = PostgresStore::builder().table("billing.idem_payments");
/// let pool = builder.pool_options().connect("postgres://app:secret@db.internal/app").await.map_err(idem::sql_error)?;
/// let store = builder.from_pool(pool.clone()).await?;
/// # let _ = store; Ok(()) }
/// ```
///
/// The role needs `CREATE` on the schema for the first connect (it creates two tables and an
/// index) and `SELECT, INSERT, UPDATE, DELETE` on them afterwards. The schema itself must exist.
///
/// # Without `CREATE`: migrating out of band
///
/// A role that may only read and write rows connects with
/// [`migrate_on_connect(false)`](PostgresStoreBuilder::migrate_on_connect): connecting then only
/// reads `<table>_migrations` and fails with [`Error::SchemaNotMigrated`] while the schema is
/// missing or older than this idem needs, creating nothing. The table's owner brings it up to
/// date beforehand, with [`PostgresStoreBuilder::migrate`] in a deployment step or with the same
/// statements as a script: `idem-sql/sql/postgres/idem_records.sql` for the default table,
/// [`PostgresStoreBuilder::schema_sql`] for any (`psql --single-transaction -f`, or as a new
/// migration of your own tool; idem never reads sqlx's `_sqlx_migrations`).
///
/// ```no_run
/// use idem::PostgresStore;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// // After `psql --single-transaction -f idem_records.sql` as the owner, and
/// // GRANT SELECT, INSERT, UPDATE, DELETE ON idem_records, idem_records_migrations TO app;
/// let store = PostgresStore::builder()
///     .migrate_on_connect(false)
///     .connect("postgres://app@db.internal/app")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
///
/// # Pruning
///
/// An expired record stays in the table until something deletes it (a new claim of the same key
/// replaces it, but most keys never come back). The store deletes expired records itself while
/// it lives: on connect it spawns a [`Pruner`](idem_core::Pruner) of its records on the tokio
/// runtime, with [`PrunerConfig::new`](idem_core::PrunerConfig::new) (batches of 1,000 paced to a fifth of the store's time),
/// which stops when the last clone of the store is dropped. Its lease is a record of the table,
/// so of all the nodes sharing the table one prunes at a time and the others skip their turn.
/// [`PostgresStoreBuilder::pruner`] configures it or turns it off.
///
/// # Schema
///
/// For the default table name `idem_records` (every name below follows the configured one):
///
/// ```sql
/// CREATE TABLE idem_records (
///     key         bytea       PRIMARY KEY,   -- 32 bytes: SHA-256 of (scope, caller, client key)
///     fingerprint bytea       NULL,          -- 32 bytes: SHA-256 of the request, if given
///     token       bytea       NOT NULL,      -- 16 bytes: the claim's random fencing token
///     state       smallint    NOT NULL,      -- 0 in progress, 1 completed
///     expires_at  timestamptz NOT NULL,      -- when the key frees: lease end (in progress),
///                                            -- tombstone end (completed)
///     response    bytea       NULL,          -- the encoded response once completed
///     is_error    boolean     NOT NULL DEFAULT false,
///     -- version 3 (docs/architecture.md, "Past the lease"):
///     result_until timestamptz NULL,         -- completed: the result's retention end (NULL on
///                                            -- rows completed before version 3: expires_at)
///     uncertain   boolean     NOT NULL DEFAULT false -- claimed with OnLapse::Uncertain
/// );
/// -- The pruner's (version 6, under version 1's name): what it next does to a row, strip its
/// -- response (1: a tombstone's, after its retention) or delete it (0), and when.
/// CREATE INDEX idem_records_expires_at_idx ON idem_records (
///     (CASE WHEN response IS NOT NULL AND expires_at > result_until THEN 1 ELSE 0 END),
///     (CASE WHEN response IS NOT NULL AND expires_at > result_until
///           THEN result_until ELSE expires_at END));
/// -- Partial: the uncertain claims (find_uncertain).
/// CREATE INDEX idem_records_uncertain_idx ON idem_records (key)
///     WHERE state = 0 AND uncertain = true;
/// -- applied migrations, one row per version
/// CREATE TABLE idem_records_migrations (version bigint PRIMARY KEY, description text NOT NULL,
///                                       applied_at timestamptz NOT NULL);
/// ```
///
/// A completion with a `key_retention` keeps its result until `result_until` and its key until
/// `expires_at`, `result_until` plus the `key_retention` in whole seconds (rounded up); without
/// one the two are equal. Once `result_until` passes the record is a tombstone (a claim gets
/// [`ClaimOutcome::Expired`](idem_core::ClaimOutcome::Expired)) and the pruner drops its
/// response: the row left is 113 bytes (145 with a fingerprint) as `pg_column_size` counts it,
/// about 200 with its line pointer and index entries (docs/postgres.md). A claim made with
/// [`OnLapse::Uncertain`](idem_core::OnLapse::Uncertain) whose lease ends is never taken over
/// nor pruned (`uncertain`): only its holder, `take_uncertain` or `evict` change it.
///
/// Migrations are embedded and versioned (`schema.rs`) and applied by the migrator that the
/// SQLite store and the kit share. On connect the pending versions are applied in one
/// transaction, each after first inserting its row into `<table>_migrations`: a node that
/// connects at the same moment waits on that row's unique index and then skips the version, so
/// any number of nodes may start together.
///
/// A records table that is missing although `<table>_migrations` lists its versions (someone
/// dropped it) is created again on connect: the store checks `to_regclass(<table>)` and re-runs
/// the applied migrations, whose statements are idempotent (`IF NOT EXISTS`), in a transaction
/// that locks the ledger's rows so that nodes connecting together do it once. The records the
/// table held are gone. A table dropped under running nodes makes their calls fail with
/// [`StoreErrorKind::Query`](idem_core::StoreErrorKind::Query) errors (undefined table) until one of
/// them connects again.
///
/// # Time
///
/// Every lease and expiry is computed from the database server's `clock_timestamp()`, never from
/// the application node's clock, so nodes with skewed clocks agree on who holds a key.
/// (`now()` would not do: it stands still for a whole transaction.) A lease or retention is
/// added to it as whole milliseconds, rounded up (so a lease is never shorter than asked), as in
/// the SQLite store.
///
/// # Round trips
///
/// | call | statements |
/// |---|---|
/// | `start`, new or expired key | 1: `INSERT … ON CONFLICT (key) DO UPDATE … WHERE NOT (expires_at > clock_timestamp() OR (state = 0 AND uncertain = true))`, which claimed if it wrote a row (the command tag's count, so no row comes back); 2 while reading first (a `SELECT` of the live row, which finds none, comes before it) |
/// | `start`, live key (replay, locked, reused, uncertain, tombstone) | 1 while reading first: the `SELECT` of the live row; 2 while claiming first (the claim, which meets the live row and changes nothing, then the `SELECT`) |
/// | `start`, live row vanishing between the two statements | the claim again, at most three times in all |
/// | `start` in transactional mode | 1 for every key: a data-modifying CTE that claims, or returns the live row unlocked (below) |
/// | `complete` | 1: `UPDATE … WHERE key = $1 AND token = $2`, which keeps the first result when the claim had already completed |
/// | `renew` | 1: `UPDATE … WHERE key = $1 AND token = $2 AND state = 0`, on the renewal pool (below) |
/// | `abort` | 1: `DELETE … WHERE key = $1 AND token = $2 AND state = 0` |
/// | `get` | 1 |
/// | `evict` | 2 `DELETE`s (its steps, the record) in one transaction |
/// | `take_uncertain` | 1: `UPDATE … WHERE key = $1 AND token = $2 AND state = 0 AND uncertain = true AND expires_at <= clock_timestamp()` |
/// | `find_uncertain` | 1 `SELECT`, on the partial index of uncertain claims |
/// | `write_step`, with or without `on_lapse` | 1 (with it, a data-modifying CTE sets the record's `uncertain` and is the step's fence); one `SELECT` more when it wrote nothing |
/// | `prune_expired(limit)` | up to 3, each filling what the batch has left: an `UPDATE … SET response = NULL` of tombstones past their retention, a `DELETE` of ended records (never an uncertain claim), both through the pruner's index up to the clock read once, a `DELETE` of ended steps |
///
/// Statements are prepared once per pooled connection (sqlx's statement cache), so each of the
/// above is one network round trip once a connection is warm. Every statement's reply is read to
/// its end (`ReadyForQuery`), so an error the server reports after the rows, at commit, fails
/// the call instead of being dropped.
///
/// **No ping before a statement.** sqlx pings a connection as it goes back to the pool (a round
/// trip on a task of its own, off the call's path) and, by default, once more before it hands it
/// out: a second round trip before every statement, which the call waits for. The pool that
/// [`connect`](PostgresStoreBuilder::connect) makes pings before use only a connection idle for
/// longer than [`ping_idle_after`](PostgresStoreBuilder::ping_idle_after) (1 s), so under
/// traffic each statement above is the call's one round trip. A pool you pass to
/// [`from_pool`](PostgresStoreBuilder::from_pool) keeps its own settings; make it from
/// [`pool_options`](PostgresStoreBuilder::pool_options) to get the same.
///
/// **Renewal has a pool of its own.** `renew` runs on a second pool of at most two connections,
/// opened on first use with the main pool's connect options and settings. Work that holds every
/// connection of [`PostgresStore::pool`] (its own queries, a long transaction) then still gets
/// its lease renewed, instead of losing it while the heartbeat queues for a connection and
/// running twice. Budget for up to two more server connections per store; they close after the
/// pool's idle timeout.
///
/// Whether `start` claims first or reads first is the store's [`ClaimOrder`](crate::ClaimOrder). By default it
/// follows the traffic: it claims first while most recent `start`s found a new key, and reads
/// first while most found a live record (a storm of retries, a queue redelivering). Either way
/// the conditional claim alone decides who owns a key. Reading first matters for replays: a claim
/// that meets a live row locks it for the moment of the statement, which costs a transaction id,
/// WAL and a commit, while a `SELECT` by primary key costs none of these. Measured on the
/// benchmark's server (`docs/performance.md`), a `SELECT` of a live row costs about half the
/// server CPU of the one-statement alternative, a CTE that reads and claims together (used in
/// transactional mode), and the bare claim costs a new key less than that CTE.
///
/// In transactional mode the claim is one statement that reads the key first, inside the same
/// statement, and inserts only when the read found no live row. A live row is returned without
/// a lock, so your transaction holds no lock on another caller's record while it replays.
///
/// # Transactional mode
///
/// `PostgresStore` is a [`TransactionalStore`](crate::TransactionalStore): with
/// [`Transactional`](crate::Transactional) the claim and the completion run on your own
/// transaction next to your business writes, and commit or roll back with them. Keep the default
/// `READ COMMITTED` isolation: a duplicate then waits on the first transaction's row and replays
/// its committed result.
///
/// # SQL the store needs
///
/// Plain PostgreSQL 9.6 or later, or a PostgreSQL-compatible database with: `INSERT … ON
/// CONFLICT (…) DO UPDATE … WHERE`, `RETURNING`, data-modifying CTEs (`WITH … AS (INSERT …)
/// SELECT …`), `SELECT … FOR UPDATE SKIP LOCKED` (pruning only), `clock_timestamp()`, `bytea`
/// and `timestamptz`, and transactional DDL with `CREATE … IF NOT EXISTS` and
/// `to_regclass(text)` (migrations only; 9.6 made its argument `text`). No advisory locks, no
/// `LOCK TABLE`, no extensions. Behind a connection pooler in transaction mode use one that
/// supports prepared statements (PgBouncer 1.21 or later).
///
/// # Errors
///
/// Failures are [`Error::Store`] with a [`StoreErrorKind`](idem_core::StoreErrorKind) taken from the
/// SQLSTATE: connection errors (class 08, 57P01–57P05, 53300) are `Unavailable`; a statement or
/// lock timeout (57014, 55P03), a serialization failure (40001) or a deadlock (40P01) is
/// `Transient`; a full disk (53100) is `Full`; a read-only transaction (25006, as on a standby)
/// is `ReadOnly`. [`StoreErrorKind::is_transient`](idem_core::StoreErrorKind::is_transient) says
/// which are worth retrying.
///
/// The crate enables only sqlx's `postgres` feature: no TLS. To reach a server over TLS, add
/// `sqlx` with a TLS feature (`tls-rustls` or `tls-native-tls`) to your own dependencies; Cargo
/// unifies the features.
pub type PostgresStore = SqlStore<Postgres>;

impl PostgresStore {
    /// Connects to `url` with a pool of 10 connections and brings the table `idem_records` up
    /// to date. Use [`builder`](Self::builder) for another table or pool size.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = idem::PostgresStore::connect("postgres://postgres@127.0.0.1/postgres").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<PostgresStore, Error> {
        PostgresStore::builder().connect(url).await
    }

    /// Uses an existing pool and brings the table `idem_records` up to date. `renew` runs on a
    /// second pool of at most two connections made with this pool's options (see the
    /// [round trips](PostgresStore#round-trips)).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/postgres").await.map_err(idem::sql_error)?;
    /// let store = idem::PostgresStore::from_pool(pool).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn from_pool(pool: PgPool) -> Result<PostgresStore, Error> {
        PostgresStore::builder().from_pool(pool).await
    }

    /// Options: table name, pool size, acquire timeout.
    ///
    /// ```
    /// let builder = idem::PostgresStore::builder().table("idem_orders").max_connections(20);
    /// # let _ = builder;
    /// ```
    pub fn builder() -> PostgresStoreBuilder {
        PostgresStoreBuilder::default()
    }
}

/// Options for a [`PostgresStore`]; finish with [`connect`](Self::connect) or
/// [`from_pool`](Self::from_pool).
///
/// ```no_run
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let store = idem::PostgresStore::builder()
///     .table("billing.idem_payments")
///     .max_connections(32)
///     .acquire_timeout(Duration::from_secs(2))
///     .connect("postgres://app@db.internal/app")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
pub type PostgresStoreBuilder = SqlStoreBuilder<Postgres>;

/// The settings of a [`PostgresStoreBuilder`] that only PostgreSQL has.
#[derive(Debug, Clone)]
pub struct Settings {
    acquire_timeout: Duration,
    ping_idle_after: Duration,
}

impl Default for SqlStoreBuilder<Postgres> {
    fn default() -> Self {
        SqlStoreBuilder::with(
            10,
            Settings {
                acquire_timeout: Duration::from_secs(10),
                ping_idle_after: Duration::from_secs(1),
            },
        )
    }
}

impl PostgresStoreBuilder {
    /// How long a call used by [`connect`](Self::connect)'s pool waits for a connection before
    /// failing with a [`StoreErrorKind::Unavailable`](idem_core::StoreErrorKind::Unavailable) error (default 10 s). While the server is
    /// down, calls fail after this long; a server that comes back sooner serves them.
    ///
    /// ```
    /// let builder = idem::PostgresStore::builder().acquire_timeout(std::time::Duration::from_secs(2));
    /// # let _ = builder;
    /// ```
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.db.acquire_timeout = timeout;
        self
    }

    /// How long a pooled connection may sit idle and still be handed out without a ping, in the
    /// pool [`connect`](Self::connect) makes (default 1 s).
    ///
    /// sqlx's own default pings every connection before handing it out: one more network round
    /// trip before every statement, which doubled the round trips of every call. sqlx already
    /// pings a connection when it goes back to the pool (on a task of its own, off the call's
    /// path), so one used a moment ago is known to have been alive then. The trade: a connection
    /// whose server side died within the last `ping_idle_after` is handed out unchecked, and the
    /// call using it fails with a [`StoreErrorKind::Unavailable`](idem_core::StoreErrorKind::Unavailable)
    /// error (a claim that fails never runs its work; a completion is retried); sqlx then drops
    /// that connection, and the next call gets a new one. `Duration::ZERO` pings every time, as
    /// sqlx does.
    ///
    /// ```
    /// let builder = idem::PostgresStore::builder().ping_idle_after(std::time::Duration::from_secs(5));
    /// # let _ = builder;
    /// ```
    pub fn ping_idle_after(mut self, idle: Duration) -> Self {
        self.db.ping_idle_after = idle;
        self
    }

    /// The pool options [`connect`](Self::connect) uses: this builder's pool size, acquire
    /// timeout and [`ping_idle_after`](Self::ping_idle_after), sqlx's defaults otherwise. Build
    /// a pool with them to share it with your own queries, and give it to
    /// [`from_pool`](Self::from_pool); a pool made with sqlx's defaults costs one more round trip
    /// per statement.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let builder = idem::PostgresStore::builder().max_connections(20);
    /// let pool = builder.pool_options().connect("postgres://app@db.internal/app").await.map_err(idem::sql_error)?;
    /// let store = builder.from_pool(pool.clone()).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn pool_options(&self) -> PgPoolOptions {
        let options = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.db.acquire_timeout);
        let ping_idle_after = self.db.ping_idle_after;
        if ping_idle_after.is_zero() {
            // sqlx's own `test_before_acquire`: a ping every time.
            return options;
        }
        options
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > ping_idle_after {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
    }

    /// Connects to `url` and brings the table up to date.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = idem::PostgresStore::builder().table("idem_orders")
    ///     .connect("postgres://postgres@127.0.0.1/postgres").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn connect(self, url: &str) -> Result<PostgresStore, Error> {
        let table = table_name(&self.table)?;
        if self.max_connections == 0 {
            return Err(Error::InvalidConfig(
                "max_connections must be at least 1".to_owned(),
            ));
        }
        background::check(self.pruner.as_ref())?;
        let pool = self.pool_options().connect(url).await.map_err(sql_error)?;
        self.finish(pool, table).await
    }

    /// Uses `pool` (its own size and timeouts apply) and brings the table up to date. `renew`
    /// runs on a second pool of at most two connections made with `pool`'s options.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/postgres").await.map_err(idem::sql_error)?;
    /// let store = idem::PostgresStore::builder().table("idem_orders").from_pool(pool).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn from_pool(self, pool: PgPool) -> Result<PostgresStore, Error> {
        let table = table_name(&self.table)?;
        background::check(self.pruner.as_ref())?;
        self.finish(pool, table).await
    }

    /// Creates or upgrades the schema of this builder's table on `conn`, as connecting does
    /// unless [`migrate_on_connect(false)`](Self::migrate_on_connect): for a deployment step
    /// that migrates, as a role that may create tables, before the application connects as
    /// one that may not. Running it again, or from several nodes at once, applies each step
    /// once. Inside a transaction it runs under a savepoint.
    ///
    /// ```no_run
    /// use sqlx::Connection;
    /// use idem::PostgresStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // The deployment step, as the schema's owner.
    /// let mut conn = sqlx::PgConnection::connect("postgres://owner@db.internal/app").await?;
    /// PostgresStore::builder().migrate(&mut conn).await?;
    /// conn.close().await?;
    ///
    /// // The application, as a role with SELECT, INSERT, UPDATE, DELETE on the tables only.
    /// let store = PostgresStore::builder()
    ///     .migrate_on_connect(false)
    ///     .connect("postgres://app@db.internal/app")
    ///     .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn migrate(&self, conn: &mut PgConnection) -> Result<(), Error> {
        schema::migrate(conn, &table_name(&self.table)?).await
    }

    /// The SQL [`migrate`](Self::migrate) runs, for this builder's table, as a script to apply
    /// with your own tools (`psql --single-transaction -f idem_records.sql`, Flyway, Liquibase,
    /// sqlx's migrator): the ledger `<table>_migrations`, then each schema version's row in it
    /// and its statements. Every statement is idempotent (`IF NOT EXISTS`, `ON CONFLICT DO
    /// NOTHING`), so the script of a newer idem brings any older schema up to date, and applying
    /// it twice changes nothing: add it to your tool as a new migration when you upgrade idem.
    /// `idem-sql/sql/postgres/idem_records.sql` is this script for the default table. It
    /// touches only idem's own tables (sqlx's migrator records the file in its own ledger,
    /// `_sqlx_migrations`, which idem never reads).
    ///
    /// ```
    /// let sql = idem::PostgresStore::builder().table("billing.idem").schema_sql()?;
    /// assert!(sql.contains(r#"CREATE TABLE IF NOT EXISTS "billing"."idem" ("#));
    /// assert!(sql.contains(r#"INSERT INTO "billing"."idem_migrations""#));
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn schema_sql(&self) -> Result<String, Error> {
        schema::script(&table_name(&self.table)?)
    }

    /// Migrates or checks the schema on `pool`, then makes the store and spawns its pruner.
    async fn finish(self, pool: PgPool, table: TableName) -> Result<PostgresStore, Error> {
        let mut conn = pool.acquire().await.map_err(sql_error)?;
        if self.migrate_on_connect {
            schema::migrate(&mut conn, &table).await?;
        } else {
            schema::check(&mut conn, &table).await?;
        }
        drop(conn);
        // The main pool's settings (timeouts, `after_connect` callbacks such as a search_path)
        // and connect options, at most two connections, opened on the first renewal.
        let renew_pool = pool
            .options()
            .clone()
            .min_connections(0)
            .max_connections(RENEW_CONNECTIONS)
            .connect_lazy_with((*pool.connect_options()).clone());
        let mut store = SqlStore {
            pool,
            renew_pool,
            protocol: Arc::new(Protocol::new(table, self.claim_order)),
            pruner: None,
        };
        store.pruner = background::spawn(store.without_pruner(), self.pruner)?;
        Ok(store)
    }
}

/// Validates `table` (`name` or `schema.name`, each a plain identifier of at most 63 bytes).
fn table_name(table: &str) -> Result<TableName, Error> {
    TableName::qualified("table name", table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_validated() {
        for ok in ["idem_records", "_x", "app.idem", "A1_b2", &"t".repeat(63)] {
            assert!(table_name(ok).is_ok(), "{ok} should be accepted");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a\"b",
            "a;drop table x",
            "a.b.c",
            ".t",
            "s.",
            "é",
            &"t".repeat(64),
        ] {
            assert!(
                matches!(table_name(bad), Err(Error::InvalidConfig(_))),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn names_are_quoted_and_derived() {
        let t = table_name("app.Idem").unwrap();
        assert_eq!(t.to_string(), "\"app\".\"Idem\"");
        assert_eq!(
            t.suffixed("_migrations").to_string(),
            "\"app\".\"Idem_migrations\""
        );
        assert_eq!(
            t.suffixed("_expires_at_idx").unqualified().to_string(),
            "\"Idem_expires_at_idx\""
        );
    }

    #[tokio::test]
    async fn bad_table_name_fails_before_connecting() {
        // Port 1 is never a PostgreSQL server: reaching it would fail with a store error.
        let err = PostgresStore::builder()
            .table("no-dashes")
            .connect("postgres://nobody@127.0.0.1:1/none")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    }
}
