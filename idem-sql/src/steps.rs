//! The steps of the SQL stores (docs/steps.md, "How a SQL store keeps them"), written once for
//! both databases. The finished steps of a claim are its record's **journal** (schema version
//! 5): entries ([`journal_entry`]) appended by one `UPDATE` of the record the claim holds, as a
//! hand-written recovery point is. The record stays, lapsed, while its journal is kept (a
//! release leaves it so, and the pruner passes it over), and the claim that takes it over takes
//! the journal with it. A table `<table>_steps` beside the records holds the rest: per
//! operation a row named `''` at position -1 counts its attempts (and holds the journal of
//! schema version 4, read before the record's); a step's begin (an at-most-once step's), a
//! result too large for the journal, a write that also sets what the record becomes on lapse,
//! and idem's own records (the input, the failure marks) are rows of their own, one per
//! (operation key, step name), as are the steps a store of the earlier shapes wrote:
//! [`step_log`] reads them all.
//!
//! Every write is fenced by the operation's record, in progress under the claim's token: a
//! journal write updates the record only while it carries the claim's token, and a row of its
//! own is selected from the record (locking it for the statement on PostgreSQL, where SQLite's
//! single writer already serialises). A claim that was taken over writes nothing.

use sqlx::Connection;

use crate::dialect::{Dialect, Ops};
use crate::error::sql_error;
use crate::name::TableName;
use idem_core::store::support::FAILED_STEP_PREFIX;
use idem_core::Claim;
use idem_core::Error;
use idem_core::Key;
use idem_core::OnLapse;
use idem_core::{Abandoned, StepLog, StepRecord, StepState, StepWrite, INPUT_STEP};

use super::corrupt;

/// The table of `table`'s steps: `<table>_steps`, in the table's schema.
pub(crate) fn steps_table(table: &TableName) -> TableName {
    table.suffixed("_steps")
}

/// The statements of the steps, rendered once for a records table and its steps table.
#[derive(Debug)]
pub(crate) struct StepStatements {
    /// Counts the claim as an attempt and moves the live steps' retention on, fenced, in one
    /// statement ([`begin_sql`]); no row when the fence fails.
    begin: String,
    /// Stores that a step began, or its result, as a row of its own (fenced).
    write: String,
    /// Appends a finished step to the journal in the claim's own record ($3: the entry, $4:
    /// the retention, $5: [`kept_for`] it): one `UPDATE` of the row the claim holds, fenced by
    /// it; no row when the fence fails or the journal would grow past [`JOURNAL_MAX_BYTES`].
    append: String,
    /// `write` that also sets the record's `uncertain` ($8), in one statement where the
    /// database has data-modifying CTEs (PostgreSQL).
    write_on_lapse: Option<String>,
    /// Sets the record's `uncertain` ($3), fenced as `write`: before `write`, in one
    /// transaction, where there is no `write_on_lapse` (SQLite).
    set_on_lapse: String,
    /// Whether the claim still holds its running record.
    holds: String,
    evict: String,
    prune: String,
    /// Operations in progress past their lease whose steps keep an input, by key.
    abandoned: String,
}

impl StepStatements {
    /// The ended steps' prune, for the plan tests.
    #[cfg(test)]
    pub(crate) fn prune_sql(&self) -> &str {
        &self.prune
    }

