//! The SqliteStore (its docs hold the schema, the time source and the round trips).
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{Sqlite, SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions};

use crate::background;
use crate::error::sql_error;
use crate::name::TableName;
use crate::protocol::Protocol;
use crate::store::{SqlStore, SqlStoreBuilder};
use idem_core::Error;

mod file;
mod schema;

use file::cannot_open;
pub use file::SqliteSync;
pub(crate) use file::SqliteUrl;

/// The oldest SQLite whose SQL this store uses: `unixepoch('subsec')` came in 3.42.
const MIN_SQLITE: (u32, u32) = (3, 42);

const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Records in a SQLite database: durable across restarts, shared by every process that opens the
/// same file.
///
/// Cloning is cheap and shares the connection pool. See the sections below for the schema,
/// the statements each operation runs and the connection settings.
///
/// ```
/// use std::time::Duration;
/// use idem::{Completion, Key, SqliteStore, ClaimOutcome, ClaimRequest, Store};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
///
/// let key = Key::derive("deposit", "alice", "req-1")?;
/// let lease = Duration::from_secs(30);
/// let ClaimOutcome::Claimed(claim) = store.claim(ClaimRequest::new(&key, lease)).await? else {
///     unreachable!("a new key is always started");
/// };
/// let retention = Duration::from_secs(3600);
/// let done = Completion::new(Some(&b"receipt-7"[..]), retention);
/// store.complete(&claim, done).await?;
///
/// let ClaimOutcome::Completed(cached) = store.claim(ClaimRequest::new(&key, lease)).await? else {
///     unreachable!("a completed key replays");
/// };
/// assert_eq!(cached.response.as_deref(), Some(&b"receipt-7"[..]));
/// # Ok(()) }
/// ```
///
/// # Schema
///
/// Created on connect by the store's own migrations (see below), for the default table name
/// `idem_records`:
///
/// ```sql
/// CREATE TABLE "idem_records" (
///     key         BLOB    NOT NULL PRIMARY KEY CHECK (length(key) = 32),
///     fingerprint BLOB             CHECK (fingerprint IS NULL OR length(fingerprint) = 32),
///     token       BLOB    NOT NULL CHECK (length(token) = 16),
///     state       INTEGER NOT NULL CHECK (state IN (0, 1)),   -- 0 in progress, 1 completed
///     expires_at  INTEGER NOT NULL,  -- ms since the Unix epoch: when the key frees (a lease's
///                                    -- end; a completed record's tombstone end)
///     response    BLOB,
///     is_error    INTEGER NOT NULL DEFAULT 0 CHECK (is_error IN (0, 1)),
///     -- version 3 (docs/architecture.md, "Past the lease"):
///     result_until INTEGER,          -- completed: the result's retention end (NULL on rows
///                                    -- completed before version 3: expires_at)
///     uncertain   INTEGER NOT NULL DEFAULT 0 CHECK (uncertain IN (0, 1)) -- OnLapse::Uncertain
/// );
/// -- The pruner's (version 6, under version 1's name): what it next does to a row, strip its
/// -- response (1: a tombstone's, after its retention) or delete it (0), and when.
/// CREATE INDEX "idem_records_expires_at" ON "idem_records" (
///     (CASE WHEN response IS NOT NULL AND expires_at > result_until THEN 1 ELSE 0 END),
///     (CASE WHEN response IS NOT NULL AND expires_at > result_until
///           THEN result_until ELSE expires_at END));
/// -- Partial: the uncertain claims (find_uncertain).
/// CREATE INDEX "idem_records_uncertain" ON "idem_records" (key)
///     WHERE state = 0 AND uncertain = true;
/// ```
///
/// A completion with a `key_retention` keeps its result until `result_until` and its key until
/// `expires_at`, `result_until` plus the `key_retention` in whole seconds (rounded up); without
/// one the two are equal. Once `result_until` passes the record is a tombstone (a claim gets
/// [`ClaimOutcome::Expired`](idem_core::ClaimOutcome::Expired)), and the pruner drops its
/// response: the row left costs a 70-byte record (102 with a fingerprint) and two index entries
/// of about 40 and 15 bytes (docs/stores.md). A claim made with
/// [`OnLapse::Uncertain`](idem_core::OnLapse::Uncertain) whose lease ends is never taken over
/// nor pruned (`uncertain`): only its holder, `take_uncertain` or `evict` change it.
///
/// `key` is the 32-byte [`Key`](idem_core::Key), `token` the claim's random 128-bit [`Token`](idem_core::Token) (kept after
/// completion, so a token is never reused for a key). It is an ordinary rowid table rather than
/// `WITHOUT ROWID` because responses can be large, and SQLite advises against `WITHOUT ROWID`
/// for large rows.
///
/// # Time
///
/// Leases and retention are computed with the database's clock, in milliseconds (a lease or
/// retention is whole milliseconds, rounded up, so a lease is never shorter than asked):
/// `CAST(round(unixepoch('subsec') * 1000) AS INTEGER)`. SQLite evaluates `'now'` once per
/// statement, so every comparison inside one statement sees the same instant. (`round` rather
/// than a plain cast because `unixepoch('subsec')` is a float that may land just below the
/// millisecond.) With SQLite every connection is in-process, so "database time" is the clock of
/// the host running the store.
///
/// # Round trips
///
/// Every operation takes a pooled connection and runs these statements on it; all of them are
/// calls into the in-process SQLite library, none crosses a network. sqlx runs each connection on
/// a thread of its own, so a statement is one hand-over to that thread and back. The pool that
/// [`open`](SqliteStore::open) and [`connect`](SqliteStore::connect) make hands out connections
/// without pinging them first (sqlx's default, `test_before_acquire(true)`, would add a hand-over
/// before every statement); a pool you give [`from_pool`](SqliteStore::from_pool) keeps its own
/// setting.
///
/// | operation | statements |
/// |---|---|
/// | `start`, new or expired key | 1: `INSERT … ON CONFLICT (key) DO UPDATE … WHERE NOT (expires_at > now OR (state = 0 AND uncertain = true))`, which claimed if it wrote a row (its count of changed rows, so no row comes back to decode); 2 while reading first (a `SELECT` of the live row, which finds none, comes before it) |
/// | `start`, live key (replay, locked, reused, uncertain, tombstone) | 1 while reading first: the `SELECT` of the live row; 2 while claiming first (the claim, which finds the live row, then the `SELECT`) |
/// | `complete` | 1 `UPDATE … WHERE key = ? AND token = ?`, which keeps the first result when the claim had already completed |
/// | `renew` | 1 `UPDATE … WHERE key = ? AND token = ? AND state = 0`, on the renewal connection (below) |
/// | `abort` | 1 query of 2 statements: `UPDATE … SET expires_at = now, token = <no claim's> … WHERE key = ? AND token = ? AND state = 0 AND` the steps' journal is kept (the record stays, lapsed, for the next claim to take over with it), then `DELETE … WHERE key = ? AND token = ? AND state = 0`, which finds the record only when the update left it |
/// | `evict` | 1 `DELETE` of the record and 1 of its steps, in a transaction |
/// | `get` | 1 `SELECT` |
/// | `take_uncertain` | 1 `UPDATE … WHERE key = ? AND token = ? AND state = 0 AND uncertain = true AND expires_at <= now` |
/// | `find_uncertain` | 1 `SELECT`, on the partial index of uncertain claims |
/// | `claim_steps` (`Call::run_steps`' claim) | 1 query of 3 statements, one hand-over to the connection's thread: a read of a lapsed claim in progress this claim may take over, the claim, a read of the claimed row with whether the key has live steps rows. A new operation's steps are then begun without a write; otherwise `begin_steps`' upsert follows (2 in all). A claim whose begin failed is released (1 `DELETE` more) |
/// | `write_step`, a finished step | 1 `UPDATE` of the claim's record, appending to its journal (docs/steps.md, "How a SQL store keeps them"); 1 more, a row of its own, for a result past the journal's 16 KiB or when the fence failed |
/// | `write_step` with `on_lapse` (an at-most-once step's begin and result) | 2 in a transaction: the record's `uncertain`, fenced as the step, then the step (SQLite has no data-modifying CTE); without it 1 |
/// | `prune_expired` | up to 4, each filling what the batch has left: a `SELECT` of the clock, which the next two bind (SQLite searches an index on expressions up to a bound value, not up to its clock); `UPDATE … SET response = NULL` of tombstones past their retention (`<to strip> = 1 AND <due> <= ?`), then `DELETE … WHERE key IN (SELECT key … WHERE <to strip> = 0 AND <due> <= ? … ORDER BY <due> LIMIT ?)` (never an uncertain claim, nor a lapsed one whose steps' journal is kept), both on the pruner's index; then the ended steps |
///
/// With [`writers_take_turns`](SqliteStoreBuilder::writers_take_turns) on a file, the claim's
/// `INSERT` and the completion's `UPDATE` are the same statements, each followed by `SELECT
/// changes()` (its count, as a row), but written by the store's group: those waiting at one
/// moment (up to 64) in one transaction, `BEGIN IMMEDIATE` … `COMMIT`, in queries of up to 8
/// writes of one kind, so one hand-over to the group connection's thread for up to 8 writes
/// and one commit for the group. A completion then takes no connection of the pool.
///
/// Every statement runs to its end before its result is used (the claim's count of rows, in
/// a transaction as on the pool): in autocommit mode SQLite commits when the statement
/// finishes, and a commit can fail (a full disk,
/// [`StoreErrorKind::Full`](idem_core::StoreErrorKind::Full)). Reading a claim's row and dropping
/// the rest would report a claim as won whose commit failed and was rolled back.
///
/// **Renewal has a connection of its own.** For a database file, `renew` runs on a second pool
/// of one connection, opened on first use with the main pool's settings. Work that holds every
/// connection of [`SqliteStore::pool`] (its own queries, a transaction) then still gets its
/// lease renewed instead of losing it while the heartbeat waits for a connection. The renewal
/// still needs SQLite's write lock: work that keeps a write transaction open longer than the
/// busy timeout blocks it all the same. In-memory databases have one connection and renew on it.
///
/// Whether `start` claims first or reads first is the store's [`ClaimOrder`](crate::ClaimOrder). By default it
/// follows the traffic: it claims first while most recent `start`s found a new key and reads
/// first while most found a live one. The read matters on SQLite because any `INSERT` takes the
/// single write lock, even one that ends up changing nothing: claiming first would make every
/// replay and every duplicate of a running call queue behind all writers (and sleep in SQLite's
/// busy handler when it meets one), while a read runs alongside them (WAL). Measured: reading
/// first makes a replay about twice as fast and a storm of duplicates about 1.5 times as fast,
/// and costs a new key 10–15 % (see `docs/performance.md`); following the traffic gets both.
/// SQLite has no data-modifying CTE, so the two cannot be folded into one statement as
/// PostgreSQL's transactional claim does.
///
/// When the claim finds a live row (another caller claimed the key first), `start` reads it; if
/// it vanished meanwhile (aborted, evicted or expired), `start` claims again, at most three
/// times; a key churned that fast by other callers reads as [`ClaimOutcome::Locked`](idem_core::ClaimOutcome::Locked) with a zero
/// `retry_after`. In transactional mode `start` always claims first: a read before the write
/// would leave the transaction unable to take the write lock once another connection had
/// committed.
///
/// # Journal mode and locking
///
/// [`SqliteStore::open`] and [`SqliteStore::connect`] set:
///
/// - `journal_mode = WAL` (stored in the database file, set once): readers never block the
///   writer nor the writer readers, so `get` and replays' reads proceed while a claim commits,
///   and a commit is one append to the log. Switching a new file to WAL needs an exclusive lock
///   that SQLite does not wait for, so when several processes open a new file at once the store
///   retries the switch for up to the busy timeout.
/// - `synchronous = FULL` on every connection ([`SqliteSync::Full`], the default): each commit
///   is synced to disk before the statement returns, so a claim or completion the store
///   acknowledged survives an OS crash or a power loss. [`SqliteSync::Normal`]
///   ([`SqliteStoreBuilder::synchronous`], or `?synchronous=normal` in the URL) syncs only at
///   checkpoints: in WAL mode that is still safe against corruption and against the
///   application crashing, but a power loss or OS crash may roll back the last few commits (a
///   completed record may be forgotten, so the work could run once more), for no `fsync` per
///   write (docs/stores.md has the measured difference).
/// - `busy_timeout = 5 s` (configurable) on every connection: a writer waits for the lock
///   instead of failing at once. A statement still blocked after the timeout fails with a
///   [`StoreErrorKind::Unavailable`](idem_core::StoreErrorKind::Unavailable) error, which [`Error::is_retryable`] reports as retryable.
/// - **With [`writers_take_turns(true)`](SqliteStoreBuilder::writers_take_turns), the store's
///   writers take turns in the process** (off by default). A call that writes on a pooled
///   connection (a claim's statement, a completion, a renewal, a step, a prune batch) waits for
///   its turn on an in-process queue, first come first served, before it asks SQLite for the
///   lock; so within one process only one of them asks at a time, and it finds the lock free.
///   SQLite's busy handler, which sleeps 1, 2, 5, 10, 15, 20, 25 ms and more between tries, is
///   then met only against another process or a transaction of your own. Reads (a replay's
///   read-first, `get`) take no turn. Calls on your transaction (transactional mode,
///   `steps.tx`) take none either: the transaction holds the lock already. A writer waits for
///   its turn at most the busy timeout (the one set here, or the `PRAGMA busy_timeout` of a pool
///   given to [`from_pool`](SqliteStore::from_pool)), then fails `Unavailable` having written
///   nothing: so while another process holds the lock, a queue of writers fails after the busy
///   timeout each rather than after the sum of the waits ahead of them, and no call waits more
///   than twice the busy timeout (its turn, then SQLite's handler). On a file, the claims and
///   completions of the turns are grouped: one task writes those waiting at one moment in one
///   transaction, and checkpoints the log beside them
///   ([`writers_take_turns`](SqliteStoreBuilder::writers_take_turns)).
///
/// # Migrations
///
/// The schema is a versioned list of steps kept in `schema.rs`, applied by the migrator that the
/// PostgreSQL store and the kit share. On connect the store takes the
/// write lock (`BEGIN IMMEDIATE`), creates `<table>_migrations` if missing, applies the steps not
/// recorded there and records them, then commits: running it twice, or from several pools or
/// processes at once, applies each step once. A table migrated by a newer version of idem (a
/// version this build does not know) is refused with [`Error::InvalidConfig`], unless
/// `PRAGMA quick_check` finds the file damaged (then the unknown version is garbage read from a
/// damaged page, and the error says so; see below).
///
/// A records table that is missing although the ledger lists its steps as applied (someone
/// dropped it) is created again on connect by re-running the applied steps (their statements
/// are idempotent, `IF NOT EXISTS`, but the `ADD COLUMN`s of versions 3 to 5, which add the
/// columns to a table just created and find them on one that was not dropped); the records it held are gone.
///
/// **Migrating out of band.** With
/// [`migrate_on_connect(false)`](SqliteStoreBuilder::migrate_on_connect) connecting only checks
/// the schema (reads the ledger) and fails with [`Error::SchemaNotMigrated`] when it is missing
/// or older, creating nothing. Bring it up to date with
/// [`SqliteStoreBuilder::migrate`] in a deployment step, or with the same statements as a
/// script: `idem-sql/sql/sqlite/idem_records.sql` for the default table,
/// [`SqliteStoreBuilder::schema_sql`] for any.
///
/// # Pruning
///
/// A record stays in the table after it expires until something deletes it (a new claim of the
/// same key replaces it, but most keys never come back). The store deletes expired records
/// itself while it lives: on connect it spawns a [`Pruner`](idem_core::Pruner) of its records on
/// the tokio runtime, with [`PrunerConfig::new`](idem_core::PrunerConfig::new) (bounded batches paced to a fifth of the
/// store's time, one process at a time under a lease kept in the table), which stops when the
/// last clone of the store is dropped. [`SqliteStoreBuilder::pruner`] configures it or turns it
/// off.
///
/// # Errors
///
/// Failures are [`Error::Store`] with a [`StoreErrorKind`](idem_core::StoreErrorKind) taken from
/// SQLite's result code: `SQLITE_BUSY`/`SQLITE_LOCKED` (the lock was held past the busy timeout)
/// are `Unavailable`, `SQLITE_FULL` is `Full`, `SQLITE_READONLY` is `ReadOnly`, and
/// `SQLITE_CORRUPT`/`SQLITE_NOTADB` are `Corrupt`, with a message saying that the file is
/// damaged and what to do.
///
/// # SQLite version
///
/// The statements need SQLite 3.35 (`RETURNING`) and 3.42 (`unixepoch('subsec')`). sqlx 0.8's
/// `sqlite` feature, which this crate enables, compiles in the SQLite bundled with
/// `libsqlite3-sys` 0.30: SQLite 3.46.0. The store checks `sqlite_version()` on connect and
/// refuses an older library (as a system SQLite linked through `sqlite-unbundled` might be)
/// with [`Error::InvalidConfig`].
///
/// # In-memory databases
///
/// An in-memory SQLite database belongs to the connection that opened it (sqlx gives the
/// connections of one pool a shared cache, but the database still vanishes with the last of
/// them). For `sqlite::memory:` URLs, `mode=memory` URLs, URLs with an empty file name (a
/// private temporary database) and [`SqliteStore::open`] of `":memory:"`, the store therefore
/// uses a pool of exactly one connection that is never closed for idleness or age: records live
/// as long as the store, and operations are serialised. Use in-memory databases for tests; use a
/// file for anything that must survive a restart.
pub type SqliteStore = SqlStore<Sqlite>;

