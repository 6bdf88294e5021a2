//! The DynamoDB item of a record: its attribute names, how a record is written as one and read
//! back, its size as DynamoDB counts it, and the times it holds.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use idem_core::{
    Error, Fingerprint, Key, Record, RecordState, StoreError, StoreErrorKind, StoredResult, Token,
};

/// The partition key: the record's key as 64 lowercase hex digits.
pub(crate) const PK: &str = "pk";
/// The claim's fencing token, 16 bytes.
pub(crate) const TOKEN: &str = "token_b";
/// The request's fingerprint, 32 bytes, when one was given.
pub(crate) const FINGERPRINT: &str = "fingerprint_b";
/// 0 in progress, 1 completed, 2 a tombstone whose response `prune_expired` dropped.
pub(crate) const STATE: &str = "state_n";
/// Lease end (in progress), or the end of a completed record: its retention's, or its
/// tombstone's when it has one; in milliseconds since the epoch, on the writing node's clock.
pub(crate) const EXPIRES: &str = "expires_ms";
/// The retention's end of a completion with a tombstone (its `key_retention`, in whole
/// seconds, is `expires_ms` less this), in milliseconds since the epoch.
pub(crate) const RETAINED: &str = "retained_ms";
/// `true` on a claim that becomes uncertain if its lease ends
/// ([`OnLapse::Uncertain`](idem_core::OnLapse::Uncertain)); absent otherwise.
pub(crate) const UNCERTAIN: &str = "uncertain";
/// A running claim's `ttl_s` as an ordinary claim: what `ttl_s` becomes again when a step
/// write sets an uncertain claim back to release.
pub(crate) const LAPSE_TTL: &str = "lapse_ttl_s";
/// The stored response, once completed with one.
pub(crate) const RESPONSE: &str = "response_b";
/// Whether the response is an error result.
pub(crate) const IS_ERROR: &str = "is_error";
/// DynamoDB's TTL attribute: seconds since the epoch after which DynamoDB may delete the item.
pub(crate) const TTL: &str = "ttl_s";

pub(crate) const IN_PROGRESS: &str = "0";
pub(crate) const COMPLETED: &str = "1";
pub(crate) const TOMBSTONE: &str = "2";

/// DynamoDB's limit on one item, 400 KB, counted as the UTF-8 length of every attribute name
/// plus the size of every value; taken as 400,000 bytes. AWS documents "400 KB" and takes up to
/// 409,600 in practice, but moto (the test server) refuses items over 405,000: the decimal
/// reading is under both, so an item the store admits is never refused.
pub(crate) const MAX_ITEM_BYTES: usize = 400_000;

/// The partition key value of `key`.
pub(crate) fn pk(key: &Key) -> AttributeValue {
    AttributeValue::S(key.to_string())
}