    pub(crate) fn new(d: &Dialect, t: &TableName, s: &TableName) -> StepStatements {
        let now = d.now;
        let lock = d.lock_rows;
        let insert = format!(
            "INSERT INTO {s} AS s (key, name, position, token, attempt, finished, result, expires_at)"
        );
        // The fence: a row only while the record is in progress under the claim's token.
        let fence =
            format!("FROM {t} AS r WHERE r.key = $1 AND r.token = $2 AND r.state = 0{lock}");
        // A finished step keeps its first result; an ended one (from an earlier life of the
        // key, not yet pruned) is replaced.
        let write_row = |from: &str| {
            format!(
                "{insert} SELECT r.key, $3, $4, r.token, 0, $5, $6, {until} {from} \
                 ON CONFLICT (key, name) DO UPDATE SET position = excluded.position, \
                   token = excluded.token, finished = excluded.finished, \
                   result = excluded.result, expires_at = excluded.expires_at \
                 WHERE s.finished = false OR s.expires_at <= {now}",
                until = d.now_plus("$7"),
            )
        };
        let set_uncertain = |param: &str| {
            format!(
                "UPDATE {t} SET uncertain = {param} WHERE key = $1 AND token = $2 AND state = 0"
            )
        };
        StepStatements {
            // Fenced by the record: locked (on PostgreSQL) while it is in progress under the
            // claim's token; no row at all once the claim was taken over.
            begin: with_record_journal(
                d,
                t,
                &begin_sql(
                    d,
                    s,
                    &format!("{t} AS r"),
                    &format!(
                        "r.key = $1 AND r.token = $2 AND r.state = 0{}",
                        if lock.is_empty() {
                            ""
                        } else {
                            " FOR UPDATE OF r"
                        }
                    ),
                    "$3",
                    &first_attempt(d, s, "$4"),
                ),
            ),
            write: write_row(&fence),
            // The journal is kept until `journal_until`, which moves on only when it would end
            // sooner than `retention` ($4) from now, and then to [`kept_for`] ($5) from now;
            // neither column is indexed, so the update writes the record's page alone (and
            // PostgreSQL makes it in place), as a hand-written recovery point's does. An entry
            // written after the journal's retention ended starts a new journal. Journals of
            // schema version 4, in the steps table's `''` row, stay there and are read first
            // (`begin`).
            append: format!(
                "UPDATE {t} AS r SET \
                   journal = CAST(CASE WHEN r.journal IS NULL OR r.journal_until <= {now} \
                     THEN $3 ELSE r.journal || $3 END AS {bytes}), \
                   journal_until = CASE WHEN r.journal_until IS NULL \
                     OR r.journal_until < {until} THEN {kept} ELSE r.journal_until END \
                 WHERE r.key = $1 AND r.token = $2 AND r.state = 0 \
                   AND COALESCE({length}(r.journal), 0) + {length}($3) <= {JOURNAL_MAX_BYTES}",
                bytes = d.bytes,
                until = d.now_plus("$4"),
                kept = d.now_plus("$5"),
                // Bytes, not characters: a BLOB's `length` on SQLite.
                length = if d.bytes == "BYTEA" {
                    "octet_length"
                } else {
                    "length"
                },
            ),
            // The record's update is the fence: the step row is written from the row it
            // returns, so a stale claim changes neither.
            write_on_lapse: d.claim_reads_live.then(|| {
                format!(
                    "WITH r AS ({} RETURNING key, token) {}",
                    set_uncertain("$8"),
                    write_row("FROM r")
                )
            }),
            set_on_lapse: set_uncertain("$3"),
            holds: format!("SELECT 1 FROM {t} WHERE key = $1 AND token = $2 AND state = 0"),
            evict: format!("DELETE FROM {s} WHERE key = $1"),
            prune: format!(
                "DELETE FROM {s} WHERE (key, name) IN ( \
                   SELECT key, name FROM {s} WHERE expires_at <= (SELECT {now}) \
                   ORDER BY expires_at LIMIT $1{lock_batch})",
                lock_batch = d.lock_batch,
            ),
            // No claim holds it (its record is gone, or running past its lease and not
            // uncertain: the completer never runs an uncertain operation again), it has not
            // completed, and its latest attempt (the '' row's count; 1 without one, a first
            // attempt that began its steps without writing) was not marked failed.
            abandoned: format!(
                "SELECT s.key, s.result FROM {s} AS s \
                 LEFT JOIN {s} AS a ON a.key = s.key AND a.name = '' AND a.expires_at > {now} \
                 LEFT JOIN {t} AS r ON r.key = s.key \
                 WHERE s.name = '{INPUT_STEP}' AND s.finished = true AND s.expires_at > {now} \
                   AND (r.key IS NULL OR (r.state = 0 AND r.expires_at <= {now} \
                     AND r.uncertain = false)) \
                   AND NOT EXISTS (SELECT 1 FROM {s} AS f WHERE f.key = s.key \
                     AND f.name = '{FAILED_STEP_PREFIX}' || CAST(COALESCE(a.attempt, 1) AS TEXT)) \
                   AND s.key > $1 \
                 ORDER BY s.key LIMIT $2"
            ),
        }
    }

