//! A result as it is stored: encoded, sealed in its envelope, and replayed.

use crate::envelope;
use crate::error::{BoxError, Error};
use crate::key::Key;
use crate::record::Cached;

use super::Outcome;

/// A result as the engine is about to store it.
pub(crate) enum Encoded {
    /// The encoded value.
    Bytes(Vec<u8>),
    /// The value cannot be stored (it could not be captured or encoded); why.
    NotRetained(String),
}

impl From<Result<Vec<u8>, BoxError>> for Encoded {
    fn from(encoded: Result<Vec<u8>, BoxError>) -> Encoded {
        match encoded {
            Ok(bytes) => Encoded::Bytes(bytes),
            Err(e) => Encoded::NotRetained(format!("encoding it failed: {e}")),
        }
    }
}

/// The stored form of a result: its bytes in a checksummed envelope, or the note that it was not
/// retained (too large, not encodable, not capturable), so a retry is told instead of running
/// the work again.
pub(crate) fn seal(encoded: Encoded, limit: usize, key: &Key) -> Vec<u8> {
    let reason = match encoded {
        Encoded::Bytes(bytes) if bytes.len() <= limit => return envelope::result(&bytes),
        Encoded::Bytes(bytes) => format!(
            "it is {} bytes, more than max_response_bytes ({limit})",
            bytes.len()
        ),
        Encoded::NotRetained(reason) => reason,
    };
    tracing::warn!(%key, %reason, "the result is not retained; a retry gets ResultNotRetained and the work does not run again");
    envelope::not_retained(&reason)
}

/// What a stored record replays as: the decoded value, the stored error, or the news that the
/// result was not retained.
pub(crate) fn replay<T, E: From<Error>>(
    cached: Cached,
    decode_ok: impl FnOnce(&[u8]) -> Result<T, BoxError>,
    replay_err: impl FnOnce(Vec<u8>) -> E,
) -> Result<Outcome<T>, E> {
    let is_error = cached.is_error;
    let bytes = cached.result()?;
    if is_error {
        return Err(replay_err(bytes.to_vec()));
    }
    match decode_ok(bytes) {
        Ok(value) => Ok(Outcome::Replayed(value)),
        Err(e) => Err(Error::Codec(e).into()),
    }
}
