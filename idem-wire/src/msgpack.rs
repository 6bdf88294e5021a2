//! MessagePack as idem-server and Diom's clients write it: maps with field names (rmp-serde's
//! `to_vec_named`), so a body reads the same whichever side wrote it, in any field order.
//!
//! ```
//! use idem_wire::{msgpack, EvictOut};
//! let bytes = msgpack::to_vec(&EvictOut { evicted: true })?;
//! assert_eq!(bytes, b"\x81\xa7evicted\xc3");
//! assert!(msgpack::from_slice::<EvictOut>(&bytes)?.evicted);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The media type of a MessagePack body, for `Content-Type` and `Accept`.
pub const CONTENT_TYPE: &str = "application/msgpack";

/// `value` as a MessagePack map with its field names.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    rmp_serde::to_vec_named(value).map_err(|e| CodecError(e.to_string()))
}

/// A value from MessagePack bytes (a map with field names, or an array in field order).
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    rmp_serde::from_slice(bytes).map_err(|e| CodecError(e.to_string()))
}

/// A value that cannot be encoded, or bytes that are not MessagePack of the type asked for:
/// what went wrong, in rmp-serde's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError(String);

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CodecError {}