    /// [`Store::find_abandoned`](idem_core::Store::find_abandoned): one statement, from the steps
    /// table (only operations that ran steps have rows there) to their records.
    pub(crate) async fn find_abandoned<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        after: Option<&Key>,
        limit: u32,
    ) -> Result<Vec<Abandoned>, Error> {
        // Every key is 32 bytes, so each sorts after the empty one.
        let after = after.map_or(&[][..], |k| &k.as_bytes()[..]);
        let query = DB::bind_bytes(sqlx::query(&self.abandoned), after);
        let rows = DB::fetch_all(conn, DB::bind_i64(query, i64::from(limit)))
            .await
            .map_err(sql_error)?;
        rows.iter()
            .map(|row| {
                let key: [u8; 32] = DB::get_bytes(row, 0)
                    .map_err(sql_error)?
                    .try_into()
                    .map_err(|_| corrupt("a steps row's key is not 32 bytes".into()))?;
                let input = DB::get_opt_bytes(row, 1)
                    .map_err(sql_error)?
                    .ok_or_else(|| corrupt("a finished step row has no result".into()))?;
                Abandoned::decode(Key::from_bytes(key), &input)
            })
            .collect()
    }

    /// [`Store::begin_steps`](idem_core::Store::begin_steps): one statement ([`begin_sql`]), the
    /// fenced count of the attempt with the live steps beside it.
    pub(crate) async fn begin<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        retention_ms: i64,
        took_over: bool,
    ) -> Result<StepLog, Error> {
        let token = claim.token().to_bytes();
        let key = &claim.key().as_bytes()[..];
        let query = DB::bind_bytes(DB::bind_bytes(sqlx::query(&self.begin), key), &token[..]);
        let query = DB::bind_bool(DB::bind_i64(query, kept_for(retention_ms)), took_over);
        let rows = DB::fetch_all(&mut *conn, query).await.map_err(sql_error)?;
        step_log::<DB>(&rows)?.ok_or(Error::LeaseLost)
    }

    /// [`Store::write_step`](idem_core::Store::write_step), on the store's pool or on the caller's
    /// transaction (a transactional step): one statement, and one read more when it wrote
    /// nothing, to tell a finished step (kept) from a claim taken over. A write with
    /// `on_lapse` sets the record's `uncertain` under the same fence: in the same statement
    /// on PostgreSQL; on SQLite by a statement before it, in one transaction (a savepoint in
    /// the caller's), rolled back if the fence fails.
    pub(crate) async fn write<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        step: StepWrite<'_>,
        retention_ms: i64,
    ) -> Result<(), Error> {
        if let (None, Some(result)) = (step.on_lapse, step.result)
            && !step.name.starts_with(RESERVED_PREFIX)
            && self
                .append::<DB>(conn, claim, &step, result, retention_ms)
                .await?
        {
            return Ok(());
        }
        let Some(on_lapse) = step.on_lapse else {
            return self
                .write_fenced::<DB>(conn, &self.write, None, claim, step, retention_ms)
                .await;
        };
        let uncertain = on_lapse == OnLapse::Uncertain;
        if let Some(sql) = &self.write_on_lapse {
            return self
                .write_fenced::<DB>(conn, sql, Some(uncertain), claim, step, retention_ms)
                .await;
        }
        let token = claim.token().to_bytes();
        let key = &claim.key().as_bytes()[..];
        let mut tx = conn.begin().await.map_err(sql_error)?;
        let query = DB::bind_bytes(
            DB::bind_bytes(sqlx::query(&self.set_on_lapse), key),
            &token[..],
        );
        if DB::execute(&mut *tx, DB::bind_bool(query, uncertain))
            .await
            .map_err(sql_error)?
            == 0
        {
            // Dropping `tx` rolls it back; it changed nothing.
            return Err(Error::LeaseLost);
        }
        self.write_fenced::<DB>(&mut tx, &self.write, None, claim, step, retention_ms)
            .await?;
        Ok(tx.commit().await.map_err(sql_error)?)
    }

    /// Appends the finished `step` to the journal of the claim's record: whether it did. It
    /// does not when the fence fails and when the entry would take the journal past
    /// [`JOURNAL_MAX_BYTES`]: the caller then writes a row of its own, which tells these apart.
    /// One statement.
    async fn append<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        step: &StepWrite<'_>,
        result: &[u8],
        retention_ms: i64,
    ) -> Result<bool, Error> {
        let Some(entry) = journal_entry(step.name, step.position, result)
            .filter(|entry| entry.len() <= JOURNAL_MAX_BYTES)
        else {
            return Ok(false);
        };
        let token = claim.token().to_bytes();
        let key = &claim.key().as_bytes()[..];
        let query = DB::bind_bytes(DB::bind_bytes(sqlx::query(&self.append), key), &token[..]);
        let query = DB::bind_i64(DB::bind_bytes(query, &entry), retention_ms);
        let query = DB::bind_i64(query, kept_for(retention_ms));
        Ok(DB::execute(conn, query).await.map_err(sql_error)? == 1)
    }

    /// Runs the step write `sql` (with the record's `uncertain` as `$8` when given), then, if it
    /// wrote nothing, reads whether the claim still holds its record.
    async fn write_fenced<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        sql: &str,
        uncertain: Option<bool>,
        claim: &Claim,
        step: StepWrite<'_>,
        retention_ms: i64,
    ) -> Result<(), Error> {
        let token = claim.token().to_bytes();
        let key = &claim.key().as_bytes()[..];
        let query = DB::bind_bytes(DB::bind_bytes(sqlx::query(sql), key), &token[..]);
        let query = DB::bind_i64(DB::bind_str(query, step.name), i64::from(step.position));
        let query = DB::bind_opt_bytes(DB::bind_bool(query, step.result.is_some()), step.result);
        let mut query = DB::bind_i64(query, retention_ms);
        if let Some(uncertain) = uncertain {
            query = DB::bind_bool(query, uncertain);
        }
        if DB::execute(&mut *conn, query).await.map_err(sql_error)? == 1 {
            return Ok(());
        }
        let query = DB::bind_bytes(DB::bind_bytes(sqlx::query(&self.holds), key), &token[..]);
        match DB::fetch_optional(conn, query).await.map_err(sql_error)? {
            // Still ours: the step had finished, and its first result stands.
            Some(_) => Ok(()),
            None => Err(Error::LeaseLost),
        }
    }

    /// Deletes the record of `key` with `evict_record` and its steps, in one transaction.
    pub(crate) async fn evict_with<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        key: &Key,
        evict_record: &str,
    ) -> Result<bool, Error> {
        let mut tx = conn.begin().await.map_err(sql_error)?;
        let query = DB::bind_bytes(sqlx::query(&self.evict), &key.as_bytes()[..]);
        DB::execute(&mut *tx, query).await.map_err(sql_error)?;
        let query = DB::bind_bytes(sqlx::query(evict_record), &key.as_bytes()[..]);
        let evicted = DB::execute(&mut *tx, query).await.map_err(sql_error)? > 0;
        tx.commit().await.map_err(sql_error)?;
        Ok(evicted)
    }

    /// Deletes up to `limit` step rows whose retention has ended; returns how many.
    pub(crate) async fn prune<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        limit: u32,
    ) -> Result<u64, Error> {
        let query = DB::bind_i64(sqlx::query(&self.prune), i64::from(limit));
        Ok(DB::execute(conn, query).await.map_err(sql_error)?)
    }
}

