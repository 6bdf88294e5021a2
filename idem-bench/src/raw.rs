//! The baseline: the statements a user would write by hand instead of using idem, run with raw
//! sqlx on the store's own pool against a table of the store's schema at version 1 (its records
//! table and expiry index, made by the store's own script under another name: [`version_1`]).

use sqlx::{PgPool, Row, SqlitePool};

use crate::harness::Hit;
use crate::workload::{work, Receipt, LEASE, RETENTION};
use crate::BenchError;

/// Raw statements on one backend.
#[derive(Clone)]
pub enum Raw {
    Sqlite {
        pool: SqlitePool,
        sql: Statements,
    },
    Postgres {
        pool: PgPool,
        sql: Statements,
    },
    /// DynamoDB's requests, written by hand in `dynamo.rs`.
    Dynamo(crate::dynamo::RawDynamo),
    /// Redis commands, written by hand in `redis_rows.rs`.
    Redis(crate::redis_rows::RawRedis),
}

/// The statement helpers below are SQL's; DynamoDB's and Redis's baselines dispatch before them.
fn not_sql() -> BenchError {
    BenchError::Unexpected("a SQL statement on a key-value baseline".into())
}

/// The three statements, rendered for one table.
#[derive(Clone)]
pub struct Statements {
    /// Takes a new key: `INSERT … ON CONFLICT (key) DO NOTHING`.
    insert: String,
    /// Stores the result: `UPDATE … WHERE key AND token AND state = 0`.
    update: String,
    /// Reads a stored result by primary key.
    select: String,
    /// Notes a recovery point of a claimed key: `UPDATE … SET response WHERE key AND token AND
    /// state = 0`, the state left in progress.
    checkpoint: String,
    /// A lease or retention in the unit the statements add to the database's clock.
    ticks: fn(std::time::Duration) -> i64,
}

impl Statements {
    pub fn sqlite(table: &str) -> Statements {
        const NOW: &str = "CAST(round(unixepoch('subsec') * 1000) AS INTEGER)";
        Statements {
            insert: format!(
                "INSERT INTO \"{table}\" (key, fingerprint, token, state, expires_at, response, is_error) \
                 VALUES (?1, NULL, ?2, 0, {NOW} + ?3, NULL, 0) ON CONFLICT (key) DO NOTHING"
            ),
            update: format!(
                "UPDATE \"{table}\" SET state = 1, response = ?3, is_error = 0, expires_at = {NOW} + ?4 \
                 WHERE key = ?1 AND token = ?2 AND state = 0"
            ),
            select: format!(
                "SELECT state, response FROM \"{table}\" WHERE key = ?1 AND expires_at > {NOW}"
            ),
            checkpoint: format!(
                "UPDATE \"{table}\" SET response = ?3 WHERE key = ?1 AND token = ?2 AND state = 0"
            ),
            ticks: millis,
        }
    }

    pub fn postgres(table: &str) -> Statements {
        // `$n` microseconds from now.
        let after =
            |n: u8| format!("clock_timestamp() + ${n}::bigint::float8 * interval '1 microsecond'");
        Statements {
            insert: format!(
                "INSERT INTO \"{table}\" (key, fingerprint, token, state, expires_at, response, is_error) \
                 VALUES ($1, NULL, $2, 0, {}, NULL, false) \
                 ON CONFLICT (key) DO NOTHING",
                after(3)
            ),
            update: format!(
                "UPDATE \"{table}\" SET state = 1, response = $3, is_error = false, expires_at = {} \
                 WHERE key = $1 AND token = $2 AND state = 0",
                after(4)
            ),
            select: format!(
                "SELECT state, response FROM \"{table}\" WHERE key = $1 AND expires_at > clock_timestamp()"
            ),
            checkpoint: format!(
                "UPDATE \"{table}\" SET response = $3 WHERE key = $1 AND token = $2 AND state = 0"
            ),
            ticks: micros,
        }
    }
}

/// The part of a SQL store's schema script (`schema_sql()`) up to version 2: the records table
/// and its expiry index, what a hand-written table of these statements would have too. The
/// later versions' columns and indexes serve idem's own statements; the pruner's index of
/// version 6 is on expressions of `response`, which the recovery points' `UPDATE` sets, so on
/// it the baseline would pay for an index it does not use.
pub fn version_1(script: &str) -> Result<&str, BenchError> {
    match script.find("\n-- Version 2:") {
        Some(end) => Ok(&script[..end]),
        None => Err(BenchError::Unexpected(
            "the store's schema script has no version 2".into(),
        )),
    }
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Runs the statement `$name` of a SQL baseline's [`Statements`] on its pool, with the arguments
/// `$bind` binds on `$query` (`$sql` names the statements, for their units), and gives the
/// number of rows it changed; a key-value baseline fails with [`not_sql`].
macro_rules! execute {
    ($raw:expr, $name:ident, |$query:ident, $sql:ident| $bind:expr) => {
        match $raw {
            Raw::Sqlite { pool, sql: $sql } => {
                let $query = sqlx::query(&$sql.$name);
                $bind.execute(pool).await?.rows_affected()
            }
            Raw::Postgres { pool, sql: $sql } => {
                let $query = sqlx::query(&$sql.$name);
                $bind.execute(pool).await?.rows_affected()
            }
            Raw::Dynamo(_) | Raw::Redis(_) => return Err(not_sql()),
        }
    };
}

/// `Ok` when a fenced statement changed its one row, else the error that says `what` did not.
fn one_row(rows: u64, what: &str) -> Result<(), BenchError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(BenchError::Unexpected(format!("{what} changed no row")))
    }
}

