//! Diom's names and numbers checked as Diom checks them, and mapped onto idem's keys: a key is
//! `(namespace, caller's key space, client key)` (docs/server.md, "Key spaces").

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::Duration;

use idem_core::{Fingerprint, Key, Token, MAX_KEY_LEN};
use idem_wire::hex;
use idem_wire::names::{key_refusal, namespace_refusal};
use sha2::{Digest, Sha256};

use crate::auth::Caller;
use crate::wire::ApiError;

/// The longest lock period or retention: the stores' bound.
const MAX_PERIOD: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A Diom key: 1 to 256 of `[a-zA-Z0-9-/_.=+:]`; refused at `key` in Diom's words.
pub fn check_key(key: &str) -> Result<(), ApiError> {
    key_refusal(key).map_or(Ok(()), |why| Err(ApiError::invalid("key", why)))
}

/// A Diom namespace name: 1 to 256 of `[a-zA-Z0-9-/_.=+]`; refused at `location` in Diom's
/// words.
pub fn check_namespace(name: &str, location: &str) -> Result<(), ApiError> {
    namespace_refusal(name).map_or(Ok(()), |why| Err(ApiError::invalid(location, why)))
}

/// A name as one part of an idem key: itself when it fits (255 bytes), else `#` and its SHA-256
/// in hex, which no Diom name can be (`#` is not in their alphabet).
pub fn part(name: &str) -> Cow<'_, str> {
    if name.len() <= MAX_KEY_LEN {
        return Cow::Borrowed(name);
    }
    let mut hashed = String::with_capacity(65);
    hashed.push('#');
    for b in Sha256::digest(name.as_bytes()) {
        let _ = write!(hashed, "{b:02x}");
    }
    Cow::Owned(hashed)
}

/// The idem key of `caller`'s `key` in the namespace whose scope is `scope`.
pub fn key_of(scope: &str, caller: &Caller, key: &str) -> Result<Key, ApiError> {
    check_key(key)?;
    Key::derive(scope, &caller.key_space(), &part(key)).map_err(|e| ApiError::invalid("key", e))
}

/// A lock period or retention in milliseconds: 1 ms to 10 years.
pub fn period(ms: u64, location: &str) -> Result<Duration, ApiError> {
    let d = Duration::from_millis(ms);
    if ms == 0 || d > MAX_PERIOD {
        return Err(ApiError::invalid(
            location,
            format!(
                "must be between 1 and {} milliseconds, got {ms}",
                MAX_PERIOD.as_millis()
            ),
        ));
    }
    Ok(d)
}

/// A claim token as the fenced extension sends it: 32 hexadecimal digits.
pub fn token_text(token: Token) -> String {
    hex::encode(&token.to_bytes())
}

/// A claim token from its text.
pub fn parse_token(text: &str) -> Result<Token, ApiError> {
    hex::decode::<16>(text)
        .map(Token::from_bytes)
        .ok_or_else(|| {
            ApiError::invalid(
                "token",
                "a token is the 32 hexadecimal digits `start` returned",
            )
        })
}

/// A fingerprint given as its SHA-256 (`fingerprint_sha256`): 64 hexadecimal digits.
///
/// ```
/// use idem_server::keys::parse_fingerprint_sha256;
/// let f = idem_core::Fingerprint::of_bytes(b"POST /charge");
/// assert_eq!(parse_fingerprint_sha256(&idem_wire::hex::encode(f.as_bytes())).unwrap(), f);
/// assert_eq!(parse_fingerprint_sha256("ab").unwrap_err().body.location.as_deref(), Some("fingerprint_sha256"));
/// ```
pub fn parse_fingerprint_sha256(text: &str) -> Result<Fingerprint, ApiError> {
    hex::decode::<32>(text)
        .map(Fingerprint::from_bytes)
        .ok_or_else(|| {
            ApiError::invalid(
                "fingerprint_sha256",
                "a fingerprint's SHA-256 is 64 hexadecimal digits",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diom_keys_and_names_are_checked_as_diom_does() {
        for ok in ["foo", "foo/bar:baz", ":baz", "foo/+==", &"k".repeat(256)] {
            assert!(check_key(ok).is_ok(), "{ok}");
        }
        for bad in ["", "foo bar", "foo&bar", "foo\\bar", "é", &"k".repeat(257)] {
            let e = check_key(bad).unwrap_err();
            assert_eq!(
                (
                    e.status.as_u16(),
                    e.body.code.as_str(),
                    e.body.location.as_deref()
                ),
                (422, "invalid_data", Some("key"))
            );
        }
        assert_eq!(check_key("").unwrap_err().body.detail, "String too short");
        assert_eq!(
            check_key(&"k".repeat(257)).unwrap_err().body.detail,
            "String too long"
        );
        assert_eq!(
            check_namespace("a:b", "namespace").unwrap_err().body.detail,
            r"NamespaceName must match the following pattern: ^[a-zA-Z0-9\-/_.=+:]+$."
        );
    }

    #[test]
    fn long_names_map_to_a_hash_no_name_can_be() {
        let long = "k".repeat(256);
        let mapped = part(&long);
        assert!(mapped.starts_with('#') && mapped.len() == 65);
        assert_ne!(part(&"k".repeat(255)), mapped);
        let a = key_of("ns", &Caller::Admin, &long).unwrap();
        let b = key_of("ns", &Caller::Named("x".into()), &long).unwrap();
        assert_ne!(a, b, "callers have key spaces of their own");
    }

    #[test]
    fn tokens_round_trip_and_bad_ones_are_invalid_input() {
        let t = Token::random();
        assert_eq!(parse_token(&token_text(t)).unwrap(), t);
        for bad in ["", "zz", &"g".repeat(32), &"é".repeat(16)] {
            assert_eq!(parse_token(bad).unwrap_err().status, 422);
        }
    }

    #[test]
    fn periods_are_one_millisecond_to_ten_years() {
        assert!(period(0, "lock_period_ms").is_err());
        assert!(period(u64::MAX, "ttl_ms").is_err());
        assert_eq!(period(1, "x").unwrap(), Duration::from_millis(1));
    }
}
