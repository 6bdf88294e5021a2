//! [`PostgresStore`]: records in a PostgreSQL table, shared by every node of a service
//! (feature `postgres`).
//!
//! # Pointing idem at your database
//!
//! ```no_run
//! use idem_core::PostgresStore;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
//! // Creates (or upgrades) the table `idem_records` and its expiry index on first connect.
//! let store = PostgresStore::connect("postgres://app:secret@db.internal/app").await?;
//!
//! // Or: your own table name (optionally schema-qualified), on a pool you already have.
//! let pool = sqlx::PgPool::connect("postgres://app:secret@db.internal/app").await?;
//! let store = PostgresStore::builder().table("billing.idem_payments").from_pool(pool).await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! The role needs `CREATE` on the schema for the first connect (it creates two tables and an
//! index) and `SELECT, INSERT, UPDATE, DELETE` on them afterwards. The schema itself must exist.
//!
//! # Schema
//!
//! For the default table name `idem_records` (every name below follows the configured one):
//!
//! ```sql
//! CREATE TABLE idem_records (
//!     key         bytea       PRIMARY KEY,   -- 32 bytes: SHA-256 of (scope, caller, client key)
//!     fingerprint bytea       NULL,          -- 32 bytes: SHA-256 of the request, if given
//!     token       bytea       NOT NULL,      -- 16 bytes: the claim's random fencing token
//!     state       smallint    NOT NULL,      -- 0 in progress, 1 completed
//!     expires_at  timestamptz NOT NULL,      -- lease end (in progress), retention end (completed)
//!     response    bytea       NULL,          -- the encoded response once completed
//!     is_error    boolean     NOT NULL DEFAULT false
//! );
//! CREATE INDEX idem_records_expires_at_idx ON idem_records (expires_at);
//! -- applied migrations, one row per version
//! CREATE TABLE idem_records_migrations (version bigint PRIMARY KEY, description text NOT NULL,
//!                                       applied_at timestamptz NOT NULL);
//! ```
//!
//! Migrations are embedded and versioned. On connect each pending version is applied in one
//! transaction that first inserts its row into `<table>_migrations`: a node that connects at the
//! same moment waits on that row's unique index and then skips the version, so any number of
//! nodes may start together.
//!
//! A records table that is missing although `<table>_migrations` lists its versions (someone
//! dropped it) is created again on connect: the store checks `to_regclass(<table>)` and re-runs
//! the applied migrations, whose statements are idempotent (`IF NOT EXISTS`), in a transaction
//! that locks the ledger's rows so that nodes connecting together do it once. The records the
//! table held are gone. A table dropped under running nodes makes their calls fail with
//! [`StoreErrorKind::Query`](crate::StoreErrorKind::Query) errors (undefined table) until one of
//! them connects again.
//!
//! # Time
//!
//! Every lease and expiry is computed from the database server's `clock_timestamp()`, never from
//! the application node's clock, so nodes with skewed clocks agree on who holds a key.
//! (`now()` would not do: it stands still for a whole transaction.)
//!
//! # Round trips
//!
//! | call | statements |
//! |---|---|
//! | `start`, new or expired key | 1: `INSERT … ON CONFLICT (key) DO UPDATE … WHERE expires_at <= clock_timestamp() RETURNING …`; 2 while reading first (a `SELECT` of the live row, which finds none, comes before it) |
//! | `start`, live key (replay, locked, reused) | 1 while reading first: the `SELECT` of the live row; 2 while claiming first (the claim, which meets the live row and changes nothing, then the `SELECT`) |
//! | `start`, live row vanishing between the two statements | the claim again, at most three times in all |
//! | `start` in transactional mode | 1 for every key: a data-modifying CTE that claims, or returns the live row unlocked (below) |
//! | `complete` | 1: `UPDATE … WHERE key = $1 AND token = $2`, which keeps the first result when the claim had already completed |
//! | `renew` | 1: `UPDATE … WHERE key = $1 AND token = $2 AND state = 0`, on the renewal pool (below) |
//! | `abort` | 1: `DELETE … WHERE key = $1 AND token = $2 AND state = 0` |
//! | `get`, `evict` | 1 |
//! | `prune_expired(limit)` | 1, deleting at most `limit` rows found through the expiry index |
//!
//! Statements are prepared once per pooled connection (sqlx's statement cache), so each of the
//! above is one network round trip once a connection is warm. Every statement's reply is read to
//! its end (`ReadyForQuery`), so an error the server reports after the rows, at commit, fails
//! the call instead of being dropped.
//!
//! **Renewal has a pool of its own.** `renew` runs on a second pool of at most two connections,
//! opened on first use with the main pool's connect options and settings. Work that holds every
//! connection of [`PostgresStore::pool`] (its own queries, a long transaction) then still gets
//! its lease renewed, instead of losing it while the heartbeat queues for a connection and
//! running twice. Budget for up to two more server connections per store; they close after the
//! pool's idle timeout.
//!
//! Whether `start` claims first or reads first is the store's [`ClaimOrder`]. By default it
//! follows the traffic: it claims first while most recent `start`s found a new key, and reads
//! first while most found a live record (a storm of retries, a queue redelivering). Either way
//! the conditional claim alone decides who owns a key. Reading first matters for replays: a claim
//! that meets a live row locks it for the moment of the statement, which costs a transaction id,
//! WAL and a commit, while a `SELECT` by primary key costs none of these. Measured on the
//! benchmark's server (`docs/performance.md`), a `SELECT` of a live row costs about half the
//! server CPU of the one-statement alternative, a CTE that reads and claims together (used in
//! transactional mode), and the bare claim costs a new key less than that CTE.
//!
//! In transactional mode the claim is one statement that reads the key first, inside the same
//! statement, and inserts only when the read found no live row. A live row is returned without
//! a lock, so your transaction holds no lock on another caller's record while it replays.
//!
//! # Transactional mode
//!
//! `PostgresStore` is a [`TransactionalStore`](crate::TransactionalStore): with
//! [`Transactional`](crate::Transactional) the claim and the completion run on your own
//! transaction next to your business writes, and commit or roll back with them. Keep the default
//! `READ COMMITTED` isolation: a duplicate then waits on the first transaction's row and replays
//! its committed result.
//!
//! # SQL the store needs
//!
//! Plain PostgreSQL 9.6 or later, or a PostgreSQL-compatible database with: `INSERT … ON
//! CONFLICT (…) DO UPDATE … WHERE`, `RETURNING`, data-modifying CTEs (`WITH … AS (INSERT …)
//! SELECT …`), `SELECT … FOR UPDATE SKIP LOCKED` (pruning only), `clock_timestamp()`, `bytea`
//! and `timestamptz`, and transactional DDL with `CREATE … IF NOT EXISTS` and
//! `to_regclass(text)` (migrations only; 9.6 made its argument `text`). No advisory locks, no
//! `LOCK TABLE`, no extensions. Behind a connection pooler in transaction mode use one that
//! supports prepared statements (PgBouncer 1.21 or later).
//!
//! # Errors
//!
//! Failures are [`Error::Store`] with a [`StoreErrorKind`](crate::StoreErrorKind) taken from the
//! SQLSTATE: connection errors (class 08, 57P01–57P05, 53300) are `Unavailable`; a statement or
//! lock timeout (57014, 55P03), a serialization failure (40001) or a deadlock (40P01) is
//! `Transient`; a full disk (53100) is `Full`; a read-only transaction (25006, as on a standby)
//! is `ReadOnly`. [`StoreErrorKind::is_transient`](crate::StoreErrorKind::is_transient) says
//! which are worth retrying.
//!
//! The crate enables only sqlx's `postgres` feature: no TLS. To reach a server over TLS, add
//! `sqlx` with a TLS feature (`tls-rustls` or `tls-native-tls`) to your own dependencies; Cargo
//! unifies the features.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, Executor, Row};