impl SqliteStore {
    /// Opens (creating it if missing) the database file at `path` with the default settings and
    /// table `idem_records`, and creates or upgrades the schema.
    ///
    /// `":memory:"` opens a private in-memory database (see [Time](#time) and [Schema](#schema) below).
    /// A file that cannot be opened (its directory does not exist, no permission) is
    /// [`Error::SqliteFile`], naming the path and why.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = idem::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// assert_eq!(store.table(), "idem_records");
    /// # Ok(()) }
    /// ```
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, Error> {
        SqliteStore::builder().open(path).await
    }

    /// Connects to a sqlx SQLite URL (`sqlite://path/to/idem.db`, `sqlite::memory:`) with the
    /// default settings and table `idem_records`, and creates or upgrades the schema.
    ///
    /// A missing file is created, as [`open`](SqliteStore::open) creates it, unless the URL
    /// says `?mode=rw` (or `?mode=ro`): then a missing file is [`Error::SqliteFile`]. Besides
    /// sqlx's parameters the URL may say `synchronous=full` (the default) or
    /// `synchronous=normal` ([`SqliteSync`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = idem::SqliteStore::connect("sqlite::memory:").await?;
    /// assert_eq!(store.pool().size(), 1); // in-memory: exactly one connection
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<SqliteStore, Error> {
        SqliteStore::builder().connect(url).await
    }

