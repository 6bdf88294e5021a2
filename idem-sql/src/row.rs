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
/// times as microseconds (since the Unix epoch, and left until expiry), from the database's
/// clock, so SQLite's milliseconds and PostgreSQL's timestamps read alike.
pub(crate) fn columns(d: &Dialect) -> String {
    format!(
        "r.fingerprint, r.token, CAST(r.state AS {bigint}) AS state, r.response, r.is_error, \
         {expires} AS expires_us, {remaining} AS remaining_us",
        bigint = d.bigint,
        expires = d.micros_of("r.expires_at"),
        remaining = d.micros_of(&format!("r.expires_at - {}", d.now)),
    )
}

/// A live record row as read back, with the time it had left when read.
pub(crate) struct StoredRow {
    fingerprint: Option<Fingerprint>,
    token: Option<Token>,
    state: i64,
    response: Option<Vec<u8>>,
    is_error: bool,
    expires_us: i64,
    remaining_us: i64,
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
            expires_us: DB::get_i64(row, first + 5).map_err(sql_error)?,
            remaining_us: DB::get_i64(row, first + 6).map_err(sql_error)?,
        })
    }

    /// Whether the row still had time left when it was read.
    pub(crate) fn is_live(&self) -> bool {
        self.remaining_us > 0
    }

    fn expires_at(&self) -> Result<SystemTime, Error> {
        u64::try_from(self.expires_us)
            .map(|us| UNIX_EPOCH + Duration::from_micros(us))
            .map_err(|_| corrupt(format!("expires_at is {} µs, before 1970", self.expires_us)))
    }

    fn cached(self) -> Result<StoredResult, Error> {
        Ok(StoredResult {
            expires_at: self.expires_at()?,
            not_retained: None,
            response: self.response,
            is_error: self.is_error,
        })
    }

    /// What `start` answers for this live row that it did not claim.
    pub(crate) fn into_start(
        self,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<ClaimOutcome, Error> {
        check_fingerprint(self.fingerprint.as_ref(), fingerprint)?;
        match self.state {
            0 => Ok(ClaimOutcome::Locked {
                retry_after: Duration::from_micros(self.remaining_us.max(0).unsigned_abs()),
            }),
            1 => Ok(ClaimOutcome::Completed(self.cached()?)),
            s => Err(bad_state(s)),
        }
    }

    /// The record of `key` this row holds.
    pub(crate) fn into_record(self, key: Key) -> Result<Record, Error> {
        let fingerprint = self.fingerprint;
        let state = match (self.state, self.token) {
            (0, Some(token)) => RecordState::InProgress {
                token,
                lease_until: self.expires_at()?,
            },
            (0, None) => return Err(corrupt("token is NULL".to_owned())),
            (1, _) => RecordState::Completed(self.cached()?),
            (s, _) => return Err(bad_state(s)),
        };
        Ok(Record {
            key,
            fingerprint,
            state,
        })
    }
}

fn bad_state(state: i64) -> Error {
    corrupt(format!("state is {state}, expected 0 or 1"))
}

fn fixed<const N: usize>(what: &str, bytes: Vec<u8>) -> Result<[u8; N], Error> {
    <[u8; N]>::try_from(bytes.as_slice())
        .map_err(|_| corrupt(format!("{what} is {} bytes, expected {N}", bytes.len())))
}