/// The statement that begins (or resumes) an operation's steps, fenced by `source` (a row `r`
/// with the operation's `key` and claim `token`, filtered by `condition`): one upsert into the
/// steps table `s` of the operation's attempt row (`''` at position -1: counted as the next
/// attempt unless this claim was the one counted last; when it is new, or had expired, it
/// counts `first`) and of its live steps (their retention moved on to `retention` from now,
/// nothing else changed). It returns those rows, each as `attempt, name, position, finished,
/// result, journal` ([`step_log`]); none when `source` has no row, so a claim that was taken
/// over moves nothing on. The attempt row's journal is emptied when its retention had ended (a
/// new life of the key). Its caller binds the retention as [`kept_for`] makes it. One statement
/// on both databases, as an `INSERT … SELECT` whose source reads the steps it updates.
pub(crate) fn begin_sql(
    d: &Dialect,
    s: &TableName,
    source: &str,
    condition: &str,
    retention: &str,
    first: &str,
) -> String {
    let (now, bigint, bytes) = (d.now, d.bigint, d.bytes);
    format!(
        "INSERT INTO {s} AS s (key, name, position, token, attempt, finished, result, expires_at, journal) \
         SELECT r.key, x.name, x.position, r.token, \
           CASE WHEN x.position < 0 THEN {first} ELSE x.attempt END, \
           x.finished, x.result, {until}, x.journal \
         FROM {source} CROSS JOIN ( \
           SELECT '' AS name, -1 AS position, 1 AS attempt, false AS finished, \
             CAST(NULL AS {bytes}) AS result, CAST('' AS {bytes}) AS journal \
           UNION ALL \
           SELECT p.name, p.position, p.attempt, p.finished, p.result, p.journal FROM {s} AS p \
           WHERE p.key = $1 AND p.position >= 0 AND p.expires_at > {now}) AS x \
         WHERE {condition} \
         ON CONFLICT (key, name) DO UPDATE SET \
           attempt = CASE WHEN s.position >= 0 THEN s.attempt \
                          WHEN s.expires_at <= {now} THEN excluded.attempt \
                          WHEN s.token = excluded.token THEN s.attempt \
                          ELSE s.attempt + 1 END, \
           token = CASE WHEN s.position >= 0 THEN s.token ELSE excluded.token END, \
           journal = CASE WHEN s.position < 0 AND s.expires_at <= {now} THEN excluded.journal \
                          ELSE s.journal END, \
           expires_at = excluded.expires_at \
         RETURNING CAST(attempt AS {bigint}), name, CAST(position AS {bigint}), finished, result, journal",
        until = d.now_plus(retention),
    )
}