    /// Uses a pool you configured, creating or upgrading the schema (table `idem_records`).
    ///
    /// The pool's settings are kept as they are; for a database file, `renew` runs on a second
    /// pool of one connection made with the same settings (see the
    /// [round trips](SqliteStore#round-trips)). Recommended: WAL journal mode, `synchronous =
    /// NORMAL` (or `FULL`), a busy timeout of a few seconds and `test_before_acquire(false)` (sqlx's
    /// default pings each connection before handing it out, one more hand-over to its thread per
    /// statement; see the [round trips](SqliteStore#round-trips)), as below. (With `journal_mode`
    /// in the options every new connection asks for the switch; processes opening a *new* file
    /// at the same moment may then fail with "database is locked", which
    /// [`open`](SqliteStore::open) and [`connect`](SqliteStore::connect) retry for you.) An
    /// in-memory database needs a pool of one connection that is never closed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let options = SqliteConnectOptions::new()
    ///     .filename(dir.path().join("app.db"))
    ///     .create_if_missing(true)
    ///     .journal_mode(SqliteJournalMode::Wal)
    ///     .synchronous(SqliteSynchronous::Full)
    ///     .busy_timeout(Duration::from_secs(5));
    /// let pool = SqlitePoolOptions::new()
    ///     .max_connections(4)
    ///     .test_before_acquire(false)
    ///     .connect_with(options)
    ///     .await?;
    /// let store = idem::SqliteStore::from_pool(pool).await?;
    /// # let _ = store;
    /// # Ok(()) }
    /// ```
    pub async fn from_pool(pool: SqlitePool) -> Result<SqliteStore, Error> {
        SqliteStore::builder().from_pool(pool).await
    }

