//! [`StoredRow`]: a record row as `start` and `get` read it back, on either database.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::corrupt;
use crate::dialect::{Dialect, Ops};
use crate::error::sql_error;
use idem_core::store::support::check_fingerprint;
use idem_core::Error;
use idem_core::{ClaimOutcome, Record, RecordState, StoredResult};
use idem_core::{Fingerprint, Key, Token};

/// The columns a [`StoredRow`] is decoded from, as `SELECT` expressions over the alias `r`:
/// times as microseconds since the Unix epoch, from the database's clock (the row's times and
/// the clock read once with them), so SQLite's milliseconds and PostgreSQL's timestamps read
/// alike. A row completed before schema version 3 has no `result_until`: its retention ends
/// with its `expires_at`.
pub(crate) fn columns(d: &Dialect) -> String {
    format!(
        "r.fingerprint, r.token, CAST(r.state AS {bigint}) AS state, r.response, r.is_error, \
         r.uncertain, {expires} AS expires_us, {result} AS result_us, {now} AS now_us",
        bigint = d.bigint,
        expires = d.micros_of("r.expires_at"),
        result = d.micros_of("coalesce(r.result_until, r.expires_at)"),
        now = d.micros_of(d.now),
    )
}

/// The condition, over the alias `r`, of a row that holds its key: its lease, tombstone or
/// retention runs, or it is a claim made with `OnLapse::Uncertain` (which no claim takes over,
/// lapsed or not). The claim statement takes over exactly the rows this leaves out.
pub(crate) fn holds_key(d: &Dialect) -> String {
    format!(
        "(r.expires_at > {now} OR (r.state = 0 AND r.uncertain = true))",
        now = d.now
    )
}

/// What a row that holds its key is, at the time it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A claim whose lease runs (or, read as its time ran out, one that lapsed: it is no longer
    /// live, and its reader reads again).
    Running,
    /// A claim made with `OnLapse::Uncertain` whose lease ended with no completion.
    Uncertain,
    /// Completed, its retention running.
    Completed,
    /// Completed, its retention over: a tombstone until `expires_at`.
    Expired,
}

/// A live record row as read back, with the database's clock when it was read.
pub(crate) struct StoredRow {
    fingerprint: Option<Fingerprint>,
    token: Option<Token>,
    state: i64,
    response: Option<Vec<u8>>,
    is_error: bool,
    uncertain: bool,
    expires_us: i64,
    result_us: i64,
    now_us: i64,
}

impl StoredRow {
    /// Decodes the [`columns`], starting at column `first`.
    pub(crate) fn decode<DB: Ops>(row: &DB::Row, first: usize) -> Result<StoredRow, Error> {
        let fingerprint = DB::get_opt_bytes(row, first)
            .map_err(sql_error)?
            .map(|b| fixed("fingerprint", b).map(Fingerprint::from_bytes))
            .transpose()?;
        let token = DB::get_opt_bytes(row, first + 1)
            .map_err(sql_error)?
            .map(|b| fixed("token", b).map(Token::from_bytes))
            .transpose()?;
        Ok(StoredRow {
            fingerprint,
            token,
            state: DB::get_i64(row, first + 2).map_err(sql_error)?,
            response: DB::get_opt_bytes(row, first + 3).map_err(sql_error)?,
            is_error: DB::get_bool(row, first + 4).map_err(sql_error)?,
            uncertain: DB::get_bool(row, first + 5).map_err(sql_error)?,
            expires_us: DB::get_i64(row, first + 6).map_err(sql_error)?,
            result_us: DB::get_i64(row, first + 7).map_err(sql_error)?,
            now_us: DB::get_i64(row, first + 8).map_err(sql_error)?,
        })
    }

    /// Whether the row still held its key when it was read ([`holds_key`]).
    pub(crate) fn is_live(&self) -> bool {
        self.expires_us > self.now_us || (self.state == 0 && self.uncertain)
    }

    fn phase(&self) -> Result<Phase, Error> {
        match self.state {
            0 if self.expires_us <= self.now_us && self.uncertain => Ok(Phase::Uncertain),
            0 => Ok(Phase::Running),
            1 if self.result_us > self.now_us => Ok(Phase::Completed),
            1 => Ok(Phase::Expired),
            s => Err(bad_state(s)),
        }
    }

    /// The row's `expires_at`: a claim's lease end, a completed record's key end.
    fn expires_at(&self) -> Result<SystemTime, Error> {
        time("expires_at", self.expires_us)
    }

    /// A completed row's retention end (`result_until`, or `expires_at` on a row completed
    /// before schema version 3).
    fn result_until(&self) -> Result<SystemTime, Error> {
        time("result_until", self.result_us)
    }

    fn cached(self) -> Result<StoredResult, Error> {
        Ok(StoredResult {
            expires_at: self.result_until()?,
            not_retained: None,
            response: self.response,
            is_error: self.is_error,
        })
    }

    /// What `start` answers for this live row that it did not claim: the fingerprint rule
    /// first ([`check_fingerprint`]), whatever the row's state.
    pub(crate) fn into_start(
        self,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<ClaimOutcome, Error> {
        check_fingerprint(self.fingerprint.as_ref(), fingerprint)?;
        Ok(match self.phase()? {
            Phase::Running => ClaimOutcome::Locked {
                retry_after: Duration::from_micros(
                    self.expires_us
                        .saturating_sub(self.now_us)
                        .max(0)
                        .unsigned_abs(),
                ),
            },
            Phase::Uncertain => ClaimOutcome::Uncertain {
                since: self.expires_at()?,
            },
            Phase::Completed => ClaimOutcome::Completed(self.cached()?),
            Phase::Expired => ClaimOutcome::Expired {
                since: self.result_until()?,
            },
        })
    }

    /// The record of `key` this row holds.
    pub(crate) fn into_record(self, key: Key) -> Result<Record, Error> {
        let fingerprint = self.fingerprint;
        let state = match (self.phase()?, self.token) {
            (Phase::Running, Some(token)) => RecordState::InProgress {
                token,
                lease_until: self.expires_at()?,
            },
            (Phase::Uncertain, Some(token)) => RecordState::Uncertain {
                token,
                since: self.expires_at()?,
            },
            (Phase::Running | Phase::Uncertain, None) => {
                return Err(corrupt("token is NULL".to_owned()))
            }
            (Phase::Completed, _) => RecordState::Completed(self.cached()?),
            (Phase::Expired, _) => RecordState::Expired {
                since: self.result_until()?,
            },
        };
        Ok(Record {
            key,
            fingerprint,
            state,
        })
    }
}

/// A time read as microseconds since the Unix epoch.
pub(crate) fn time(what: &str, us: i64) -> Result<SystemTime, Error> {
    u64::try_from(us)
        .map(|us| UNIX_EPOCH + Duration::from_micros(us))
        .map_err(|_| corrupt(format!("{what} is {us} µs, before 1970")))
}

fn bad_state(state: i64) -> Error {
    corrupt(format!("state is {state}, expected 0 or 1"))
}

fn fixed<const N: usize>(what: &str, bytes: Vec<u8>) -> Result<[u8; N], Error> {
    <[u8; N]>::try_from(bytes.as_slice())
        .map_err(|_| corrupt(format!("{what} is {} bytes, expected {N}", bytes.len())))
}