use crate::error::Error;
use crate::key::{Fingerprint, Key, Token};
use crate::record::{Cached, Claim, Completion, Record, RecordState, Start};
use crate::store::claim_order::{ClaimOrder, ClaimPath};
use crate::store::sql::{Migration, TableName, DEFAULT_TABLE};
use crate::store::{check_duration, check_fingerprint, corrupt, fenced, Store};

/// How often `start` re-runs its claim when the row it conflicted with vanished before it could
/// be read (deleted or expired in between). Each retry needs another writer to interleave, so
/// three is plenty.
const CLAIM_ATTEMPTS: usize = 3;

/// The size of the pool `renew` runs on. Renewals are rare (one per third of a lease per running
/// claim) and short; two keep one slow renewal from holding up the others.
const RENEW_CONNECTIONS: u32 = 2;

/// The longest table name: PostgreSQL truncates identifiers at 63 bytes, and the store derives
/// `<table>_migrations` and `<table>_expires_at_idx` from it.
const MAX_TABLE_LEN: usize = 63 - "_expires_at_idx".len();

/// The embedded schema migrations. `{table}` and `{index}` are replaced by the quoted names.
/// Versions only grow; an applied step is never edited. Statements are idempotent (`IF NOT
/// EXISTS`): a records table found missing is re-created by running the applied steps again.
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "records table and expiry index",
    statements: &[
        "CREATE TABLE IF NOT EXISTS {table} (
            key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
            fingerprint bytea NULL CHECK (octet_length(fingerprint) = 32),
            token bytea NOT NULL CHECK (octet_length(token) = 16),
            state smallint NOT NULL CHECK (state IN (0, 1)),
            expires_at timestamptz NOT NULL,
            response bytea NULL,
            is_error boolean NOT NULL DEFAULT false
        )",
        "CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at)",
    ],
}];