    /// Closes the store cleanly, once its last call is done: stops its background pruner (after
    /// the batch in progress, releasing its lease), checkpoints the write-ahead log into the
    /// database file (`PRAGMA wal_checkpoint(TRUNCATE)`), and closes its connections, waiting
    /// for those in use to come back. SQLite then removes the `-wal` and `-shm` files beside
    /// the database, unless another process still has it open (its log stays for it, emptied).
    /// idem-server calls it when it stops on SIGTERM or Ctrl-C, after answering the requests in
    /// flight.
    ///
    /// Every clone shares what it closes: a call made on any clone afterwards fails with a
    /// [`StoreErrorKind::Unavailable`](idem_core::StoreErrorKind::Unavailable) error. Closing
    /// again does nothing. Without it, dropping the last clone closes the connections too, in
    /// the background, where an exit may cut it short and leave the log behind (SQLite replays
    /// it on the next open, so nothing is lost either way). An in-memory database is gone once
    /// closed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = idem::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// // … serve calls …
    /// store.close().await?;
    /// assert!(!dir.path().join("idem.db-wal").exists());
    /// # Ok(()) }
    /// ```
    pub async fn close(&self) -> Result<(), Error> {
        if let Some(pruner) = &self.pruner {
            pruner.stop().await;
        }
        if self.pool.is_closed() {
            return Ok(());
        }
        // The group's writes in flight end first, and its checkpoint, if one runs.
        if let Some(group) = self.protocol.group() {
            for pool in group.pools() {
                close_pool(pool).await;
            }
        }
        let checkpoint = async {
            let mut conn = self.pool.acquire().await?;
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .persistent(false)
                .execute(&mut *conn)
                .await?;
            // Closed here, not handed back to the pool by a task of its own.
            conn.close().await
        }
        .await;
        close_pool(&self.renew_pool).await;
        close_pool(&self.pool).await;
        checkpoint.map_err(sql_error)?;
        Ok(())
    }

