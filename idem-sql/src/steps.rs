//! The steps of the SQL stores (docs/steps.md), written once for both databases: a table
//! `<table>_steps` beside the records, one row per (operation key, step name), and per
//! operation a row named `''` at position -1 that counts its attempts.
//!
//! Every write is one statement that selects the operation's record by key and token while it
//! is in progress (locking it for the statement on PostgreSQL, where SQLite's single writer
//! already serialises), so a claim that was taken over writes nothing: the step records are
//! fenced by the operation's claim, and live as long as its lease is renewed.

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
    /// Stores that a step began, or its result (fenced).
    write: String,
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
            begin: begin_sql(
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
            ),
            write: write_row(&fence),
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
                   SELECT key, name FROM {s} WHERE expires_at <= {now} \
                   ORDER BY expires_at LIMIT $1{lock_batch})",
                lock_batch = d.lock_batch,
            ),
            // No claim holds it (its record is gone, or running past its lease and not
            // uncertain: the completer never runs an uncertain operation again), it has not
            // completed, and its latest attempt (the '' row's count) was not marked failed.
            abandoned: format!(
                "SELECT s.key, s.result FROM {s} AS s \
                 JOIN {s} AS a ON a.key = s.key AND a.name = '' \
                 LEFT JOIN {t} AS r ON r.key = s.key \
                 WHERE s.name = '{INPUT_STEP}' AND s.finished = true AND s.expires_at > {now} \
                   AND (r.key IS NULL OR (r.state = 0 AND r.expires_at <= {now} \
                     AND r.uncertain = false)) \
                   AND NOT EXISTS (SELECT 1 FROM {s} AS f WHERE f.key = s.key \
                     AND f.name = '{FAILED_STEP_PREFIX}' || CAST(a.attempt AS TEXT)) \
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
    ) -> Result<StepLog, Error> {
        let token = claim.token().to_bytes();
        let key = &claim.key().as_bytes()[..];
        let query = DB::bind_bytes(DB::bind_bytes(sqlx::query(&self.begin), key), &token[..]);
        let rows = DB::fetch_all(&mut *conn, DB::bind_i64(query, retention_ms))
            .await
            .map_err(sql_error)?;
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
/// attempt unless this claim was the one counted last, or set to 1 when it had expired) and of
/// its live steps (their retention moved on to `retention` from now, nothing else changed).
/// It returns those rows, each as `attempt, name, position, finished, result` ([`step_log`]);
/// none when `source` has no row, so a claim that was taken over moves nothing on. One
/// statement on both databases, as an `INSERT … SELECT` whose source reads the steps it
/// updates.
pub(crate) fn begin_sql(
    d: &Dialect,
    s: &TableName,
    source: &str,
    condition: &str,
    retention: &str,
) -> String {
    let (now, bigint, bytes) = (d.now, d.bigint, d.bytes);
    format!(
        "INSERT INTO {s} AS s (key, name, position, token, attempt, finished, result, expires_at) \
         SELECT r.key, x.name, x.position, r.token, x.attempt, x.finished, x.result, {until} \
         FROM {source} CROSS JOIN ( \
           SELECT '' AS name, -1 AS position, 1 AS attempt, false AS finished, \
             CAST(NULL AS {bytes}) AS result \
           UNION ALL \
           SELECT p.name, p.position, p.attempt, p.finished, p.result FROM {s} AS p \
           WHERE p.key = $1 AND p.position >= 0 AND p.expires_at > {now}) AS x \
         WHERE {condition} \
         ON CONFLICT (key, name) DO UPDATE SET \
           attempt = CASE WHEN s.position >= 0 THEN s.attempt \
                          WHEN s.expires_at <= {now} THEN 1 \
                          WHEN s.token = excluded.token THEN s.attempt \
                          ELSE s.attempt + 1 END, \
           token = CASE WHEN s.position >= 0 THEN s.token ELSE excluded.token END, \
           expires_at = excluded.expires_at \
         RETURNING CAST(attempt AS {bigint}), name, CAST(position AS {bigint}), finished, result",
        until = d.now_plus(retention),
    )
}

/// The step log of a [`begin_sql`] statement's rows: the attempt from the row at position -1,
/// the steps from the others, by position; `None` for no row (the fence failed).
pub(crate) fn step_log<DB: Ops>(rows: &[DB::Row]) -> Result<Option<StepLog>, Error> {
    if rows.is_empty() {
        return Ok(None);
    }
    let mut attempt = None;
    let mut steps = Vec::with_capacity(rows.len() - 1);
    for row in rows {
        if DB::get_i64(row, 2).map_err(sql_error)? < 0 {
            attempt = Some(
                u32::try_from(DB::get_i64(row, 0).map_err(sql_error)?).map_err(|_| {
                    corrupt("a steps row counts more attempts than fit in 32 bits".into())
                })?,
            );
        } else {
            steps.push(step_record::<DB>(row, 1)?);
        }
    }
    let attempt = attempt.ok_or_else(|| corrupt("the steps begun have no attempt row".into()))?;
    steps.sort_by_key(|s| s.position);
    Ok(Some(StepLog { attempt, steps }))
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
