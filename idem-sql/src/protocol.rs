//! The store protocol, written once: the statements of a SQL store and each operation against a
//! connection, generic over the database ([`Ops`]). Both the pool path ([`Store`] on a pooled
//! connection) and the caller's-transaction path ([`TransactionalStore`]) call it, from
//! [`SqlStore<DB>`](crate::SqlStore)'s one impl of each.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::row::{columns, holds_key, time, StoredRow};
use super::steps::{steps_table, StepStatements};
use super::{corrupt, fenced};
use crate::claim_order::{ClaimOrder, ClaimPath};
use crate::dialect::{Dialect, Ops};
use crate::error::sql_error;
use crate::group::{ClaimArgs, Group, Write};
use crate::name::TableName;
use idem_core::store::support::LAPSED_CLAIMS_KEPT_MS;
use idem_core::Store;
use idem_core::{Claim, ClaimOutcome, ClaimRequest, Completion, OnLapse, Record};
use idem_core::{Error, StoreError, StoreErrorKind};
use idem_core::{Key, Token, UncertainOperation};
use idem_core::{StepLog, StepWrite};

/// How often `start` claims again when the live row it lost to vanished before it could be
/// read (aborted, evicted, pruned or expired in between). Each retry needs another writer to
/// interleave, so three is plenty.
const CLAIM_ATTEMPTS: usize = 3;

/// A store whose claim and completion can run on a caller's transaction: the SQL stores, on
/// their connection type (`SqliteConnection`, `PgConnection`). Sealed: implemented by
/// [`SqliteStore`](crate::SqliteStore) and, with the `postgres` feature, `PostgresStore`; use
/// it through [`Transactional`](crate::Transactional). A `sqlx::Transaction` derefs to its
/// connection, so pass `&mut tx`.
///
/// ```
/// fn takes<S: idem::TransactionalStore>(_: &S) {}
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// takes(&idem::SqliteStore::open(":memory:").await?);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait TransactionalStore: Store + Sealed {
    /// The connection the caller's transaction runs on.
    type Connection: Send;

    /// The store protocol's claim, on the caller's transaction.
    #[doc(hidden)]
    async fn claim_in(
        &self,
        conn: &mut Self::Connection,
        request: ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, Error>;

    /// The store protocol's completion, on the caller's transaction.
    #[doc(hidden)]
    async fn complete_in(
        &self,
        conn: &mut Self::Connection,
        claim: &Claim,
        completion: Completion<'_>,
    ) -> Result<(), Error>;

    /// The store protocol's abort, on the caller's transaction.
    #[doc(hidden)]
    async fn abort_in(&self, conn: &mut Self::Connection, claim: &Claim) -> Result<(), Error>;

    /// [`Store::write_step`] on the caller's transaction: a transactional step's record,
    /// committed with the step's own writes ([`SqlSteps::tx`](crate::SqlSteps::tx)).
    #[doc(hidden)]
    async fn write_step_in(
        &self,
        conn: &mut Self::Connection,
        claim: &Claim,
        step: StepWrite<'_>,
    ) -> Result<(), Error>;
}

/// Not nameable outside the crate: seals [`TransactionalStore`].
pub trait Sealed {}

/// The SQL of every operation, rendered once for a table and a database.
#[derive(Debug)]
struct Statements {
    /// Insert, or take over a row that no longer holds its key ([`holds_key`]). The pool path
    /// reads whether it claimed from the count of rows it wrote (1 inserted or taken over, 0
    /// left alone), so the database builds no row and the driver decodes none.
    claim_counted: String,
    /// The claim of transactional mode where the database can make it one statement that also
    /// returns the live row it did not claim (PostgreSQL); elsewhere (SQLite) a transaction
    /// claims with `claim_counted`, whose count says whether it claimed, as a `RETURNING`
    /// would, without the temporary table SQLite builds for a `RETURNING`'s rows.
    claim_in_transaction: Option<String>,
    /// The claim of an operation that runs steps: rows only when it claimed, saying whether its
    /// steps must be begun by a statement of their own
    /// ([`claim_steps_sql`](crate::steps::claim_steps_sql)); one statement on PostgreSQL, one
    /// query of several on SQLite.
    claim_steps: String,
    read_live: String,
    complete: String,
    renew: String,
    abort: String,
    evict: String,
    prune: String,
    /// Drops the response of completed records whose retention ended while their tombstone
    /// runs.
    strip: String,
    /// The database's clock, for the prune and the strip to bind where the dialect says so
    /// ([`Dialect::pruner_binds_now`]).
    read_clock: String,
    take_uncertain: String,
    find_uncertain: String,
}

/// The token of a released record kept for its steps' journal.
const RELEASED: [u8; 16] = [0; 16];

/// The condition of a claim made with `OnLapse::Uncertain` that has not completed, in the
/// words of the partial index of version 3 (`{uncertain_index}`), so both databases use it.
const UNCERTAIN: &str = "state = 0 AND uncertain = true";