/// Records in a PostgreSQL table: the store for services with more than one process or node.
///
/// A claim is one conditional `INSERT … ON CONFLICT DO UPDATE` statement, leases and expiry use
/// the server's clock, and a replay costs one round trip while most traffic is replays (see
/// [`ClaimOrder`]). See the [module docs](self) for the
/// schema, the round trips of each call and the SQL features it relies on.
///
/// Cloning is cheap: clones share the connection pool.
///
/// ```no_run
/// use std::time::Duration;
/// use idem_core::{Key, PostgresStore, Start, Store};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let store = PostgresStore::connect("postgres://postgres@127.0.0.1/postgres").await?;
/// let key = Key::derive("deposit", "alice", "req-1")?;
/// match store.start(&key, None, Duration::from_secs(30)).await? {
///     Start::Started(claim) => { /* run the work, then store.complete(&claim, …) */ }
///     Start::Completed(cached) => { /* replay cached.response */ }
///     Start::Locked { retry_after } => { /* another node is running it */ }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// Where `renew` runs: at most two connections of its own, so that work holding every
    /// connection of `pool` cannot starve its own heartbeat.
    renew_pool: PgPool,
    sql: Arc<Statements>,
    claim_path: Arc<ClaimPath>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.sql.table)
            .field("claim_order", &self.claim_path.order())
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to `url` with a pool of 10 connections and brings the table `idem_records` up
    /// to date. Use [`builder`](Self::builder) for another table or pool size.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let store = idem_core::PostgresStore::connect("postgres://postgres@127.0.0.1/postgres").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<PostgresStore, Error> {
        PostgresStore::builder().connect(url).await
    }

    /// Uses an existing pool and brings the table `idem_records` up to date. `renew` runs on a
    /// second pool of at most two connections made with this pool's options (see the
    /// [module docs](self#round-trips)).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/postgres").await?;
    /// let store = idem_core::PostgresStore::from_pool(pool).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn from_pool(pool: PgPool) -> Result<PostgresStore, Error> {
        PostgresStore::builder().from_pool(pool).await
    }

    /// Options: table name, pool size, acquire timeout.
    ///
    /// ```
    /// let builder = idem_core::PostgresStore::builder().table("idem_orders").max_connections(20);
    /// # let _ = builder;
    /// ```
    pub fn builder() -> PostgresStoreBuilder {
        PostgresStoreBuilder::default()
    }

    /// The connection pool, for your own queries next to the store's.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// # let store = idem_core::PostgresStore::connect("postgres://postgres@127.0.0.1/postgres").await?;
    /// let n: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records").fetch_one(store.pool()).await?;
    /// # let _ = n; Ok(()) }
    /// ```
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table name as configured (`schema.table` or `table`).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let store = idem_core::PostgresStore::connect("postgres://postgres@127.0.0.1/postgres").await?;
    /// assert_eq!(store.table(), "idem_records");
    /// # Ok(()) }
    /// ```
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The claim order `start` follows (see [`ClaimOrder`]).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let store = idem_core::PostgresStore::connect("postgres://postgres@127.0.0.1/postgres").await?;
    /// assert_eq!(store.claim_order(), idem_core::ClaimOrder::Adaptive);
    /// # Ok(()) }
    /// ```
    pub fn claim_order(&self) -> ClaimOrder {
        self.claim_path.order()
    }
}

/// Options for a [`PostgresStore`]; finish with [`connect`](Self::connect) or
/// [`from_pool`](Self::from_pool).
///
/// ```no_run
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let store = idem_core::PostgresStore::builder()
///     .table("billing.idem_payments")
///     .max_connections(32)
///     .acquire_timeout(Duration::from_secs(2))
///     .connect("postgres://app@db.internal/app")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresStoreBuilder {
    table: String,
    max_connections: u32,
    acquire_timeout: Duration,
    claim_order: ClaimOrder,
}