/// Whether the record `r` (an alias) has a steps' journal that is still kept.
pub(crate) fn journal_kept(d: &Dialect, r: &str) -> String {
    format!(
        "({r}.journal IS NOT NULL AND {r}.journal_until > {now})",
        now = d.now
    )
}

/// `begin` (a [`begin_sql`] statement, fenced by the record `$1`, `$2`) followed by the journal
/// the claim's record keeps, as a row at position -2 ([`step_log`]), when it keeps one: the
/// entries of the attempts this claim took over. PostgreSQL: one statement, the begin in a
/// data-modifying CTE and the record read from the statement's snapshot (which the begin does
/// not change); SQLite: a second statement of the same query.
fn with_record_journal(d: &Dialect, t: &TableName, begin: &str) -> String {
    let (bigint, bytes) = (d.bigint, d.bytes);
    let journal = format!(
        "SELECT CAST(0 AS {bigint}), '', CAST(-2 AS {bigint}), false, CAST(NULL AS {bytes}), \
           r.journal FROM {t} AS r \
         WHERE r.key = $1 AND r.token = $2 AND r.state = 0 AND {kept}",
        kept = journal_kept(d, "r"),
    );
    if d.claim_reads_live {
        format!(
            "WITH b AS ({begin}) SELECT * FROM b UNION ALL {journal} AND EXISTS (SELECT 1 FROM b)"
        )
    } else {
        format!("{begin}; {journal}")
    }
}

/// The attempt an operation's new (or ended) `''` row counts, for a claim whose row is `r`
/// (`earlier`: whether it took over a claim in progress). A claim that found no live steps
/// rows began its steps without writing (see [`claim_steps_sql`]), so an attempt row can be
/// missing after a first attempt; what that attempt wrote is then under its own token. So 2
/// when `earlier` holds or live rows of the operation carry another claim's token, else 1.
fn first_attempt(d: &Dialect, s: &TableName, earlier: &str) -> String {
    format!(
        "CASE WHEN {earlier} OR EXISTS (SELECT 1 FROM {s} AS q \
           WHERE q.key = $1 AND q.expires_at > {now} AND q.token <> r.token) THEN 2 ELSE 1 END",
        now = d.now
    )
}