/// Whether the pruner's next work on a row is to strip its response: completed, the response
/// kept, a tombstone to follow (1), or else to delete the row (0). The first column of the
/// records table's pruner index since version 6 (`{index}`), in its words, so both
/// databases use it.
const TO_STRIP: &str =
    "(CASE WHEN response IS NOT NULL AND expires_at > result_until THEN 1 ELSE 0 END)";

/// When the pruner next has work on a row: its result's end when [`TO_STRIP`], else its key's
/// (`expires_at`). The pruner index's second column, in its words.
const DUE: &str = "(CASE WHEN response IS NOT NULL AND expires_at > result_until \
                   THEN result_until ELSE expires_at END)";

impl Statements {
    fn new(d: &Dialect, t: &TableName) -> Statements {
        let now = d.now;
        // The time the pruner's statements search its index up to ([`Dialect::pruner_binds_now`]).
        let pruner_now = match d.pruner_binds_now {
            true => "$2".to_owned(),
            false => format!("(SELECT {now})"),
        };
        let lease_end = d.now_plus("$4");
        let columns = columns(d);
        let holds_key = holds_key(d);
        // The completion's clock, read once: SQLite's `now` is one instant within a statement;
        // on PostgreSQL it is read into `c.at` by a join.
        let (at, clock) = if d.now_is_one_instant {
            (now.to_owned(), String::new())
        } else {
            (
                "c.at".to_owned(),
                format!("FROM (SELECT {now} AS at) AS c "),
            )
        };
        // Meeting a row that holds its key, the bare claim locks it for the moment of the
        // statement (on PostgreSQL), as any `ON CONFLICT DO UPDATE` does, and changes nothing.
        // A lapsed uncertain claim holds its key: only `take_uncertain` takes it over.
        // A claim in progress that lapsed is taken over with its steps' journal while the
        // journal is kept (its holder released it, or died): the new holder resumes from it.
        // Any other row it replaces (an ended record) leaves no journal.
        let take_over = format!(
            "ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint, \
               token = excluded.token, state = 0, expires_at = excluded.expires_at, \
               response = NULL, is_error = false, result_until = NULL, \
               uncertain = excluded.uncertain, \
               journal = CASE WHEN r.state = 0 AND {journal_kept} THEN r.journal END, \
               journal_until = CASE WHEN r.state = 0 AND {journal_kept} THEN r.journal_until END \
             WHERE NOT {holds_key}",
            journal_kept = crate::steps::journal_kept(d, "r"),
        );
        let insert = format!(
            "INSERT INTO {t} AS r \
             (key, fingerprint, token, state, expires_at, response, is_error, result_until, uncertain)"
        );
        let claim_counted = format!(
            "{insert} VALUES ($1, $2, $3, 0, {lease_end}, NULL, false, NULL, $5) {take_over}"
        );
        let claim_in_transaction = d.claim_reads_live.then(|| {
            // A live row in the statement's snapshot is returned as it is and nothing is
            // written: a replay then takes no row lock, so the caller's transaction holds no
            // lock on another caller's record, needs no transaction id and writes no WAL. A live
            // row the snapshot cannot see (committed after the statement began, or still
            // uncommitted) meets the insert's conflict check instead, which leaves it alone and
            // returns no row; `start` then reads it afresh.
            format!(
                "WITH live AS ( \
                   SELECT {columns} FROM {t} AS r WHERE r.key = $1 AND {holds_key}), \
                 claimed AS ( \
                   {insert} \
                   SELECT $1, $2, $3, 0, {lease_end}, NULL, false, NULL, $5 \
                   WHERE NOT EXISTS (SELECT 1 FROM live) \
                   {take_over} RETURNING r.key) \
                 SELECT true AS claimed, CAST(NULL AS {bytes}) AS fingerprint, \
                   CAST(NULL AS {bytes}) AS token, CAST(0 AS {bigint}) AS state, \
                   CAST(NULL AS {bytes}) AS response, false AS is_error, false AS uncertain, \
                   CAST(0 AS {bigint}) AS expires_us, CAST(0 AS {bigint}) AS result_us, \
                   CAST(0 AS {bigint}) AS now_us \
                 FROM claimed \
                 UNION ALL \
                 SELECT false, live.* FROM live WHERE NOT EXISTS (SELECT 1 FROM claimed)",
                bytes = d.bytes,
                bigint = d.bigint,
            )
        });
        let claim_steps =
            crate::steps::claim_steps_sql(d, t, &crate::steps::steps_table(t), &claim_counted);
        Statements {
            claim_counted,
            claim_in_transaction,
            claim_steps,
            read_live: format!("SELECT {columns} FROM {t} AS r WHERE r.key = $1 AND {holds_key}"),
            // Fenced by the token alone, so that completing a claim again (a retry whose first
            // commit landed but whose answer was lost) succeeds, and a lapsed uncertain claim's
            // holder still completes it; the CASEs keep the first result and its times. SET
            // expressions read the row as it was before the update. The clock is read once
            // (`at`, above), so a completion without a tombstone ($6 = 0) ends its key exactly
            // when its result. The steps' journal goes: the result replays in its place.
            complete: format!(
                "UPDATE {t} AS r SET state = 1, \
                   response = CASE WHEN r.state = 0 THEN $3 ELSE r.response END, \
                   is_error = CASE WHEN r.state = 0 THEN $4 ELSE r.is_error END, \
                   result_until = CASE WHEN r.state = 0 THEN {retention_end} ELSE r.result_until END, \
                   expires_at = CASE WHEN r.state = 0 THEN {key_end} ELSE r.expires_at END, \
                   uncertain = false, journal = NULL, journal_until = NULL \
                 {clock}WHERE r.key = $1 AND r.token = $2",
                retention_end = d.at_plus(&at, "$5"),
                key_end = d.at_plus(&at, "($5 + $6)"),
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = {lease_end} WHERE key = $1 AND token = $2 AND state = 0",
                lease_end = d.now_plus("$3"),
            ),
            // A claim whose steps' journal is kept is not deleted but left lapsed, under a
            // token no holder has (`$3`), so that the next claim takes it over with the journal
            // and counts the attempt; any other is deleted. Exactly one row changes either way.
            abort: if d.claim_reads_live {
                format!(
                    "WITH kept AS ( \
                       UPDATE {t} AS r SET expires_at = {now}, token = $3, uncertain = false \
                       WHERE r.key = $1 AND r.token = $2 AND r.state = 0 AND {journal_kept} \
                       RETURNING 1), \
                     deleted AS ( \
                       DELETE FROM {t} WHERE key = $1 AND token = $2 AND state = 0 \
                         AND NOT EXISTS (SELECT 1 FROM kept) RETURNING 1) \
                     SELECT 1 FROM kept UNION ALL SELECT 1 FROM deleted",
                    journal_kept = crate::steps::journal_kept(d, "r"),
                )
            } else {
                // SQLite: the update changes the token, so the delete after it finds the row
                // only when the update left it.
                format!(
                    "UPDATE {t} AS r SET expires_at = {now}, token = $3, uncertain = false \
                     WHERE r.key = $1 AND r.token = $2 AND r.state = 0 AND {journal_kept}; \
                     DELETE FROM {t} WHERE key = $1 AND token = $2 AND state = 0",
                    journal_kept = crate::steps::journal_kept(d, "r"),
                )
            },
            evict: format!("DELETE FROM {t} WHERE key = $1"),
            // Ended tombstones and retentions, and claims that lapsed longer ago than a late
            // holder may still complete them (`LAPSED_CLAIMS_KEPT`): a lapsed claim nobody took
            // over still carries its holder's token. Never an uncertain claim. PostgreSQL's
            // SKIP LOCKED lets several pruners (and live claims holding row locks) run side by
            // side; the row locks keep a key from being re-claimed between choosing and
            // deleting.
            // A lapsed claim stays while its steps' journal is kept, for the claim that
            // resumes it. The rows to delete are those the pruner's index (version 6,
            // `{index}`) files as not to strip, due by now: due is then `expires_at`. The
            // index is searched up to the clock read once ([`Dialect::pruner_binds_now`]): compared
            // row by row, PostgreSQL's volatile `clock_timestamp()` cannot bound the scan, which
            // then reads every live key whenever fewer than a batch are due.
            prune: format!(
                "DELETE FROM {t} WHERE key IN ( \
                   SELECT key FROM {t} AS r WHERE {TO_STRIP} = 0 AND {DUE} <= {pruner_now} \
                     AND (state <> 0 OR (uncertain = false AND expires_at <= {lapsed} \
                       AND NOT {journal_kept})) \
                   ORDER BY {DUE} LIMIT $1{lock})",
                lapsed = d.now_minus(&LAPSED_CLAIMS_KEPT_MS.to_string()),
                lock = d.lock_batch,
                journal_kept = crate::steps::journal_kept(d, "r"),
            ),
            // The rows the pruner's index files as to strip (completed, a response kept, a
            // tombstone after the retention), due by now: due is then `result_until`.
            // Stripped, a row is filed as not to strip, due when its key frees.
            strip: format!(
                "UPDATE {t} SET response = NULL, journal = NULL, journal_until = NULL \
                 WHERE key IN ( \
                   SELECT key FROM {t} WHERE {TO_STRIP} = 1 AND {DUE} <= {pruner_now} \
                   ORDER BY {DUE} LIMIT $1{lock})",
                lock = d.lock_batch,
            ),
            read_clock: format!("SELECT {now}"),
            // Fenced by the lapsed claim's token: of two resolvers only the first changes the
            // row. The claim stays uncertain on lapse.
            take_uncertain: format!(
                "UPDATE {t} SET token = $3, expires_at = {lease_end} \
                 WHERE key = $1 AND token = $2 AND {UNCERTAIN} AND expires_at <= {now}",
                lease_end = d.now_plus("$4"),
            ),
            find_uncertain: format!(
                "SELECT key, token, {since} FROM {t} \
                 WHERE {UNCERTAIN} AND expires_at <= {now} AND key > $1 \
                 ORDER BY key LIMIT $2",
                since = d.micros_of("expires_at"),
            ),
        }
    }
}