impl Default for PostgresStoreBuilder {
    fn default() -> Self {
        PostgresStoreBuilder {
            table: DEFAULT_TABLE.to_owned(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            claim_order: ClaimOrder::Adaptive,
        }
    }
}

impl PostgresStoreBuilder {
    /// The table holding the records: `name` or `schema.name`, each part an identifier of
    /// ASCII letters, digits and `_` not starting with a digit (the table name at most 48
    /// bytes, leaving room for the derived `<table>_migrations` and `<table>_expires_at_idx`;
    /// the schema at most 63). Names are quoted, so they are case-sensitive: `Idem` and `idem`
    /// are two tables. The schema must exist. A bad name fails `connect`/`from_pool` with
    /// [`Error::InvalidConfig`] before anything touches the database.
    ///
    /// ```
    /// let builder = idem_core::PostgresStore::builder().table("app.idem_records");
    /// # let _ = builder;
    /// ```
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// The pool size used by [`connect`](Self::connect) (default 10).
    ///
    /// ```
    /// let builder = idem_core::PostgresStore::builder().max_connections(32);
    /// # let _ = builder;
    /// ```
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// How long a call used by [`connect`](Self::connect)'s pool waits for a connection before
    /// failing with a [`StoreErrorKind::Unavailable`](crate::StoreErrorKind::Unavailable) error (default 10 s). While the server is
    /// down, calls fail after this long; a server that comes back sooner serves them.
    ///
    /// ```
    /// let builder = idem_core::PostgresStore::builder().acquire_timeout(std::time::Duration::from_secs(2));
    /// # let _ = builder;
    /// ```
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Whether `start` claims first, reads first, or picks by the recent traffic (the default,
    /// [`ClaimOrder::Adaptive`]). See [`ClaimOrder`] for what each costs.
    ///
    /// ```
    /// let builder = idem_core::PostgresStore::builder().claim_order(idem_core::ClaimOrder::ReadFirst);
    /// # let _ = builder;
    /// ```
    pub fn claim_order(mut self, order: ClaimOrder) -> Self {
        self.claim_order = order;
        self
    }

    /// Connects to `url` and brings the table up to date.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let store = idem_core::PostgresStore::builder().table("idem_orders")
    ///     .connect("postgres://postgres@127.0.0.1/postgres").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn connect(self, url: &str) -> Result<PostgresStore, Error> {
        let sql = Statements::new(&self.table)?;
        if self.max_connections == 0 {
            return Err(Error::InvalidConfig(
                "max_connections must be at least 1".to_owned(),
            ));
        }
        let pool = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            .connect(url)
            .await?;
        finish(pool, sql, self.claim_order).await
    }

    /// Uses `pool` (its own size and timeouts apply) and brings the table up to date. `renew`
    /// runs on a second pool of at most two connections made with `pool`'s options.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/postgres").await?;
    /// let store = idem_core::PostgresStore::builder().table("idem_orders").from_pool(pool).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn from_pool(self, pool: PgPool) -> Result<PostgresStore, Error> {
        let sql = Statements::new(&self.table)?;
        finish(pool, sql, self.claim_order).await
    }
}

async fn finish(
    pool: PgPool,
    sql: Statements,
    claim_order: ClaimOrder,
) -> Result<PostgresStore, Error> {
    let mut conn = pool.acquire().await?;
    sql.migrate(&mut conn).await?;
    drop(conn);
    // The main pool's settings (timeouts, `after_connect` callbacks such as a search_path) and
    // connect options, at most two connections, opened on the first renewal.
    let renew_pool = pool
        .options()
        .clone()
        .min_connections(0)
        .max_connections(RENEW_CONNECTIONS)
        .connect_lazy_with((*pool.connect_options()).clone());
    Ok(PostgresStore {
        pool,
        renew_pool,
        sql: Arc::new(sql),
        claim_path: Arc::new(ClaimPath::new(claim_order)),
    })
}

/// Splits `table` into an optional schema and the table name, each a plain identifier; the
/// table name short enough for the names derived from it.
fn parse_table(table: &str) -> Result<(Option<TableName>, TableName), Error> {
    let (schema, name) = match table.split_once('.') {
        Some((schema, name)) => (Some(TableName::new(schema)?), TableName::new(name)?),
        None => (None, TableName::new(table)?),
    };
    if name.as_str().len() > MAX_TABLE_LEN {
        return Err(Error::InvalidConfig(format!(
            "PostgreSQL table name {:?} is {} bytes; at most {MAX_TABLE_LEN} leave room for \
             the names derived from it (`<table>_expires_at_idx`) within PostgreSQL's 63",
            name.as_str(),
            name.as_str().len()
        )));
    }
    Ok((schema, name))
}

/// Which claim statement [`Statements::start`] runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ClaimSql {
    /// `INSERT … ON CONFLICT DO UPDATE … WHERE expired RETURNING`: nothing back on a live row.
    Bare,
    /// The data-modifying CTE that returns a live row without locking it (transactional mode).
    ReadingLive,
}

/// The SQL of every statement, with the configured table name in place.
///
/// The statements are methods taking `&mut PgConnection`, so they run as well on a pooled
/// connection as on a caller's own transaction.
pub(crate) struct Statements {
    table: String,
    quoted_table: String,
    quoted_index: String,
    migrations_table: String,
    claim: String,
    upsert: String,
    read: String,
    complete: String,
    renew: String,
    abort: String,
    evict: String,
    prune: String,
}

/// The columns `start` and `get` decode, as `SELECT` expressions over the alias `r`: times in
/// microseconds since the epoch and microseconds left, both from the server's clock.
const RECORD_COLUMNS: &str = "r.fingerprint, r.token, r.state, r.response, r.is_error, \
     (extract(epoch from r.expires_at) * 1000000)::bigint AS expires_us, \
     (extract(epoch from (r.expires_at - clock_timestamp())) * 1000000)::bigint AS remaining_us";