    /// Settings beyond the defaults: the table name, the pool size, the busy timeout.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = idem::SqliteStore::builder()
    ///     .table("payments_idem")
    ///     .open(dir.path().join("idem.db"))
    ///     .await?;
    /// assert_eq!(store.table(), "payments_idem");
    /// # Ok(()) }
    /// ```
    pub fn builder() -> SqliteStoreBuilder {
        SqliteStoreBuilder::default()
    }
}

/// Configures a [`SqliteStore`] before connecting; made by [`SqliteStore::builder`]. Finish with
/// [`open`](Self::open) (a path), [`connect`](Self::connect) (a URL) or
/// [`from_pool`](Self::from_pool).
///
/// ```
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let store = idem::SqliteStore::builder()
///     .table("idem_orders")
///     .max_connections(4)
///     .busy_timeout(Duration::from_secs(10))
///     .open(dir.path().join("idem.db"))
///     .await?;
/// # let _ = store;
/// # Ok(()) }
/// ```
pub type SqliteStoreBuilder = SqlStoreBuilder<Sqlite>;

/// The settings of a [`SqliteStoreBuilder`] that only SQLite has.
#[derive(Debug, Clone)]
pub struct Settings {
    busy_timeout: Duration,
    synchronous: SqliteSync,
    writers_take_turns: bool,
}

impl Default for SqlStoreBuilder<Sqlite> {
    fn default() -> Self {
        SqlStoreBuilder::with(
            8,
            Settings {
                busy_timeout: DEFAULT_BUSY_TIMEOUT,
                synchronous: SqliteSync::Full,
                writers_take_turns: false,
            },
        )
    }
}