/// The query that claims an operation (`claim`, binding `$1` key, `$3` token) and tells,
/// when it claimed, whether its steps must be begun by a statement of their own
/// ([`ClaimedSteps`]): rows of `(kind, flag)`, kind 0 when the claim took over a claim in
/// progress (it had lapsed), kind 1, only when it claimed, with whether the key has live steps
/// rows.
///
/// A claim that found neither (a new operation, or one whose earlier attempts left nothing)
/// begins its steps without writing: attempt 1, no steps, as the hand-written recovery points'
/// claim writes the record alone; its finished steps go to its record's journal (the statement
/// `append`). Otherwise the store begins the steps with [`begin_sql`], one statement more,
/// counting the claim taken over (`$4` of `begin`), which reads the journal the record it took
/// over kept.
///
/// PostgreSQL: one statement, the claim in a data-modifying CTE; the claim in progress is read
/// from the statement's snapshot, before the claim (`o`). SQLite, which has no data-modifying
/// CTE: three statements in one query (one hand-over to the connection's thread), the read of
/// a claim this one may take over (lapsed, not uncertain), the claim, and the read of its row.
pub(crate) fn claim_steps_sql(d: &Dialect, t: &TableName, s: &TableName, claim: &str) -> String {
    let (now, bigint) = (d.now, d.bigint);
    let live = format!("EXISTS (SELECT 1 FROM {s} AS g WHERE g.key = $1 AND g.expires_at > {now})");
    if d.claim_reads_live {
        return format!(
            "WITH o AS (SELECT 1 FROM {t} WHERE key = $1 AND state = 0), \
             c AS ({claim} RETURNING r.key) \
             SELECT CAST(0 AS {bigint}), true FROM o WHERE EXISTS (SELECT 1 FROM c) \
             UNION ALL \
             SELECT CAST(1 AS {bigint}), {live} FROM c"
        );
    }
    let holds_key = crate::row::holds_key(d);
    format!(
        "SELECT 0, true FROM {t} AS r WHERE r.key = $1 AND r.state = 0 AND NOT {holds_key}; \
         {claim}; \
         SELECT 1, {live} FROM {t} AS r WHERE r.key = $1 AND r.token = $3 AND r.state = 0"
    )
}

/// What the rows of a [`claim_steps_sql`] query say, when it claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimedSteps {
    /// It took over a claim in progress: an attempt before this one.
    pub(crate) took_over: bool,
    /// The key has live steps rows.
    pub(crate) live: bool,
}

impl ClaimedSteps {
    /// `None` when the rows say it did not claim.
    pub(crate) fn of<DB: Ops>(rows: &[DB::Row]) -> Result<Option<ClaimedSteps>, Error> {
        let (mut took_over, mut claimed) = (false, None);
        for row in rows {
            let flag = DB::get_bool(row, 1).map_err(sql_error)?;
            match DB::get_i64(row, 0).map_err(sql_error)? {
                0 => took_over = true,
                _ => claimed = Some(flag),
            }
        }
        Ok(claimed.map(|live| ClaimedSteps { took_over, live }))
    }

    /// Whether the steps must be begun by a statement of their own.
    pub(crate) fn must_begin(self) -> bool {
        self.took_over || self.live
    }
}

/// The position of the row that carries the journal of the claim's record
/// ([`with_record_journal`]).
const RECORD_JOURNAL: i64 = -2;