impl Statements {
    pub(crate) fn new(table: &str) -> Result<Statements, Error> {
        let (schema, name) = parse_table(table)?;
        // Validated identifiers hold no quote, so quoting cannot be escaped.
        let prefix = schema.map_or(String::new(), |s| format!("\"{}\".", s.as_str()));
        let name = name.as_str();
        let t = format!("{prefix}\"{name}\"");
        // An index always lives in its table's schema, so its name is never qualified.
        let quoted_index = format!("\"{name}_expires_at_idx\"");
        let migrations_table = format!("{prefix}\"{name}_migrations\"");
        let lease_end = "clock_timestamp() + $4::bigint::float8 * interval '1 microsecond'";
        Ok(Statements {
            table: table.to_owned(),
            // The claim: insert, or take over a row whose lease or retention has ended. A live
            // row in the statement's snapshot is returned as it is and nothing is written: a
            // replay then takes no row lock, so it needs no transaction id, writes no WAL and
            // commits nothing. A live row the snapshot cannot see (committed after the statement
            // began, or still uncommitted) meets the insert's conflict check instead, which
            // leaves it alone and returns no row; `start` then reads it afresh.
            claim: format!(
                "WITH live AS ( \
                   SELECT {RECORD_COLUMNS} FROM {t} AS r \
                   WHERE r.key = $1 AND r.expires_at > clock_timestamp()), \
                 claimed AS ( \
                   INSERT INTO {t} AS r (key, fingerprint, token, state, expires_at, response, is_error) \
                   SELECT $1, $2, $3, 0, {lease_end}, NULL, false WHERE NOT EXISTS (SELECT 1 FROM live) \
                   ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint, \
                     token = excluded.token, state = 0, expires_at = excluded.expires_at, \
                     response = NULL, is_error = false \
                   WHERE r.expires_at <= clock_timestamp() \
                   RETURNING r.key) \
                 SELECT true AS claimed, NULL::bytea AS fingerprint, NULL::bytea AS token, \
                   0::smallint AS state, NULL::bytea AS response, false AS is_error, \
                   0::bigint AS expires_us, 0::bigint AS remaining_us \
                 FROM claimed \
                 UNION ALL \
                 SELECT false, live.* FROM live WHERE NOT EXISTS (SELECT 1 FROM claimed)"
            ),
            // The bare claim, for the pool: insert, or take over a row whose time has ended;
            // nothing back means a live row, which `start` then reads. Meeting a live row, it
            // locks it for the moment of the statement, as any `ON CONFLICT DO UPDATE` does.
            upsert: format!(
                "INSERT INTO {t} AS r (key, fingerprint, token, state, expires_at, response, is_error) \
                 VALUES ($1, $2, $3, 0, {lease_end}, NULL, false) \
                 ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint, \
                   token = excluded.token, state = 0, expires_at = excluded.expires_at, \
                   response = NULL, is_error = false \
                 WHERE r.expires_at <= clock_timestamp() \
                 RETURNING true AS claimed"
            ),
            read: format!(
                "SELECT {RECORD_COLUMNS} FROM {t} AS r \
                 WHERE r.key = $1 AND r.expires_at > clock_timestamp()"
            ),
            // Fenced by the token alone, so that completing a claim again (a retry whose first
            // commit landed but whose answer was lost) succeeds; the CASEs keep the first result
            // and its retention. SET expressions read the row as it was before the update.
            complete: format!(
                "UPDATE {t} SET state = 1, \
                   response = CASE WHEN state = 0 THEN $3 ELSE response END, \
                   is_error = CASE WHEN state = 0 THEN $4 ELSE is_error END, \
                   expires_at = CASE WHEN state = 0 \
                     THEN clock_timestamp() + $5::bigint::float8 * interval '1 microsecond' \
                     ELSE expires_at END \
                 WHERE key = $1 AND token = $2"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + $3::bigint::float8 * interval '1 microsecond' \
                 WHERE key = $1 AND token = $2 AND state = 0"
            ),
            abort: format!("DELETE FROM {t} WHERE key = $1 AND token = $2 AND state = 0"),
            evict: format!("DELETE FROM {t} WHERE key = $1"),
            // SKIP LOCKED lets several pruners (and live claims holding row locks) run side by
            // side; the row locks keep a key from being re-claimed between choosing and deleting.
            prune: format!(
                "DELETE FROM {t} WHERE key IN ( \
                   SELECT key FROM {t} WHERE expires_at <= clock_timestamp() \
                   ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
            quoted_table: t,
            quoted_index,
            migrations_table,
        })
    }

    /// Creates the migrations table if needed and applies every pending migration.
    pub(crate) async fn migrate(&self, conn: &mut PgConnection) -> Result<(), Error> {
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {} (version bigint PRIMARY KEY, description text NOT NULL, \
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp())",
            self.migrations_table
        );
        // Two sessions running CREATE TABLE IF NOT EXISTS at the same moment may both find the
        // table missing; the loser fails on a catalog's unique index (23505), with "duplicate
        // table" (42P07) or "duplicate object" (42710, the table's row type). The table exists
        // then, so running it again succeeds.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match conn.execute(create.as_str()).await {
                Ok(_) => break,
                Err(e) if attempt < 3 && is_duplicate_object(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }

        let latest = MIGRATIONS.last().map_or(0, |m| m.version);
        let applied = self.schema_version(conn).await?;
        if applied > latest {
            return Err(Error::InvalidConfig(format!(
                "table {} is at schema version {applied}, newer than this idem knows ({latest}); \
                 upgrade idem",
                self.table
            )));
        }
        if applied > 0 && !self.table_exists(conn).await? {
            self.recreate_table(conn, applied).await?;
        }
        for m in MIGRATIONS.iter().filter(|m| m.version > applied) {
            let mut tx = conn.begin().await?;
            // Inserting the version row first serialises concurrent migrators on its unique
            // index: a second node waits here until the first commits, then skips.
            let mine = sqlx::query(&format!(
                "INSERT INTO {} (version, description) VALUES ($1, $2) \
                 ON CONFLICT (version) DO NOTHING RETURNING version",
                self.migrations_table
            ))
            .bind(m.version)
            .bind(m.description)
            .persistent(false)
            .fetch_all(&mut *tx)
            .await?;
            if mine.is_empty() {
                tx.rollback().await?;
                continue;
            }
            for stmt in m.statements {
                let stmt = stmt
                    .replace("{table}", &self.quoted_table)
                    .replace("{index}", &self.quoted_index);
                tx.execute(stmt.as_str()).await?;
            }
            tx.commit().await?;
        }
        Ok(())
    }