impl SqliteStoreBuilder {
    /// How long a statement waits for another connection's write lock before failing (default
    /// 5 s). Ignored by [`from_pool`](SqliteStoreBuilder::from_pool).
    ///
    /// ```
    /// let builder = idem::SqliteStore::builder().busy_timeout(std::time::Duration::from_secs(1));
    /// # let _ = builder;
    /// ```
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.db.busy_timeout = timeout;
        self
    }

    /// Whether the store's writers in this process take turns for SQLite's one write lock
    /// (default: no). With turns, a call that writes waits on an in-process queue, first come
    /// first served, before it asks SQLite for the lock, so that within the process only one
    /// writer asks at a time and finds it free, instead of all asking at once and sleeping in
    /// SQLite's busy handler (1, 2, 5, 10 ms and more between tries) when they find it taken.
    /// Turn them on when the store's writes are most of the file's: idem-server does, and there
    /// they halved a new key's p99 at 8 connections. Leave them off when your own code writes
    /// to the same file on other connections (your business rows, the effects of
    /// [`Steps`](idem_core::Steps)): the writer whose turn it is then often meets your writes
    /// holding the lock, sleeps in the busy handler, and holds up the queue behind it, and an
    /// operation of 3 steps, each one write of its own, ran at 0.35 × the same writes made
    /// resumable by hand at 8 tasks with turns, against 0.63 × without (docs/performance.md,
    /// "Steps"). A writer waits for its turn at most the busy timeout, then fails
    /// `Unavailable` having written nothing. Applies to [`from_pool`](Self::from_pool) too.
    ///
    /// **On a file, the claims and completions are then grouped into commits.** One task of
    /// the store writes those waiting at one moment (up to 64) in one transaction, in the
    /// turns, eight statements to a query: one hand-over to SQLite's thread where there were
    /// eight, one commit where there were 64. Each caller is answered once the commit holding
    /// its write is done, with its own count (claimed or not, completed or fenced); a group
    /// that cannot be written as one (a write that does not fit) is rolled back and written
    /// write by write, so that only that write fails; a write whose caller went away before
    /// the group began it is not made. The group's commits run no checkpoint: a connection of
    /// its own copies the log into the database beside the writes (after every 256 writes),
    /// and once the log passes 4,000 pages copies the rest in the writers' turn, so that
    /// SQLite starts it again. Renewals, releases, steps and prune batches take turns alone.
    /// idem-server's new keys at 8 connections: twice as many a second, half the p99
    /// (docs/performance.md, "SQLite: writers grouped into one commit").
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = idem::SqliteStore::builder()
    ///     .writers_take_turns(true)
    ///     .open(dir.path().join("idem.db"))
    ///     .await?;
    /// # let _ = store;
    /// # Ok(()) }
    /// ```
    pub fn writers_take_turns(mut self, on: bool) -> Self {
        self.db.writers_take_turns = on;
        self
    }

    /// When a write is acknowledged: [`SqliteSync::Full`] (the default) syncs every commit to
    /// disk first, so it survives an OS crash or power loss; [`SqliteSync::Normal`] only at
    /// checkpoints, which survives the process crashing but not the machine (see
    /// [`SqliteSync`]). A URL's `synchronous=` parameter, if [`connect`](Self::connect) is
    /// given one, overrides it. Ignored by [`from_pool`](SqliteStoreBuilder::from_pool), whose
    /// pool keeps its own.
    ///
    /// ```
    /// use idem::{SqliteStore, SqliteSync};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = SqliteStore::builder()
    ///     .synchronous(SqliteSync::Normal)
    ///     .open(dir.path().join("idem.db"))
    ///     .await?;
    /// let level: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(store.pool()).await?;
    /// assert_eq!(level, 1); // NORMAL
    /// # Ok(()) }
    /// ```
    pub fn synchronous(mut self, synchronous: SqliteSync) -> Self {
        self.db.synchronous = synchronous;
        self
    }

    /// Opens (creating it if missing) the database file at `path`; `":memory:"` opens a private
    /// in-memory database. See [`SqliteStore::open`]. With
    /// [`migrate_on_connect(false)`](Self::migrate_on_connect) a missing file is not created:
    /// it is a missing schema, [`Error::SchemaNotMigrated`]. A file that cannot be opened is
    /// [`Error::SqliteFile`], naming it and why.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let store = idem::SqliteStore::builder().table("t1").open(":memory:").await?;
    /// assert_eq!(store.table(), "t1");
    /// # Ok(()) }
    /// ```
    pub async fn open(self, path: impl AsRef<Path>) -> Result<SqliteStore, Error> {
        let path = path.as_ref();
        if path == Path::new(":memory:") {
            return self.connect("sqlite::memory:").await;
        }
        self.open_file(SqliteConnectOptions::new().filename(path), None)
            .await
    }

    /// Connects to a sqlx SQLite URL. See [`SqliteStore::connect`]: a missing file is created
    /// unless the URL says `mode=rw` or `mode=ro`, and `synchronous=full|normal` overrides
    /// [`synchronous`](Self::synchronous).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    /// let store = idem::SqliteStore::builder().connect(&url).await?; // creates the file
    /// # let _ = store;
    /// let missing = format!("sqlite://{}?mode=rw", dir.path().join("other.db").display());
    /// let err = idem::SqliteStore::builder().connect(&missing).await.unwrap_err();
    /// assert!(matches!(err, idem::Error::SqliteFile { .. }), "{err}");
    /// # Ok(()) }
    /// ```
    pub async fn connect(mut self, url: &str) -> Result<SqliteStore, Error> {
        let url = SqliteUrl::parse(url)?;
        if let Some(synchronous) = url.synchronous {
            self.db.synchronous = synchronous;
        }
        let options = SqliteConnectOptions::from_str(&url.sqlx)
            .map_err(|e| Error::InvalidConfig(format!("bad SQLite URL {:?}: {e}", url.sqlx)))?;
        if url.private {
            return self.connect_with(options, true).await;
        }
        self.open_file(options, url.creates).await
    }

    /// Opens the database file `options` name. A missing file is created when `creates` (a
    /// URL's `mode`) says so, or, when it says nothing, when the store migrates on connect:
    /// without migrating, a missing file is a missing schema.
    async fn open_file(
        self,
        options: SqliteConnectOptions,
        creates: Option<bool>,
    ) -> Result<SqliteStore, Error> {
        let path = options.get_filename().to_owned();
        if creates.is_none() && !self.migrate_on_connect && !path.exists() {
            // Only migrating creates a database: the file is the schema's first part.
            return Err(Error::SchemaNotMigrated {
                table: self.table,
                found: None,
                needed: schema::latest(),
            });
        }
        let options = options.create_if_missing(creates.unwrap_or(self.migrate_on_connect));
        self.connect_with(options, false).await
    }

    /// Uses a pool you configured. See [`SqliteStore::from_pool`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let pool = sqlx::sqlite::SqlitePoolOptions::new()
    ///     .max_connections(1)
    ///     .idle_timeout(None)
    ///     .max_lifetime(None)
    ///     .connect("sqlite::memory:")
    ///     .await.map_err(idem::sql_error)?;
    /// let store = idem::SqliteStore::builder().table("mine").from_pool(pool).await?;
    /// assert_eq!(store.table(), "mine");
    /// # Ok(()) }
    /// ```
    pub async fn from_pool(self, pool: SqlitePool) -> Result<SqliteStore, Error> {
        let table = self.table_name()?;
        background::check(self.pruner.as_ref())?;
        let mut conn = pool.acquire().await.map_err(sql_error)?;
        check_version(&mut conn).await?;
        if self.migrate_on_connect {
            schema::migrate(&mut conn, &table).await?;
        } else {
            schema::check(&mut conn, &table).await?;
        }
        let in_file = is_file_backed(&mut conn).await?;
        let busy_timeout = busy_timeout_of(&mut conn).await?;
        drop(conn);
        // The main pool's settings (busy timeout, pragmas, callbacks), one connection, opened
        // when first used.
        let one_connection = |options: SqliteConnectOptions| {
            pool.options()
                .clone()
                .min_connections(0)
                .max_connections(1)
                .connect_lazy_with(options)
        };
        let options = (*pool.connect_options()).clone();
        let renew_pool = match in_file {
            true => one_connection(options.clone()),
            false => pool.clone(),
        };
        let protocol = match self.db.writers_take_turns {
            true => Protocol::new(table, self.claim_order).with_write_turns(busy_timeout),
            false => Protocol::new(table, self.claim_order),
        };
        // Writers that take turns are grouped into commits, on a connection of their own whose
        // commits leave checkpoints to another beside it. An in-memory database lives in its
        // one connection, so its writers only take turns.
        let protocol = match in_file {
            true => protocol.with_group(
                one_connection(options.clone().pragma("wal_autocheckpoint", "0")),
                one_connection(options),
            ),
            false => protocol,
        };
        let mut store = SqlStore {
            protocol: Arc::new(protocol),
            pool,
            renew_pool,
            pruner: None,
        };
        store.pruner = background::spawn(store.without_pruner(), self.pruner)?;
        Ok(store)
    }

    /// Creates or upgrades the schema of this builder's table on `conn`, as connecting does
    /// unless [`migrate_on_connect(false)`](Self::migrate_on_connect): for a deployment step
    /// that migrates before the application starts. It takes the write lock for the few
    /// statements it runs; running it again, or from several processes at once, applies each
    /// step once. Inside a transaction it runs under a savepoint.
    ///
    /// ```
    /// use sqlx::Connection;
    /// use idem::SqliteStore;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let url = format!("sqlite://{}?mode=rwc", dir.path().join("idem.db").display());
    ///
    /// // The deployment step.
    /// let mut conn = sqlx::SqliteConnection::connect(&url).await?;
    /// SqliteStore::builder().migrate(&mut conn).await?;
    /// conn.close().await?;
    ///
    /// // The application: checks the schema, creates nothing.
    /// let store = SqliteStore::builder().migrate_on_connect(false).connect(&url).await?;
    /// # let _ = store;
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self, conn: &mut SqliteConnection) -> Result<(), Error> {
        let table = self.table_name()?;
        check_version(conn).await?;
        schema::migrate(conn, &table).await
    }

    /// The SQL [`migrate`](Self::migrate) runs, for this builder's table, as a script to apply
    /// with your own tools (`sqlite3 idem.db < idem_records.sql`, a migration tool): the
    /// ledger `<table>_migrations`, then each schema version's row in it and its statements.
    /// Every statement is idempotent (`IF NOT EXISTS`, `ON CONFLICT DO NOTHING`) but the
    /// `ALTER TABLE … ADD COLUMN`s of versions 3 to 5, which SQLite cannot make conditional: the script of a
    /// newer idem brings any older schema up to date, and applied again to a table at version 3
    /// or later it fails at them ("duplicate column name") and changes nothing, committed or
    /// rolled back (`migrate`, which reads the ledger, runs each version once). `idem-sql/sql/sqlite/idem_records.sql` is this script for the
    /// default table.
    /// Run it in one transaction (`BEGIN; … COMMIT;` around it with `sqlite3`). It touches only
    /// idem's own tables (a tool such as sqlx's migrator records the file in its own ledger,
    /// `_sqlx_migrations`, which idem never reads).
    ///
    /// ```
    /// let sql = idem::SqliteStore::builder().table("payments_idem").schema_sql()?;
    /// assert!(sql.contains(r#"CREATE TABLE IF NOT EXISTS "payments_idem" ("#));
    /// assert!(sql.contains(r#"INSERT INTO "payments_idem_migrations""#));
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn schema_sql(&self) -> Result<String, Error> {
        schema::script(&self.table_name()?)
    }

    fn table_name(&self) -> Result<TableName, Error> {
        if self.table.to_ascii_lowercase().starts_with("sqlite_") {
            return Err(Error::InvalidConfig(format!(
                "table name {:?} starts with \"sqlite_\", which SQLite reserves for itself",
                self.table
            )));
        }
        TableName::new("table name", &self.table)
    }

    async fn connect_with(
        self,
        options: SqliteConnectOptions,
        single_connection: bool,
    ) -> Result<SqliteStore, Error> {
        // Refuse a bad name or pruner before opening (and perhaps creating) a file.
        self.table_name()?;
        background::check(self.pruner.as_ref())?;
        // No `journal_mode` here: every new connection would try to switch the file, and two
        // first openers of a new file would fail each other (see `enable_wal`).
        let options = options
            .synchronous(self.db.synchronous.pragma())
            .busy_timeout(self.db.busy_timeout);
        let path = options.get_filename().to_owned();
        let pool = if single_connection {
            // The database lives only as long as a connection to it: keep exactly one, forever.
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            SqlitePoolOptions::new().max_connections(self.max_connections.max(1))
        }
        // sqlx's default pings every connection before handing it out: a round trip to the
        // connection's worker thread before every statement, for a connection that cannot go
        // away (it is a file this process opened; sqlx also pings it when it goes back).
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .map_err(|e| cannot_open(&path, e))?;
        if !single_connection {
            enable_wal(
                &mut *pool.acquire().await.map_err(sql_error)?,
                self.db.busy_timeout,
            )
            .await?;
        }
        self.from_pool(pool).await
    }
}