impl Raw {
    /// Inserts `key` as in progress; whether this call took it.
    async fn insert(&self, key: &[u8; 32], token: &[u8; 16]) -> Result<bool, BenchError> {
        let rows = execute!(self, insert, |query, sql| query
            .bind(&key[..])
            .bind(&token[..])
            .bind((sql.ticks)(LEASE)));
        Ok(rows == 1)
    }

    /// Stores `response` for the key we inserted with `token`.
    pub async fn update(
        &self,
        key: &[u8; 32],
        token: &[u8; 16],
        response: &[u8],
    ) -> Result<(), BenchError> {
        let rows = execute!(self, update, |query, sql| query
            .bind(&key[..])
            .bind(&token[..])
            .bind(response)
            .bind((sql.ticks)(RETENTION)));
        one_row(rows, "raw UPDATE")
    }

    /// The stored state and response of `key`, if live.
    async fn select(&self, key: &[u8; 32]) -> Result<Option<(i64, Option<Vec<u8>>)>, BenchError> {
        Ok(match self {
            Raw::Sqlite { pool, sql } => sqlx::query(&sql.select)
                .bind(&key[..])
                .fetch_optional(pool)
                .await?
                .map(|row| Ok::<_, sqlx::Error>((row.try_get(0)?, row.try_get(1)?)))
                .transpose()?,
            Raw::Postgres { pool, sql } => sqlx::query(&sql.select)
                .bind(&key[..])
                .fetch_optional(pool)
                .await?
                .map(|row| {
                    Ok::<_, sqlx::Error>((i64::from(row.try_get::<i16, _>(0)?), row.try_get(1)?))
                })
                .transpose()?,
            Raw::Dynamo(_) | Raw::Redis(_) => return Err(not_sql()),
        })
    }

    /// Claims a new key the hand-written way (one INSERT); the token that fences its updates.
    pub async fn claim(&self, key: &[u8; 32]) -> Result<[u8; 16], BenchError> {
        let token: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        if self.insert(key, &token).await? {
            Ok(token)
        } else {
            Err(BenchError::Unexpected(
                "raw INSERT found the key taken".into(),
            ))
        }
    }

    /// Notes `point` on the claimed key's row, fenced by its token (one UPDATE).
    pub async fn checkpoint(
        &self,
        key: &[u8; 32],
        token: &[u8; 16],
        point: &[u8],
    ) -> Result<(), BenchError> {
        let rows = execute!(self, checkpoint, |query, _sql| query
            .bind(&key[..])
            .bind(&token[..])
            .bind(point));
        one_row(rows, "raw recovery point")
    }

    /// Insert, trivial work, update: a new key the hand-written way (two statements).
    pub async fn fresh(&self, key: &[u8; 32], seed: u64) -> Result<Hit, BenchError> {
        match self {
            Raw::Dynamo(d) => return d.fresh(key, seed).await,
            Raw::Redis(r) => return r.fresh(key, seed).await,
            _ => {}
        }
        let token = self.claim(key).await?;
        let response = serde_json::to_vec(&work(seed))?;
        self.update(key, &token, &response).await?;
        Ok(Hit::Fresh)
    }

    /// One SELECT by primary key, decoding the stored response (one statement).
    pub async fn replay(&self, key: &[u8; 32]) -> Result<Hit, BenchError> {
        match self {
            Raw::Dynamo(d) => return d.replay(key).await,
            Raw::Redis(r) => return r.replay(key).await,
            _ => {}
        }
        match self.select(key).await? {
            Some((1, Some(bytes))) => {
                let _: Receipt = serde_json::from_slice(&bytes)?;
                Ok(Hit::Replayed)
            }
            _ => Err(BenchError::Unexpected(
                "raw SELECT found no stored result".into(),
            )),
        }
    }

    /// Claim or read: insert; on a new key run and update, otherwise read what is there.
    pub async fn storm(&self, key: &[u8; 32], seed: u64) -> Result<Hit, BenchError> {
        match self {
            Raw::Dynamo(d) => return d.storm(key, seed).await,
            Raw::Redis(r) => return r.storm(key, seed).await,
            _ => {}
        }
        let respond = || Ok(serde_json::to_vec(&work(seed))?);
        Ok(match self.claim_or_read(key, respond).await? {
            ByHand::Fresh(_) => Hit::Fresh,
            ByHand::Replayed(bytes) => {
                let _: Receipt = serde_json::from_slice(&bytes)?;
                Hit::Replayed
            }
            ByHand::Locked => Hit::Locked,
        })
    }

    /// A key handled by hand, with SQL statements only: `INSERT` it; if it is new, `respond`
    /// and `UPDATE` the key with the response (two statements in all), otherwise read what is
    /// stored (one `SELECT`).
    pub async fn claim_or_read(
        &self,
        key: &[u8; 32],
        respond: impl FnOnce() -> Result<Vec<u8>, BenchError>,
    ) -> Result<ByHand, BenchError> {
        let token: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        if self.insert(key, &token).await? {
            let response = respond()?;
            self.update(key, &token, &response).await?;
            return Ok(ByHand::Fresh(response));
        }
        Ok(match self.select(key).await? {
            Some((1, Some(bytes))) => ByHand::Replayed(bytes),
            _ => ByHand::Locked,
        })
    }
}

/// What [`Raw::claim_or_read`] did with a key.
pub enum ByHand {
    /// The key was new: the response made and stored.
    Fresh(Vec<u8>),
    /// The key's stored response.
    Replayed(Vec<u8>),
    /// The key is there without a response: in progress (or past its retention, unpruned).
    Locked,
}