/// The step log of a [`begin_sql`] statement's rows: the attempt and the journal from the row
/// at position -1, the steps from the others and the journal's entries, by position; `None`
/// for no row (the fence failed). A step both in a row of its own and in the journal keeps the
/// first result it had: the row's if it finished there (a row is only ever written before the
/// journal), else the journal's.
pub(crate) fn step_log<DB: Ops>(rows: &[DB::Row]) -> Result<Option<StepLog>, Error> {
    if rows.is_empty() {
        return Ok(None);
    }
    let mut begun = None;
    let mut record_journal = None;
    let mut steps = Vec::with_capacity(rows.len() - 1);
    for row in rows {
        match DB::get_i64(row, 2).map_err(sql_error)? {
            RECORD_JOURNAL => record_journal = Some(DB::get_bytes(row, 5).map_err(sql_error)?),
            position if position < 0 => {
                let attempt =
                    u32::try_from(DB::get_i64(row, 0).map_err(sql_error)?).map_err(|_| {
                        corrupt("a steps row counts more attempts than fit in 32 bits".into())
                    })?;
                begun = Some((attempt, DB::get_bytes(row, 5).map_err(sql_error)?));
            }
            _ => steps.push(step_record::<DB>(row, 1)?),
        }
    }
    let (attempt, journal) =
        begun.ok_or_else(|| corrupt("the steps begun have no attempt row".into()))?;
    // The `''` row's journal (schema version 4) is older than the record's: read first, so a
    // step in both keeps its first result.
    read_journal(&journal, &mut steps)?;
    if let Some(journal) = record_journal {
        read_journal(&journal, &mut steps)?;
    }
    steps.sort_by_key(|s| s.position);
    Ok(Some(StepLog { attempt, steps }))
}

/// How long, in milliseconds, the steps are kept when a statement moves their retention
/// (`retention_ms` from now) on: a little longer, by a 128th of it and at most a second, so
/// that the journal writes which follow within that time find their retention long enough
/// and leave it as it is.
pub(crate) fn kept_for(retention_ms: i64) -> i64 {
    retention_ms.saturating_add((retention_ms / 128).clamp(1, 1_000))
}

/// The longest a journal grows, in bytes: an entry that would take it past this is written as a
/// row of its own. Each entry rewrites the journal, so an operation of many steps with large
/// results costs rows of their own (each written once) rather than a journal rewritten whole
/// at every step.
const JOURNAL_MAX_BYTES: usize = 16 * 1024;

/// Names starting with this are idem's own records ([`INPUT_STEP`], the failure and
/// rerun marks): always rows of their own, which the completer's query reads.
const RESERVED_PREFIX: &str = "idem.";

/// A finished step as an entry of the journal: its position (4 bytes), its name's length (2)
/// and bytes, its result's length (4) and bytes, big-endian. `None` for a result too long to
/// count in 4 bytes (written as a row of its own instead).
pub(crate) fn journal_entry(name: &str, position: u32, result: &[u8]) -> Option<Vec<u8>> {
    let name_len = u16::try_from(name.len()).ok()?;
    let result_len = u32::try_from(result.len()).ok()?;
    let mut entry = Vec::with_capacity(10 + name.len() + result.len());
    entry.extend_from_slice(&position.to_be_bytes());
    entry.extend_from_slice(&name_len.to_be_bytes());
    entry.extend_from_slice(name.as_bytes());
    entry.extend_from_slice(&result_len.to_be_bytes());
    entry.extend_from_slice(result);
    Some(entry)
}

/// Adds the journal's entries to `steps`: a step not there is added, finished; one there that
/// only began is finished with the entry's result; one already finished keeps its result (the
/// first one stands, as when its row is written again).
fn read_journal(mut journal: &[u8], steps: &mut Vec<StepRecord>) -> Result<(), Error> {
    fn take<'a>(journal: &mut &'a [u8], n: usize) -> Result<&'a [u8], Error> {
        if journal.len() < n {
            return Err(corrupt("a steps journal ends inside an entry".into()));
        }
        let (head, rest) = journal.split_at(n);
        *journal = rest;
        Ok(head)
    }
    fn number<const N: usize>(journal: &mut &[u8]) -> Result<[u8; N], Error> {
        take(journal, N)?
            .try_into()
            .map_err(|_| corrupt("a steps journal ends inside an entry".into()))
    }
    while !journal.is_empty() {
        let position = u32::from_be_bytes(number(&mut journal)?);
        let name_len = usize::from(u16::from_be_bytes(number(&mut journal)?));
        let name = std::str::from_utf8(take(&mut journal, name_len)?)
            .map_err(|_| corrupt("a steps journal names a step in invalid UTF-8".into()))?;
        let result_len = usize::try_from(u32::from_be_bytes(number(&mut journal)?))
            .map_err(|_| corrupt("a steps journal's result is too long".into()))?;
        let result = take(&mut journal, result_len)?;
        match steps.iter_mut().find(|s| s.name == name) {
            Some(step) if matches!(step.state, StepState::Finished(_)) => {}
            Some(step) => {
                step.position = position;
                step.state = StepState::Finished(result.to_vec());
            }
            None => steps.push(StepRecord {
                name: name.to_owned(),
                position,
                state: StepState::Finished(result.to_vec()),
            }),
        }
    }
    Ok(())
}