/// Closes `pool` and every connection it holds. A connection that goes back to the pool while
/// sqlx's `close` runs (handed back by a task of its own after its last statement) may be left
/// idle and open, which would keep SQLite's log files until the pool is dropped; closing again
/// closes it. A connection still in use is waited for.
async fn close_pool(pool: &SqlitePool) {
    for _ in 0..8 {
        pool.close().await;
        if pool.size() == 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Switches the database file to WAL. The mode is stored in the file, so only the first
/// connection to a new file changes anything; the others find it done. The switch needs an
/// exclusive lock that SQLite does not wait for with the busy timeout, so when several processes
/// or pools open a new file at once the losers retry here for up to `patience`.
async fn enable_wal(conn: &mut SqliteConnection, patience: Duration) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match sqlx::query_scalar::<_, String>("PRAGMA journal_mode = WAL")
            .persistent(false)
            .fetch_one(&mut *conn)
            .await
        {
            Ok(mode) => {
                if !mode.eq_ignore_ascii_case("wal") {
                    tracing::warn!(
                        mode,
                        "SQLite kept its journal mode instead of switching to WAL; \
                         readers and the writer will block each other"
                    );
                }
                return Ok(());
            }
            Err(e) => {
                let e = Error::from(sql_error(e));
                if !e.is_retryable() || tokio::time::Instant::now() >= deadline {
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(fastrand::u64(5..=25))).await;
            }
        }
    }
}

