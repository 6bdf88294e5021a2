//! A result as it is stored: encoded, sealed in its envelope, and replayed.

use crate::envelope;
use crate::error::{BoxError, Error};
use crate::key::Key;
use crate::observe::Stage;
use crate::record::StoredResult;

use super::Outcome;

/// A result as the engine is about to store it.
pub enum Encoded {
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
/// retained (too large for the policy's `limit` or for what the store keeps in a record, not
/// encodable, not capturable), so a retry is told instead of running the work again. The engine
/// alone writes the note: a store with a limit says so ([`Store::max_response_bytes`]) and is
/// never handed more.
///
/// [`Store::max_response_bytes`]: crate::Store::max_response_bytes
pub(crate) fn seal(
    encoded: Encoded,
    limit: usize,
    store_limit: Option<usize>,
    key: &Key,
) -> Sealed {
    let reason = match encoded {
        Encoded::Bytes(bytes) if bytes.len() > limit => format!(
            "it is {} bytes, more than max_response_bytes ({limit})",
            bytes.len()
        ),
        Encoded::Bytes(bytes) => {
            let sealed = envelope::result(bytes);
            match store_limit {
                Some(most) if sealed.len() > most => format!(
                    "stored, it is {} bytes, more than the store keeps in a record ({most})",
                    sealed.len()
                ),
                _ => {
                    return Sealed {
                        bytes: sealed,
                        retained: true,
                    }
                }
            }
        }
        Encoded::NotRetained(reason) => reason,
    };
    tracing::warn!(%key, %reason, "the result is not retained; a retry gets ResultNotRetained and the work does not run again");
    // The note itself must fit the store: its reason is cut (at a character) if it would not.
    let room = store_limit.map_or(usize::MAX, |most| most.saturating_sub(envelope::HEAD));
    let mut end = reason.len().min(room);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Sealed {
        bytes: envelope::not_retained(&reason[..end]),
        retained: false,
    }
}

/// A result in its stored form.
pub(crate) struct Sealed {
    /// The envelope to store.
    pub(crate) bytes: Vec<u8>,
    /// Whether it holds the result (or only the note that the result was not retained).
    pub(crate) retained: bool,
}

/// What a stored record replays as: the decoded value, the stored error, or the news that the
/// result was not retained; and the call's outcome for the observers.
pub(crate) fn replay<T, E: From<Error>>(
    cached: StoredResult,
    decode_ok: impl FnOnce(&[u8]) -> Result<T, BoxError>,
    replay_err: impl FnOnce(Vec<u8>) -> E,
) -> (Stage, Result<Outcome<T>, E>) {
    let is_error = cached.is_error;
    let bytes = match cached.result() {
        Ok(bytes) => bytes,
        Err(e) => return (Stage::of_error(&e), Err(e.into())),
    };
    if is_error {
        return (Stage::Replayed, Err(replay_err(bytes.to_vec())));
    }
    match decode_ok(bytes) {
        Ok(value) => (Stage::Replayed, Ok(Outcome::Replayed(value))),
        Err(e) => (Stage::Failed, Err(Error::Codec(e).into())),
    }
}