/// A step's record from `row`'s columns `at..at + 4`: name, position, finished, result.
fn step_record<DB: Ops>(row: &DB::Row, at: usize) -> Result<StepRecord, Error> {
    let position = u32::try_from(DB::get_i64(row, at + 1).map_err(sql_error)?)
        .map_err(|_| corrupt("a step row has a negative position".into()))?;
    let state = match (
        DB::get_bool(row, at + 2).map_err(sql_error)?,
        DB::get_opt_bytes(row, at + 3).map_err(sql_error)?,
    ) {
        (true, Some(result)) => StepState::Finished(result),
        (true, None) => return Err(corrupt("a finished step row has no result".into())),
        (false, _) => StepState::Begun,
    };
    Ok(StepRecord {
        name: DB::get_string(row, at).map_err(sql_error)?,
        position,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(name: &str, position: u32, result: &[u8]) -> StepRecord {
        StepRecord {
            name: name.into(),
            position,
            state: StepState::Finished(result.to_vec()),
        }
    }

    #[test]
    fn idems_own_records_are_reserved() {
        assert!(INPUT_STEP.starts_with(RESERVED_PREFIX));
        assert!(FAILED_STEP_PREFIX.starts_with(RESERVED_PREFIX));
        assert!(idem_core::store::support::failed_step(3).starts_with(RESERVED_PREFIX));
    }

    #[test]
    fn a_journal_reads_back_its_entries_and_the_first_result_stands() {
        let mut journal = Vec::new();
        for (name, position, result) in [
            ("create", 0, &b"1"[..]),
            ("charge", 1, b""),
            ("create", 0, b"again"),
        ] {
            journal.extend(journal_entry(name, position, result).unwrap());
        }
        // A row of its own that began (an at-most-once step) is finished by the journal.
        let mut steps = vec![StepRecord {
            name: "charge".into(),
            position: 1,
            state: StepState::Begun,
        }];
        read_journal(&journal, &mut steps).unwrap();
        assert_eq!(
            steps,
            [finished("charge", 1, b""), finished("create", 0, b"1")]
        );
        // A row of its own that finished keeps its result.
        let mut steps = vec![finished("create", 0, b"row")];
        read_journal(&journal, &mut steps).unwrap();
        assert_eq!(steps[0], finished("create", 0, b"row"));
    }

    #[test]
    fn a_cut_journal_is_corrupt_not_a_shorter_log() {
        let entry = journal_entry("charge", 2, b"receipt").unwrap();
        for cut in 1..entry.len() {
            let err = read_journal(&entry[..cut], &mut Vec::new()).unwrap_err();
            assert!(err.to_string().contains("journal"), "{err}");
        }
        let mut bad_name = entry.clone();
        bad_name[6] = 0xff;
        assert!(read_journal(&bad_name, &mut Vec::new()).is_err());
    }

    #[test]
    fn the_retention_is_kept_a_little_longer_at_most_a_second() {
        assert_eq!(kept_for(100), 101);
        assert_eq!(kept_for(300), 302);
        assert_eq!(kept_for(12_800), 12_900);
        assert_eq!(kept_for(86_400_000), 86_401_000);
        assert_eq!(kept_for(i64::MAX), i64::MAX);
    }
}