/// The connection's busy timeout (`PRAGMA busy_timeout`, set by the builder or by the pool you
/// configured), which also bounds a writer's wait for its turn in this process.
async fn busy_timeout_of(conn: &mut SqliteConnection) -> Result<Duration, Error> {
    let (millis,): (i64,) = sqlx::query_as("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .map_err(sql_error)?;
    Ok(Duration::from_millis(u64::try_from(millis).unwrap_or(0)))
}

/// Whether the connection's main database is a file (a second connection reaches the same
/// records), rather than an in-memory or temporary database (file name empty).
async fn is_file_backed(conn: &mut SqliteConnection) -> Result<bool, Error> {
    let file: Option<String> =
        sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
            .persistent(false)
            .fetch_optional(&mut *conn)
            .await
            .map_err(sql_error)?
            .flatten();
    Ok(file.is_some_and(|f| !f.is_empty()))
}

/// Refuses a SQLite library too old for the statements below.
async fn check_version(conn: &mut SqliteConnection) -> Result<(), Error> {
    let version: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&mut *conn)
        .await
        .map_err(sql_error)?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found < MIN_SQLITE {
        return Err(Error::InvalidConfig(format!(
            "SQLite {version} is too old: idem needs {}.{} or newer (build with sqlx's bundled \
             SQLite, the `sqlite` feature)",
            MIN_SQLITE.0, MIN_SQLITE.1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_table_names_are_refused() {
        let b = SqliteStoreBuilder::default().table("SQLite_stat1");
        assert!(matches!(b.table_name(), Err(Error::InvalidConfig(_))));
    }
}
