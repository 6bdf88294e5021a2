//! The canonical form that request fingerprints hash, written two ways: from a `Serialize` value
//! ([`to_canonical`], behind [`Fingerprint::of_json`](crate::Fingerprint::of_json), whose docs
//! give the form) and from JSON text (`text`, behind the HTTP layer's JSON body fingerprints).
//!
//! Both write the same grammar, compact JSON with sorted keys and a few extensions, so it is
//! decodable: two different values never share bytes.

mod ser;
pub(crate) mod text;

pub(crate) use ser::{struct_to_canonical, to_canonical, DynSerialize};

use std::fmt;

/// How deep a fingerprinted value may nest: arrays, objects, structs, tuples, enum variants
/// with data, `Some` and newtype wrappers count one level each.
///
/// The bound keeps a hostile or runaway payload from exhausting the stack. A deeper value gets
/// [`FingerprintError::TooDeep`] from [`Fingerprint::of_json`](crate::Fingerprint::of_json); a deeper HTTP body counts by its
/// bytes. serde_json's parser stops at about the same depth, so a value it reads fits.
///
/// ```
/// use idem::{Fingerprint, FingerprintError, MAX_FINGERPRINT_DEPTH};
/// let mut deep = serde_json::json!(0);
/// for _ in 0..MAX_FINGERPRINT_DEPTH {
///     deep = serde_json::json!([deep]);
/// }
/// assert!(Fingerprint::of_json(&deep).is_ok());
/// let deeper = serde_json::json!([deep]);
/// assert_eq!(
///     Fingerprint::of_json(&deeper),
///     Err(FingerprintError::TooDeep { limit: MAX_FINGERPRINT_DEPTH })
/// );
/// ```
pub const MAX_FINGERPRINT_DEPTH: usize = 128;

/// Why a value could not be fingerprinted.
///
/// ```
/// use idem::{Fingerprint, FingerprintError};
/// struct Broken;
/// impl serde::Serialize for Broken {
///     fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
///         Err(serde::ser::Error::custom("lock poisoned"))
///     }
/// }
/// assert_eq!(
///     Fingerprint::of_json(&Broken),
///     Err(FingerprintError::Serialize("lock poisoned".into()))
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// The value nests deeper than [`MAX_FINGERPRINT_DEPTH`] levels.
    #[error("the value nests more than {limit} levels deep; fingerprint a flatter view of the request, such as the fields that identify it")]
    TooDeep {
        /// The bound, [`MAX_FINGERPRINT_DEPTH`].
        limit: usize,
    },
    /// The value's `Serialize` implementation reported this error.
    #[error("the value's Serialize implementation failed: {0}")]
    Serialize(String),
}

impl serde::ser::Error for FingerprintError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        FingerprintError::Serialize(msg.to_string())
    }
}

/// The depth of a value nested one level inside a value at `depth`, if within the bound.
fn enter(depth: usize) -> Result<usize, FingerprintError> {
    if depth < MAX_FINGERPRINT_DEPTH {
        Ok(depth + 1)
    } else {
        Err(FingerprintError::TooDeep {
            limit: MAX_FINGERPRINT_DEPTH,
        })
    }
}

/// Writes `s` as a JSON string, escaped as serde_json escapes it (`"`, `\` and control
/// characters only), so that struct fields and JSON object keys come out alike.
fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x08 => b'b',
            0x0c => b'f',
            0..=0x1f => b'u',
            _ => continue,
        };
        out.extend_from_slice(&s.as_bytes()[run..i]);
        out.extend_from_slice(&[b'\\', short]);
        if short == b'u' {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]);
        }
        run = i + 1;
    }
    out.extend_from_slice(&s.as_bytes()[run..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_escape_as_serde_json_does() {
        let all: String = (0u8..0x80).map(char::from).chain("é€😀".chars()).collect();
        for s in ["", "plain", "q\"b\\s/", "\u{7f}", all.as_str()] {
            let mut out = Vec::new();
            write_str(&mut out, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }
}