/// A claim statement and how it tells that it claimed.
#[derive(Clone, Copy)]
enum ClaimSql<'a> {
    /// By the count of rows it wrote.
    Counted(&'a str),
    /// By the row it returns (`claimed`), which may be followed by the live row it met.
    Returning(&'a str),
    /// By the rows of [`claim_steps_sql`](crate::steps::claim_steps_sql), the steps begun for
    /// the retention in milliseconds given.
    Steps(&'a str, i64),
}

/// Where an operation runs: on a connection of the store's pool, or on the caller's
/// transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    Pool,
    Transaction,
}

/// The queue of this process's writers to a database with one write lock, and how long one
/// waits in it.
pub(crate) struct WriteTurns {
    queue: tokio::sync::Mutex<()>,
    wait: Duration,
}

impl WriteTurns {
    /// The turn, once the writers ahead have had theirs; fails after [`wait`](Self::wait).
    pub(crate) async fn take(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, Error> {
        tokio::time::timeout(self.wait, self.queue.lock())
            .await
            .map_err(|_| self.waited_too_long())
    }

    /// How long a writer waits for its turn: the database's busy timeout.
    pub(crate) fn wait(&self) -> Duration {
        self.wait
    }

    /// The error of a writer that waited [`wait`](Self::wait) for its turn.
    pub(crate) fn waited_too_long(&self) -> Error {
        Error::Store(StoreError::new(
            StoreErrorKind::Unavailable,
            format!(
                "the SQLite database's write lock stayed taken for longer than the busy \
                 timeout ({} ms) while this process's writers waited their turn for it: \
                 another process or a long transaction holds it; nothing was written, and \
                 the call may be retried",
                self.wait.as_millis()
            ),
        ))
    }
}

/// A SQL store's protocol: its table, its statements and its claim order, with each operation
/// written once against a connection of `DB`. Durations arrive converted by
/// [`millis`](crate::millis).
pub(crate) struct Protocol<DB: Ops> {
    table: TableName,
    sql: Statements,
    steps: StepStatements,
    claim_path: ClaimPath,
    /// The turns of this process's writers for a database with one write lock (SQLite).
    writes: Option<Arc<WriteTurns>>,
    /// The claims and completions of pooled connections, written together (SQLite whose
    /// writers take turns, in a file).
    group: Option<Group<DB>>,
}

impl<DB: Ops> Protocol<DB> {
    /// The protocol of `table`, whose steps live in [`steps_table`].
    pub(crate) fn new(table: TableName, claim_order: ClaimOrder) -> Protocol<DB> {
        Protocol {
            sql: Statements::new(&DB::DIALECT, &table),
            steps: StepStatements::new(&DB::DIALECT, &table, &steps_table(&table)),
            table,
            claim_path: ClaimPath::new(claim_order),
            writes: None,
            group: None,
        }
    }

    /// The records table.
    pub(crate) fn table(&self) -> &TableName {
        &self.table
    }

    /// Makes this process's writers take [turns](Self::write_turn) (a database with one write
    /// lock: SQLite), each waiting for its turn at most `wait`: the database's busy timeout, so
    /// that a queue of writers behind one held up by another process fails each of them after
    /// that long, as SQLite alone would, instead of after the sum of their waits.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))] // only SQLite has one write lock
    pub(crate) fn with_write_turns(mut self, wait: Duration) -> Protocol<DB> {
        if DB::DIALECT.single_writer {
            self.writes = Some(Arc::new(WriteTurns {
                queue: tokio::sync::Mutex::new(()),
                wait,
            }));
        }
        self
    }

    /// Makes the claims and completions of pooled connections go to a [`Group`] that writes
    /// those waiting at one moment in one transaction, on `pool` (a connection of its own to the
    /// same file, which does not checkpoint as it commits), in this process's turns, and
    /// checkpoints the log on `checkpoints` (another); only once turns are taken
    /// ([`with_write_turns`](Self::with_write_turns)).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))] // only SQLite takes turns
    pub(crate) fn with_group(
        mut self,
        pool: sqlx::Pool<DB>,
        checkpoints: sqlx::Pool<DB>,
    ) -> Protocol<DB> {
        if let Some(turns) = &self.writes {
            let (claim, complete) = (&self.sql.claim_counted, &self.sql.complete);
            let group = Group::new(pool, checkpoints, turns.clone(), claim, complete);
            self.group = Some(group);
        }
        self
    }

    /// The group that writes the claims and completions of pooled connections, if there is
    /// one: a completion then goes to it with no connection of the pool and no turn of its own.
    pub(crate) fn group(&self) -> Option<&Group<DB>> {
        self.group.as_ref()
    }

    /// This process's turn to write, on a database with one write lock (SQLite) whose store
    /// was built with turns (`None` otherwise): held while a store call on a pooled connection runs its writing statements,
    /// taken after the connection (always in that order, so no two calls wait on each other).
    /// Writers of one process then queue here, first come first served, and the one whose turn
    /// it is finds the lock free unless another process or the caller's own transaction holds
    /// it. Without it they all ask SQLite at once, and every one that finds the lock taken
    /// sleeps in its busy handler for 1, 2, 5, 10, 15, 20, 25 ms and more before asking again:
    /// at 8 concurrent writers that made a claim's p99 about ten times its median
    /// (docs/performance.md, "Side by side with Diom"). Calls on the caller's transaction
    /// (transactional mode, `steps.tx`) never take it: their transaction already holds the
    /// lock.
    ///
    /// A writer waits for its turn at most the busy timeout ([`with_turn_wait`]
    /// (Self::with_turn_wait)), then fails `Unavailable` having written nothing, as it would
    /// have on meeting the lock held that long: so one writer held up by another process (in
    /// SQLite's busy handler, up to the busy timeout) holds up the others no longer than that.
    pub(crate) async fn write_turn(
        &self,
    ) -> Result<Option<tokio::sync::MutexGuard<'_, ()>>, Error> {
        match &self.writes {
            Some(turns) => turns.take().await.map(Some),
            None => Ok(None),
        }
    }

    /// The claim order of the pool path.
    pub(crate) fn claim_order(&self) -> ClaimOrder {
        self.claim_path.order()
    }

    /// [`Store::claim`], on a pooled connection or on the caller's transaction (`via`).
    ///
    /// On a pooled connection, while the [`ClaimOrder`] reads first, a live record is answered
    /// by one read, which never waits for a write lock; only a key that reads as free goes on
    /// to the claim. A transaction always claims first, since a read before the write would make
    /// the transaction's write wait or fail on a row it read.
    pub(crate) async fn start(
        &self,
        via: Via,
        conn: &mut DB::Connection,
        request: ClaimRequest<'_>,
        lease_ms: i64,
    ) -> Result<ClaimOutcome, Error> {
        let sql = ClaimSql::Counted(&self.sql.claim_counted);
        if via == Via::Transaction {
            let sql = match &self.sql.claim_in_transaction {
                Some(returning) => ClaimSql::Returning(returning),
                None => sql,
            };
            return Ok(self.claim(conn, sql, request, lease_ms, None).await?.0);
        }
        Ok(self.on_pool(conn, sql, request, lease_ms).await?.0)
    }

    /// [`Store::claim_steps`](idem_core::Store::claim_steps) on a pooled connection: one query
    /// that claims (the claim order's read first, if it reads first) and tells whether there
    /// is anything to resume; the steps' begin, a statement more, only when there is.
    pub(crate) async fn start_steps(
        &self,
        conn: &mut DB::Connection,
        request: ClaimRequest<'_>,
        lease_ms: i64,
        retention_ms: i64,
    ) -> Result<(ClaimOutcome, Option<StepLog>), Error> {
        let sql = ClaimSql::Steps(&self.sql.claim_steps, retention_ms);
        self.on_pool(conn, sql, request, lease_ms).await
    }

    /// A claim on a pooled connection: while the [`ClaimOrder`] reads first, a live record is
    /// answered by one read; otherwise, or when the key reads as free, the claim `sql`.
    async fn on_pool(
        &self,
        conn: &mut DB::Connection,
        sql: ClaimSql<'_>,
        request: ClaimRequest<'_>,
        lease_ms: i64,
    ) -> Result<(ClaimOutcome, Option<StepLog>), Error> {
        let live = match self.claim_path.read_first() {
            true => self.read_live(conn, request.key).await?,
            false => None,
        };
        let result = match live {
            Some(stored) => stored.into_start(request.fingerprint).map(|o| (o, None)),
            None => match (&self.group, sql) {
                // The group takes the turn for the claim's statement.
                (Some(group), ClaimSql::Counted(_)) => {
                    self.claim(conn, sql, request, lease_ms, Some(group)).await
                }
                _ => match self.write_turn().await {
                    Ok(_turn) => self.claim(conn, sql, request, lease_ms, None).await,
                    Err(e) => Err(e),
                },
            },
        };
        self.claim_path.observe(result.as_ref().map(|(o, _)| o));
        result
    }

    /// Runs the claim statement `sql`; on a live record, answers from the row it returned or
    /// from one read of it; claims again if that record vanished meanwhile. The step log only
    /// from a [`ClaimSql::Steps`] that claimed. A counted claim goes to `group`, if given.
    async fn claim(
        &self,
        conn: &mut DB::Connection,
        sql: ClaimSql<'_>,
        request: ClaimRequest<'_>,
        lease_ms: i64,
        group: Option<&Group<DB>>,
    ) -> Result<(ClaimOutcome, Option<StepLog>), Error> {
        let (key, fingerprint) = (request.key, request.fingerprint);
        let uncertain = request.on_lapse == OnLapse::Uncertain;
        for _ in 0..CLAIM_ATTEMPTS {
            let token = Token::random();
            let token_bytes = token.to_bytes();
            let text = match sql {
                ClaimSql::Counted(text) | ClaimSql::Returning(text) | ClaimSql::Steps(text, _) => {
                    text
                }
            };
            let write = Write::Claim(ClaimArgs {
                key: *key,
                fingerprint: fingerprint.copied(),
                token: token_bytes,
                lease_ms,
                uncertain,
            });
            // Bound where it runs here; the group binds its own copy.
            let query = || write.bind(sqlx::query(text));
            // Both run the statement to its end, so an error the database reports at its end
            // (the COMMIT of SQLite's autocommit mode on a full disk, PostgreSQL's at commit)
            // fails the claim instead of being dropped, and a claim whose commit failed is never
            // reported as won: `execute` waits for the statement's completion, and `fetch_all`
            // (never `fetch_optional`) reads every row and the end of the reply.
            let claimed = || ClaimOutcome::Claimed(Claim::new(*key, token));
            let row = match sql {
                ClaimSql::Counted(_) => {
                    let count = match group {
                        Some(group) => group.write(write.clone()).await?,
                        None => DB::execute(&mut *conn, query()).await.map_err(sql_error)?,
                    };
                    if count == 1 {
                        return Ok((claimed(), None));
                    }
                    None
                }
                ClaimSql::Steps(_, retention_ms) => {
                    let begun: Result<Option<StepLog>, Error> = async {
                        let rows = DB::fetch_all(&mut *conn, query())
                            .await
                            .map_err(sql_error)?;
                        let Some(found) = crate::steps::ClaimedSteps::of::<DB>(&rows)? else {
                            return Ok(None);
                        };
                        if !found.must_begin() {
                            // A new operation: begun without a write (docs/steps.md).
                            let steps = Vec::new();
                            return Ok(Some(StepLog { attempt: 1, steps }));
                        }
                        let claim = Claim::new(*key, token);
                        let log =
                            self.steps
                                .begin::<DB>(conn, &claim, retention_ms, found.took_over);
                        log.await.map(Some)
                    }
                    .await;
                    match begun {
                        Ok(Some(log)) => return Ok((claimed(), Some(log))),
                        Ok(None) => None,
                        Err(e) => {
                            // The claim may have committed before the failure (SQLite's
                            // statements each commit; the begin is a statement of its own).
                            // No one else holds this token, so release it; should that fail
                            // too, the claim lapses as a crashed holder's would.
                            let query = self.abort_query(key, &token_bytes);
                            let _ = DB::execute(&mut *conn, query).await;
                            return Err(e);
                        }
                    }
                }
                ClaimSql::Returning(_) => {
                    let row = DB::fetch_all(&mut *conn, query())
                        .await
                        .map_err(sql_error)?
                        .into_iter()
                        .next();
                    if let Some(row) = &row
                        && DB::get_bool(row, 0).map_err(sql_error)?
                    {
                        return Ok((claimed(), None));
                    }
                    row
                }
            };
            // Not claimed. A transactional claim may return the row that was live in its
            // snapshot; one committed after the snapshot began is invisible there (no row), and
            // one whose time ran out while the statement ran has nothing left: read it afresh.
            let live = match row.map(|r| StoredRow::decode::<DB>(&r, 1)).transpose()? {
                Some(stored) if stored.is_live() => Some(stored),
                _ => self.read_live(conn, key).await?,
            };
            if let Some(stored) = live {
                return Ok((stored.into_start(fingerprint)?, None));
            }
            // It vanished (aborted, evicted, pruned or expired) before we could read it: the key
            // may be free now, so claim again.
        }
        // Other callers keep claiming and releasing this key faster than we can look: it is
        // busy.
        Ok((
            ClaimOutcome::Locked {
                retry_after: Duration::ZERO,
            },
            None,
        ))
    }

    /// The live (unexpired) record row of `key`.
    async fn read_live(
        &self,
        conn: &mut DB::Connection,
        key: &Key,
    ) -> Result<Option<StoredRow>, Error> {
        let query = DB::bind_bytes(sqlx::query(&self.sql.read_live), &key.as_bytes()[..]);
        let row = DB::fetch_optional(conn, query).await.map_err(sql_error)?;
        row.map(|row| StoredRow::decode::<DB>(&row, 0)).transpose()
    }

    /// [`Store::complete`]: the result for `retention_ms`, and the key for `key_retention_ms`
    /// more (a tombstone; 0 for none).
    pub(crate) async fn complete(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        completion: Completion<'_>,
        retention_ms: i64,
        key_retention_ms: i64,
    ) -> Result<(), Error> {
        let write = Write::complete(claim, &completion, retention_ms, key_retention_ms);
        let query = write.bind(sqlx::query(&self.sql.complete));
        fenced(DB::execute(conn, query).await.map_err(sql_error)?)
    }

    /// [`Store::take_uncertain`]: one fenced statement; a new token and lease on the row only
    /// while it is an uncertain claim, lapsed, carrying `token`.
    pub(crate) async fn take_uncertain(
        &self,
        conn: &mut DB::Connection,
        key: &Key,
        token: Token,
        lease_ms: i64,
    ) -> Result<Claim, Error> {
        let (old, new) = (token.to_bytes(), Token::random());
        let new_bytes = new.to_bytes();
        let query = self.fenced_query(&self.sql.take_uncertain, key, &old);
        let query = DB::bind_i64(DB::bind_bytes(query, &new_bytes[..]), lease_ms);
        match DB::execute(conn, query).await.map_err(sql_error)? {
            0 => Err(Error::NotUncertain { operation: *key }),
            _ => Ok(Claim::new(*key, new)),
        }
    }

    /// [`Store::find_uncertain`]: one statement, on the partial index of uncertain claims.
    pub(crate) async fn find_uncertain(
        &self,
        conn: &mut DB::Connection,
        after: Option<&Key>,
        limit: u32,
    ) -> Result<Vec<UncertainOperation>, Error> {
        // Every key is 32 bytes, so each sorts after the empty one.
        let after = after.map_or(&[][..], |k| &k.as_bytes()[..]);
        let query = DB::bind_bytes(sqlx::query(&self.sql.find_uncertain), after);
        let rows = DB::fetch_all(conn, DB::bind_i64(query, i64::from(limit)))
            .await
            .map_err(sql_error)?;
        rows.iter()
            .map(|row| {
                let key: [u8; 32] = DB::get_bytes(row, 0)
                    .map_err(sql_error)?
                    .try_into()
                    .map_err(|_| corrupt("a stored key is not 32 bytes".to_owned()))?;
                let token: [u8; 16] = DB::get_bytes(row, 1)
                    .map_err(sql_error)?
                    .try_into()
                    .map_err(|_| corrupt("a stored token is not 16 bytes".to_owned()))?;
                Ok(UncertainOperation {
                    key: Key::from_bytes(key),
                    token: Token::from_bytes(token),
                    since: time("expires_at", DB::get_i64(row, 2).map_err(sql_error)?)?,
                })
            })
            .collect()
    }

    /// [`Store::renew`].
    pub(crate) async fn renew(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        lease_ms: i64,
    ) -> Result<(), Error> {
        let token = claim.token().to_bytes();
        let query = self.fenced_query(&self.sql.renew, claim.key(), &token);
        fenced(
            DB::execute(conn, DB::bind_i64(query, lease_ms))
                .await
                .map_err(sql_error)?,
        )
    }

    /// [`Store::abort`].
    pub(crate) async fn abort(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
    ) -> Result<(), Error> {
        let token = claim.token().to_bytes();
        let query = self.abort_query(claim.key(), &token);
        fenced(DB::execute(conn, query).await.map_err(sql_error)?)
    }

    /// The release of the claim `token` holds on `key` (`abort`), with the token a record kept
    /// for its steps' journal is left under: [`RELEASED`], which no claim has (a claim's is
    /// random), so its former holder's late writes find nothing.
    fn abort_query<'q>(
        &'q self,
        key: &'q Key,
        token: &'q [u8],
    ) -> crate::dialect::SqlQuery<'q, DB> {
        DB::bind_bytes(
            self.fenced_query(&self.sql.abort, key, token),
            &RELEASED[..],
        )
    }

    /// A statement fenced by the claim's key (`$1`) and token (`$2`).
    fn fenced_query<'q>(
        &self,
        sql: &'q str,
        key: &'q Key,
        token: &'q [u8],
    ) -> crate::dialect::SqlQuery<'q, DB> {
        DB::bind_bytes(DB::bind_bytes(sqlx::query(sql), &key.as_bytes()[..]), token)
    }

    /// [`Store::get`].
    pub(crate) async fn get(
        &self,
        conn: &mut DB::Connection,
        key: &Key,
    ) -> Result<Option<Record>, Error> {
        self.read_live(conn, key)
            .await?
            .map(|stored| stored.into_record(*key))
            .transpose()
    }

    /// [`Store::evict`]: the record and its steps, in one transaction.
    pub(crate) async fn evict(&self, conn: &mut DB::Connection, key: &Key) -> Result<bool, Error> {
        self.steps
            .evict_with::<DB>(conn, key, &self.sql.evict)
            .await
    }

    /// [`Store::prune_expired`]: the responses of tombstones whose retention ended, then ended
    /// records, then ended step rows, each filling what is left of the batch (so a short batch
    /// still means nothing is left). A stripped response counts as one. The strip goes first
    /// because the prune searches only the rows the pruner's index files as not to strip: a
    /// record whose tombstone also ended before its response was stripped is stripped, then
    /// deleted in the same pass.
    pub(crate) async fn prune_expired(
        &self,
        conn: &mut DB::Connection,
        limit: u32,
    ) -> Result<u64, Error> {
        let left = |done: u64| u32::try_from(u64::from(limit).saturating_sub(done)).unwrap_or(0);
        let now = if DB::DIALECT.pruner_binds_now {
            let row = DB::fetch_optional(&mut *conn, sqlx::query(&self.sql.read_clock))
                .await
                .map_err(sql_error)?;
            let row = row.ok_or(sqlx::Error::RowNotFound).map_err(sql_error)?;
            Some(DB::get_i64(&row, 0).map_err(sql_error)?)
        } else {
            None
        };
        fn bound<DB: Ops>(
            sql: &str,
            limit: u32,
            now: Option<i64>,
        ) -> crate::dialect::SqlQuery<'_, DB> {
            let query = DB::bind_i64(sqlx::query(sql), i64::from(limit));
            match now {
                Some(now) => DB::bind_i64(query, now),
                None => query,
            }
        }
        let mut done = DB::execute(&mut *conn, bound::<DB>(&self.sql.strip, limit, now))
            .await
            .map_err(sql_error)?;
        if left(done) == 0 {
            return Ok(done);
        }
        done += DB::execute(&mut *conn, bound::<DB>(&self.sql.prune, left(done), now))
            .await
            .map_err(sql_error)?;
        if left(done) == 0 {
            return Ok(done);
        }
        Ok(done + self.steps.prune::<DB>(conn, left(done)).await?)
    }

    /// The statements of the steps ([`Store::begin_steps`], [`Store::write_step`]).
    pub(crate) fn steps(&self) -> &StepStatements {
        &self.steps
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;

    #[test]
    fn postgres_statements_name_the_quoted_table() {
        let t = TableName::qualified("table name", "app.Idem").unwrap();
        let p = Protocol::<sqlx::Postgres>::new(t, ClaimOrder::Adaptive);
        assert!(p
            .sql
            .claim_counted
            .contains("INSERT INTO \"app\".\"Idem\" AS r"));
        let in_transaction = p.sql.claim_in_transaction.as_deref().unwrap_or_default();
        assert!(in_transaction.starts_with("WITH live AS"));
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod sqlite_plans {
    /// The plan SQLite makes for `sql` (binding `$1` and `$2` to `x''` and 10), one line per
    /// step.
    async fn plan(store: &crate::SqliteStore, sql: &str) -> Vec<String> {
        let rows = sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}"))
            .bind(&[][..])
            .bind(10)
            .fetch_all(store.pool())
            .await
            .unwrap();
        rows.iter()
            .map(|row| sqlx::Row::get::<String, _>(row, "detail"))
            .collect()
    }

    /// The statements that look for the rows of an index on expressions or a partial index
    /// use it: the pruner's prune and strip (version 6's index) and `find_uncertain` (version
    /// 3's), whatever the table's size.
    #[tokio::test]
    async fn the_partial_indexes_serve_their_statements() {
        let store = crate::SqliteStore::connect("sqlite::memory:")
            .await
            .unwrap();
        // The strip's and the prune's searches of the pruner's index pick their half of it and
        // end at the clock (bound as `$2`): they read the index only up to the rows due.
        let sql = &store.protocol.sql;
        for (what, statement, index) in [
            (
                "strip",
                &sql.strip,
                "USING INDEX idem_records_expires_at (<expr>=? AND <expr><?)",
            ),
            (
                "prune",
                &sql.prune,
                "USING INDEX idem_records_expires_at (<expr>=? AND <expr><?)",
            ),
            (
                "find_uncertain",
                &sql.find_uncertain,
                "USING INDEX idem_records_uncertain",
            ),
        ] {
            let plan = plan(&store, statement).await;
            assert!(plan.iter().any(|s| s.contains(index)), "{what}: {plan:?}");
        }
    }
}

#[cfg(all(test, feature = "postgres"))]
mod postgres_plans {
    /// The pruner's statements on PostgreSQL read the clock once (`(SELECT clock_timestamp())`,
    /// an init plan), so it bounds the index scan (`Index Cond: … <= …`; the prune and the
    /// strip also pick their half of the pruner's index there). Compared row by row, the
    /// volatile `clock_timestamp()` is a filter: the scan then reads every live key whenever
    /// fewer than a batch are due (200,000 live keys: 25.8 ms a pass against 0.03 ms). Needs
    /// `IDEM_TEST_PG_URL` (a failure without it under `IDEM_REQUIRE_PG=1`).
    #[tokio::test]
    async fn the_pruners_statements_bound_their_index_scans_by_the_clock() {
        let Ok(url) = std::env::var("IDEM_TEST_PG_URL") else {
            assert!(
                std::env::var("IDEM_REQUIRE_PG").is_err(),
                "IDEM_REQUIRE_PG=1 without IDEM_TEST_PG_URL"
            );
            return;
        };
        let table = format!("idem_plans_{:016x}", fastrand::u64(..));
        let store = crate::PostgresStore::builder()
            .pruner(None)
            .table(&table)
            .connect(&url)
            .await
            .unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        // An empty table would be read whole whatever the statement: ask for the index.
        sqlx::query("SET enable_seqscan = off")
            .execute(&mut *conn)
            .await
            .unwrap();
        let steps = store.protocol.steps();
        for (what, sql, index) in [
            (
                "prune",
                store.protocol.sql.prune.as_str(),
                "_expires_at_idx",
            ),
            (
                "strip",
                store.protocol.sql.strip.as_str(),
                "_expires_at_idx",
            ),
            ("steps' prune", steps.prune_sql(), "_steps_expires_at_idx"),
        ] {
            let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {sql}"))
                .bind(100_i64)
                .fetch_all(&mut *conn)
                .await
                .unwrap();
            let scan = plan.iter().position(|l| l.contains(index));
            let bounded = scan.is_some_and(|at| {
                plan.iter()
                    .skip(at + 1)
                    .take_while(|l| !l.contains("->"))
                    .any(|l| l.contains("Index Cond") && l.contains(" <= "))
            });
            assert!(bounded, "{what}: {plan:#?}");
        }
        drop(conn);
        for t in [
            format!("{table}_steps"),
            format!("{table}_migrations"),
            table,
        ] {
            sqlx::query(&format!("DROP TABLE IF EXISTS \"{t}\""))
                .execute(store.pool())
                .await
                .unwrap();
        }
    }
}