pub(crate) fn number(n: i64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

pub(crate) fn token(token: Token) -> AttributeValue {
    AttributeValue::B(Blob::new(token.to_bytes().to_vec()))
}

/// Milliseconds since the epoch (negative before it, which no sane clock gives).
pub(crate) fn millis(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// A duration in whole milliseconds, rounded up so a lease is never shorter than asked.
pub(crate) fn duration_millis(d: Duration) -> i64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    i64::try_from(ms).unwrap_or(i64::MAX)
}

pub(crate) fn time_of(ms: i64) -> SystemTime {
    if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}

/// The TTL attribute for a record that expires at `expires_ms` and may be taken over
/// `margin_ms` later: the first whole second after both, so DynamoDB never deletes an item that
/// any node within the skew margin still treats as live.
pub(crate) fn ttl_seconds(expires_ms: i64, margin_ms: i64) -> AttributeValue {
    let ms = expires_ms.saturating_add(margin_ms);
    number(ms.div_euclid(1000) + 1)
}

/// The largest response whose completed item fits in [`MAX_ITEM_BYTES`]: the store's
/// `max_response_bytes`.
pub(crate) fn max_response_bytes() -> usize {
    MAX_ITEM_BYTES - completed_size(0)
}

/// The size DynamoDB counts for a completed item with a response of `response` bytes: every
/// attribute name, the key, token, fingerprint and response bytes, and numbers at their largest
/// (21 bytes), with a tombstone's retention end. An overestimate by a few bytes at most, so an
/// item it admits is never refused.
pub(crate) fn completed_size(response: usize) -> usize {
    const NUMBER: usize = 21;
    PK.len()
        + 64
        + TOKEN.len()
        + 16
        + FINGERPRINT.len()
        + 32
        + STATE.len()
        + NUMBER
        + EXPIRES.len()
        + NUMBER
        + TTL.len()
        + NUMBER
        + RETAINED.len()
        + NUMBER
        + IS_ERROR.len()
        + 1
        + RESPONSE.len()
        + response
}

/// A stored item whose shape is wrong: the table holds something the store did not write.
pub(crate) fn corrupt(key: &Key, what: impl std::fmt::Display) -> Error {
    Error::Store(StoreError::new(
        StoreErrorKind::Corrupt,
        format!(
            "the DynamoDB item of key {key} is malformed ({what}); evict the key, or check that \
             nothing else writes to this table"
        ),
    ))
}

/// A stored item, decoded.
pub(crate) struct Item {
    pub(crate) token: Token,
    pub(crate) fingerprint: Option<Fingerprint>,
    pub(crate) expires_ms: i64,
    pub(crate) state: State,
}

pub(crate) enum State {
    InProgress {
        /// It becomes uncertain if its lease ends.
        uncertain: bool,
    },
    Completed {
        response: Option<Vec<u8>>,
        is_error: bool,
        /// The retention's end, when a tombstone follows it (`expires_ms` is then the
        /// tombstone's end).
        retained_ms: Option<i64>,
    },
    /// A completion past its retention whose response `prune_expired` dropped.
    Tombstone {
        /// The retention's end.
        retained_ms: i64,
    },
}

impl Item {
    /// Decodes the attributes DynamoDB returned (all of the item, or at least the token, state
    /// and expiry).
    pub(crate) fn decode(
        key: &Key,
        mut attrs: HashMap<String, AttributeValue>,
    ) -> Result<Item, Error> {
        let token = match attrs.remove(TOKEN) {
            Some(AttributeValue::B(b)) => <[u8; 16]>::try_from(b.as_ref())
                .map(Token::from_bytes)
                .map_err(|_| {
                corrupt(
                    key,
                    format_args!("token is {} bytes, not 16", b.as_ref().len()),
                )
            })?,
            _ => return Err(corrupt(key, "no binary token")),
        };
        let fingerprint = match attrs.remove(FINGERPRINT) {
            None | Some(AttributeValue::Null(_)) => None,
            Some(AttributeValue::B(b)) => Some(
                <[u8; 32]>::try_from(b.as_ref())
                    .map(Fingerprint::from_bytes)
                    .map_err(|_| corrupt(key, "fingerprint is not 32 bytes"))?,
            ),
            Some(_) => return Err(corrupt(key, "fingerprint is not binary")),
        };
        let expires_ms = match attrs.get(EXPIRES) {
            Some(AttributeValue::N(n)) => n
                .parse::<i64>()
                .map_err(|_| corrupt(key, format_args!("expiry `{n}` is not an integer")))?,
            _ => return Err(corrupt(key, "no numeric expiry")),
        };
        let retained_ms = match attrs.get(RETAINED) {
            None => None,
            Some(AttributeValue::N(n)) => Some(n.parse::<i64>().map_err(|_| {
                corrupt(key, format_args!("retention end `{n}` is not an integer"))
            })?),
            Some(_) => return Err(corrupt(key, "retention end is not a number")),
        };
        let state = match attrs.get(STATE) {
            Some(AttributeValue::N(n)) if n == IN_PROGRESS => State::InProgress {
                uncertain: match attrs.get(UNCERTAIN) {
                    None => false,
                    Some(AttributeValue::Bool(b)) => *b,
                    Some(_) => return Err(corrupt(key, "uncertain is not a boolean")),
                },
            },
            Some(AttributeValue::N(n)) if n == TOMBSTONE => State::Tombstone {
                retained_ms: retained_ms
                    .ok_or_else(|| corrupt(key, "a tombstone has no retention end"))?,
            },
            Some(AttributeValue::N(n)) if n == COMPLETED => State::Completed {
                response: match attrs.remove(RESPONSE) {
                    None | Some(AttributeValue::Null(_)) => None,
                    Some(AttributeValue::B(b)) => Some(b.into_inner()),
                    Some(_) => return Err(corrupt(key, "response is not binary")),
                },
                is_error: match attrs.get(IS_ERROR) {
                    None => false,
                    Some(AttributeValue::Bool(b)) => *b,
                    Some(_) => return Err(corrupt(key, "is_error is not a boolean")),
                },
                retained_ms,
            },
            Some(AttributeValue::N(n)) => {
                return Err(corrupt(key, format_args!("unknown state {n}")))
            }
            _ => return Err(corrupt(key, "no numeric state")),
        };
        Ok(Item {
            token,
            fingerprint,
            expires_ms,
            state,
        })
    }

    /// Whether the item still holds its key for a node whose clock, less the clock-skew
    /// margin, reads `cutoff_ms`: an uncertain claim always (lapsed or not), any other until
    /// its `expires_ms` (a lease, a retention, a tombstone).
    pub(crate) fn holds_key(&self, cutoff_ms: i64) -> bool {
        matches!(self.state, State::InProgress { uncertain: true }) || self.expires_ms > cutoff_ms
    }

    /// The record as `get` returns it, for an item that [holds its key](Self::holds_key) at
    /// `cutoff_ms`: a claim past its lease (and the margin) is uncertain; a completion past its
    /// retention (and the margin), or stripped of its response, is a tombstone.
    pub(crate) fn into_record(self, key: &Key, cutoff_ms: i64) -> Record {
        let state = match self.state {
            State::InProgress { .. } if self.expires_ms > cutoff_ms => RecordState::InProgress {
                token: self.token,
                lease_until: time_of(self.expires_ms),
            },
            State::InProgress { .. } => RecordState::Uncertain {
                token: self.token,
                since: time_of(self.expires_ms),
            },
            State::Tombstone { retained_ms } => RecordState::Expired {
                since: time_of(retained_ms),
            },
            State::Completed {
                retained_ms: Some(retained_ms),
                ..
            } if retained_ms <= cutoff_ms => RecordState::Expired {
                since: time_of(retained_ms),
            },
            State::Completed {
                response,
                is_error,
                retained_ms,
            } => RecordState::Completed(StoredResult {
                response,
                is_error,
                expires_at: time_of(retained_ms.unwrap_or(self.expires_ms)),
                not_retained: None,
            }),
        };
        Record {
            key: *key,
            fingerprint: self.fingerprint,
            state,
        }
    }

    /// Whether the item is a completion (with its response, or a tombstone without it).
    pub(crate) fn is_completed(&self) -> bool {
        !matches!(self.state, State::InProgress { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_and_round_up() {
        let t = UNIX_EPOCH + Duration::from_millis(1_893_456_000_123);
        assert_eq!(time_of(millis(t)), t);
        assert_eq!(duration_millis(Duration::from_micros(1500)), 2);
        assert_eq!(duration_millis(Duration::from_millis(300)), 300);
        assert_eq!(ttl_seconds(1_999, 0), AttributeValue::N("2".into()));
        assert_eq!(ttl_seconds(1_999, 1_000), AttributeValue::N("3".into()));
    }

    #[test]
    fn malformed_items_are_corrupt() {
        let key = Key::from_bytes([7; 32]);
        let mut attrs = HashMap::new();
        attrs.insert(
            TOKEN.to_owned(),
            AttributeValue::B(Blob::new(vec![1, 2, 3])),
        );
        let Err(Error::Store(e)) = Item::decode(&key, attrs) else {
            panic!("a 3-byte token is corrupt");
        };
        assert_eq!(e.kind(), StoreErrorKind::Corrupt);
        let mut attrs = HashMap::new();
        attrs.insert(TOKEN.to_owned(), token(Token::random()));
        attrs.insert(EXPIRES.to_owned(), number(5));
        attrs.insert(STATE.to_owned(), AttributeValue::N("7".into()));
        assert!(
            matches!(Item::decode(&key, attrs), Err(Error::Store(e)) if e.kind() == StoreErrorKind::Corrupt)
        );
    }
}