    /// Whether the records table exists (as the statements name it, so through the search path
    /// when unqualified).
    async fn table_exists(&self, conn: &mut PgConnection) -> Result<bool, Error> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(&self.quoted_table)
            .persistent(false)
            .fetch_one(&mut *conn)
            .await?;
        Ok(exists)
    }

    /// Creates the records table again after it was dropped, by re-running the idempotent
    /// statements of the migrations up to `applied`. Locking the ledger's rows makes nodes that
    /// connect together queue here; the later ones find the table back and do nothing.
    async fn recreate_table(&self, conn: &mut PgConnection, applied: i64) -> Result<(), Error> {
        let mut tx = conn.begin().await?;
        sqlx::query(&format!(
            "SELECT version FROM {} FOR UPDATE",
            self.migrations_table
        ))
        .persistent(false)
        .fetch_all(&mut *tx)
        .await?;
        if !self.table_exists(&mut tx).await? {
            tracing::warn!(
                table = %self.table,
                "the records table is missing although its migrations are recorded (dropped?); \
                 creating it again: the records it held are gone"
            );
            for m in MIGRATIONS.iter().filter(|m| m.version <= applied) {
                for stmt in m.statements {
                    let stmt = stmt
                        .replace("{table}", &self.quoted_table)
                        .replace("{index}", &self.quoted_index);
                    tx.execute(stmt.as_str()).await?;
                }
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn schema_version(&self, conn: &mut PgConnection) -> Result<i64, Error> {
        let v: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT max(version) FROM {}",
            self.migrations_table
        ))
        .persistent(false)
        .fetch_one(&mut *conn)
        .await?;
        Ok(v.unwrap_or(0))
    }

    /// The claim (see [`Store::start`]); `lease` is already validated.
    pub(crate) async fn start(
        &self,
        conn: &mut PgConnection,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        lease: Duration,
        claim: ClaimSql,
    ) -> Result<Start, Error> {
        let sql = match claim {
            ClaimSql::ReadingLive => &self.claim,
            ClaimSql::Bare => &self.upsert,
        };
        for _ in 0..CLAIM_ATTEMPTS {
            let token = Token::random();
            // Every row and the final ReadyForQuery are read (`fetch_all`), so an error the server
            // sends after the row (at commit) fails the claim instead of being dropped.
            let row = sqlx::query(sql)
                .bind(&key.as_bytes()[..])
                .bind(fingerprint.map(|f| &f.as_bytes()[..]))
                .bind(&token.to_bytes()[..])
                .bind(micros(lease))
                .fetch_all(&mut *conn)
                .await?
                .into_iter()
                .next();
            if let Some(row) = &row {
                if row.try_get::<bool, _>("claimed")? {
                    return Ok(Start::Started(Claim::new(*key, token)));
                }
            }
            // Not claimed. The CTE returns the row that was live in its snapshot (the bare claim
            // never does); a row
            // committed after the snapshot began is invisible there (no row back), and one whose
            // time ran out while the statement ran has nothing left: read it afresh then.
            let live = match row.map(|r| StoredRow::decode(&r)).transpose()? {
                Some(stored) if stored.remaining_us > 0 => Some(stored),
                _ => self.read_live(conn, key).await?,
            };
            if let Some(stored) = live {
                return stored.into_start(fingerprint);
            }
            // It vanished (aborted, evicted, pruned or expired) before we could read it: the key
            // may be free now, so claim again.
        }
        // Other writers changed this key between each of our claims and reads: it is busy.
        Ok(Start::Locked {
            retry_after: Duration::ZERO,
        })
    }

    async fn read_live(
        &self,
        conn: &mut PgConnection,
        key: &Key,
    ) -> Result<Option<StoredRow>, Error> {
        let row = sqlx::query(&self.read)
            .bind(&key.as_bytes()[..])
            .fetch_optional(&mut *conn)
            .await?;
        row.map(|r| StoredRow::decode(&r)).transpose()
    }

    /// Stores the response of `claim` (see [`Store::complete`]); `retention` is validated.
    pub(crate) async fn complete(
        &self,
        conn: &mut PgConnection,
        claim: &Claim,
        completion: Completion<'_>,
        retention: Duration,
    ) -> Result<(), Error> {
        let done = sqlx::query(&self.complete)
            .bind(&claim.key().as_bytes()[..])
            .bind(&claim.token().to_bytes()[..])
            .bind(completion.response)
            .bind(completion.is_error)
            .bind(micros(retention))
            .execute(&mut *conn)
            .await?;
        fenced(done.rows_affected())
    }

    /// Extends the lease of `claim` (see [`Store::renew`]); `lease` is validated.
    pub(crate) async fn renew(
        &self,
        conn: &mut PgConnection,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), Error> {
        let done = sqlx::query(&self.renew)
            .bind(&claim.key().as_bytes()[..])
            .bind(&claim.token().to_bytes()[..])
            .bind(micros(lease))
            .execute(&mut *conn)
            .await?;
        fenced(done.rows_affected())
    }

    /// Deletes the in-progress record of `claim` (see [`Store::abort`]).
    pub(crate) async fn abort(&self, conn: &mut PgConnection, claim: &Claim) -> Result<(), Error> {
        let done = sqlx::query(&self.abort)
            .bind(&claim.key().as_bytes()[..])
            .bind(&claim.token().to_bytes()[..])
            .execute(&mut *conn)
            .await?;
        fenced(done.rows_affected())
    }

    /// The live record of `key` (see [`Store::get`]).
    pub(crate) async fn get(
        &self,
        conn: &mut PgConnection,
        key: &Key,
    ) -> Result<Option<Record>, Error> {
        self.read_live(conn, key)
            .await?
            .map(|stored| stored.into_record(*key))
            .transpose()
    }

    /// Deletes the record of `key` whatever its state (see [`Store::evict`]).
    pub(crate) async fn evict(&self, conn: &mut PgConnection, key: &Key) -> Result<bool, Error> {
        let done = sqlx::query(&self.evict)
            .bind(&key.as_bytes()[..])
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Deletes up to `limit` expired records (see [`Store::prune_expired`]).
    pub(crate) async fn prune_expired(
        &self,
        conn: &mut PgConnection,
        limit: u32,
    ) -> Result<u64, Error> {
        let done = sqlx::query(&self.prune)
            .bind(i64::from(limit))
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected())
    }
}

