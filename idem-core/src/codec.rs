//! How results are turned into stored bytes and back.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::BoxError;

/// Encodes results for storage and decodes them on replay.
///
/// The default is [`JsonCodec`]. A codec must decode what it encoded for the same type; changing
/// a result type in a way the codec cannot read makes replays of old records fail with
/// [`Error::Codec`](crate::Error::Codec).
///
/// ```
/// use idem::{Codec, JsonCodec};
/// let bytes = JsonCodec.encode(&vec![1, 2, 3])?;
/// let back: Vec<i32> = JsonCodec.decode(&bytes)?;
/// assert_eq!(back, [1, 2, 3]);
/// # Ok::<(), idem::BoxError>(())
/// ```
pub trait Codec: Send + Sync + 'static {
    /// Encodes `value`.
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError>;
    /// Decodes bytes produced by [`encode`](Codec::encode).
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// serde JSON: readable in the database, stable across releases of your program.
///
/// ```
/// use idem::{Codec, JsonCodec};
/// assert_eq!(JsonCodec.encode(&"hi")?, b"\"hi\"");
/// # Ok::<(), idem::BoxError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonCodec;

impl Codec for JsonCodec {
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(value)?)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}