fn is_duplicate_object(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| matches!(&*code, "23505" | "42P07" | "42710"))
}

/// A validated duration in whole microseconds (at most ten years, so it fits an i64).
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A record row as `start` and `get` read it.
struct StoredRow {
    fingerprint: Option<Fingerprint>,
    token: Option<Token>,
    state: i16,
    response: Option<Vec<u8>>,
    is_error: bool,
    expires_us: i64,
    remaining_us: i64,
}

impl StoredRow {
    fn decode(row: &PgRow) -> Result<StoredRow, Error> {
        let fingerprint = row
            .try_get::<Option<Vec<u8>>, _>("fingerprint")?
            .map(|b| {
                <[u8; 32]>::try_from(b)
                    .map(Fingerprint::from_bytes)
                    .map_err(|b| corrupt(format!("fingerprint is {} bytes, not 32", b.len())))
            })
            .transpose()?;
        let token = row
            .try_get::<Option<Vec<u8>>, _>("token")?
            .map(|b| {
                <[u8; 16]>::try_from(b)
                    .map(Token::from_bytes)
                    .map_err(|b| corrupt(format!("token is {} bytes, not 16", b.len())))
            })
            .transpose()?;
        Ok(StoredRow {
            fingerprint,
            token,
            state: row.try_get("state")?,
            response: row.try_get("response")?,
            is_error: row.try_get("is_error")?,
            expires_us: row.try_get("expires_us")?,
            remaining_us: row.try_get("remaining_us")?,
        })
    }

    fn expires_at(&self) -> SystemTime {
        match u64::try_from(self.expires_us) {
            Ok(us) => UNIX_EPOCH + Duration::from_micros(us),
            Err(_) => UNIX_EPOCH - Duration::from_micros(self.expires_us.unsigned_abs()),
        }
    }

    fn cached(self) -> Cached {
        Cached {
            expires_at: self.expires_at(),
            response: self.response,
            is_error: self.is_error,
        }
    }

    /// What `start` answers for this live row.
    fn into_start(self, fingerprint: Option<&Fingerprint>) -> Result<Start, Error> {
        check_fingerprint(self.fingerprint.as_ref(), fingerprint)?;
        match self.state {
            0 => Ok(Start::Locked {
                retry_after: Duration::from_micros(self.remaining_us.max(0).unsigned_abs()),
            }),
            1 => Ok(Start::Completed(self.cached())),
            s => Err(corrupt(format!("record state is {s}, not 0 or 1"))),
        }
    }

    fn into_record(self, key: Key) -> Result<Record, Error> {
        let fingerprint = self.fingerprint;
        let state = match (self.state, self.token) {
            (0, Some(token)) => RecordState::InProgress {
                token,
                lease_until: self.expires_at(),
            },
            (1, _) => RecordState::Completed(self.cached()),
            (s, _) => return Err(corrupt(format!("record state is {s}, not 0 or 1"))),
        };
        Ok(Record {
            key,
            fingerprint,
            state,
        })
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn start(
        &self,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        lease: Duration,
    ) -> Result<Start, Error> {
        check_duration("lease", lease)?;
        let mut conn = self.pool.acquire().await?;
        let live = match self.claim_path.read_first() {
            true => self.sql.read_live(&mut conn, key).await?,
            false => None,
        };
        let result = match live {
            Some(stored) => stored.into_start(fingerprint),
            None => {
                self.sql
                    .start(&mut conn, key, fingerprint, lease, ClaimSql::Bare)
                    .await
            }
        };
        self.claim_path.observe(&result);
        result
    }

    async fn complete(
        &self,
        claim: &Claim,
        completion: Completion<'_>,
        retention: Duration,
    ) -> Result<(), Error> {
        check_duration("retention", retention)?;
        let mut conn = self.pool.acquire().await?;
        self.sql
            .complete(&mut conn, claim, completion, retention)
            .await
    }

    async fn abort(&self, claim: &Claim) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await?;
        self.sql.abort(&mut conn, claim).await
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
        check_duration("lease", lease)?;
        let mut conn = self.renew_pool.acquire().await?;
        self.sql.renew(&mut conn, claim, lease).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let mut conn = self.pool.acquire().await?;
        self.sql.get(&mut conn, key).await
    }

    async fn evict(&self, key: &Key) -> Result<bool, Error> {
        let mut conn = self.pool.acquire().await?;
        self.sql.evict(&mut conn, key).await
    }

    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        let mut conn = self.pool.acquire().await?;
        self.sql.prune_expired(&mut conn, limit).await
    }
}

/// Transactional mode: the claim and the completion run on the caller's transaction (see
/// [`Transactional`](crate::Transactional)). Use the default `READ COMMITTED` isolation: a
/// duplicate's claim then waits on the first transaction's row and, once that commits, reads the
/// committed result with a fresh snapshot and replays it. (Under `REPEATABLE READ` or
/// `SERIALIZABLE` the duplicate fails with a serialization error instead, SQLSTATE 40001,
/// surfaced as a [`StoreErrorKind::Transient`](crate::StoreErrorKind::Transient) error; retry the
/// transaction.)
#[async_trait]
impl crate::TransactionalStore for PostgresStore {
    type Connection = PgConnection;

    async fn start_in(
        &self,
        conn: &mut PgConnection,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        lease: Duration,
    ) -> Result<Start, Error> {
        check_duration("lease", lease)?;
        // The CTE: a live row comes back unlocked, so the caller's transaction holds no lock on
        // another caller's record while it replays.
        self.sql
            .start(conn, key, fingerprint, lease, ClaimSql::ReadingLive)
            .await
    }

    async fn complete_in(
        &self,
        conn: &mut PgConnection,
        claim: &Claim,
        completion: Completion<'_>,
        retention: Duration,
    ) -> Result<(), Error> {
        check_duration("retention", retention)?;
        self.sql.complete(conn, claim, completion, retention).await
    }

    async fn abort_in(&self, conn: &mut PgConnection, claim: &Claim) -> Result<(), Error> {
        self.sql.abort(conn, claim).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_validated() {
        for ok in ["idem_records", "_x", "app.idem", "A1_b2", &"t".repeat(48)] {
            assert!(Statements::new(ok).is_ok(), "{ok} should be accepted");
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
            &"t".repeat(49),
        ] {
            assert!(
                matches!(Statements::new(bad), Err(Error::InvalidConfig(_))),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn names_are_quoted_and_derived() {
        let s = Statements::new("app.Idem").unwrap();
        assert_eq!(s.quoted_table, "\"app\".\"Idem\"");
        assert_eq!(s.migrations_table, "\"app\".\"Idem_migrations\"");
        assert_eq!(s.quoted_index, "\"Idem_expires_at_idx\"");
        assert!(s.claim.contains("INSERT INTO \"app\".\"Idem\" AS r"));
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
