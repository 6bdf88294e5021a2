//! What a record keeps in place of an offloaded result: where the object is, how long it is and
//! its SHA-256, behind a prefix that no engine-written value starts with.
//!
//! ```text
//! bytes 0..8    magic: 0x8F "IDEMOBJ" (an engine's envelope starts with 0xE1, JSON and text
//!               with an ASCII byte: neither is ever mistaken for a pointer)
//! byte 8        the format's version: 1
//! bytes 9..17   the object's size in bytes, u64 big-endian
//! bytes 17..49  SHA-256 of the object's bytes
//! bytes 49..    the object's location in the object store (its path), UTF-8
//! ```
//!
//! A value that starts with the magic is a pointer, whatever its length: the wrapper offloads
//! any value that starts with it, however small, so no value kept in a record reads as one.

use idem_core::{Error, StoreError, StoreErrorKind};
use object_store::path::Path;

/// The first bytes of every pointer.
pub(crate) const MAGIC: [u8; 8] = *b"\x8FIDEMOBJ";
/// The pointer format this crate writes and reads.
const VERSION: u8 = 1;
/// Magic, version, size and digest: the bytes before the location.
const HEAD: usize = MAGIC.len() + 1 + 8 + 32;

/// An offloaded result, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pointer {
    /// The object's size in bytes.
    pub(crate) size: u64,
    /// SHA-256 of its bytes.
    pub(crate) sha256: [u8; 32],
    /// Where it is.
    pub(crate) location: Path,
}

/// Whether `value` is a pointer (it starts with [`MAGIC`]) rather than a result kept in place.
pub(crate) fn is_pointer(value: &[u8]) -> bool {
    value.starts_with(&MAGIC)
}

/// The length of a pointer whose location is `location_len` bytes long.
pub(crate) const fn len_with(location_len: usize) -> usize {
    HEAD + location_len
}

impl Pointer {
    /// Its bytes, as the record keeps them.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let location = self.location.as_ref().as_bytes();
        let mut out = Vec::with_capacity(len_with(location.len()));
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.sha256);
        out.extend_from_slice(location);
        out
    }

    /// The pointer in `value`: `None` when `value` is not one (a result kept in place), a
    /// [`StoreErrorKind::Corrupt`] error when it starts as one and is not whole (truncated, of
    /// a format this version does not know, a location that is no object path).
    pub(crate) fn decode(value: &[u8]) -> Option<Result<Pointer, Error>> {
        if !is_pointer(value) {
            return None;
        }
        Some(Self::parse(value))
    }

    fn parse(value: &[u8]) -> Result<Pointer, Error> {
        if value.len() <= HEAD {
            return Err(corrupt(format!(
                "a record holds an offloaded result's pointer of {} bytes, too short to be whole \
                 (at least {} bytes): the record was damaged or cut short; evict the key to run \
                 its work again",
                value.len(),
                HEAD + 1
            )));
        }
        let version = value[MAGIC.len()];
        if version != VERSION {
            return Err(corrupt(format!(
                "a record holds an offloaded result's pointer of format {version}, which this \
                 version of idem-object-store does not read (it reads format {VERSION}): \
                 upgrade idem on this node, or evict the key"
            )));
        }
        let mut size = [0; 8];
        size.copy_from_slice(&value[MAGIC.len() + 1..MAGIC.len() + 9]);
        let mut sha256 = [0; 32];
        sha256.copy_from_slice(&value[MAGIC.len() + 9..HEAD]);
        let location = std::str::from_utf8(&value[HEAD..])
            .ok()
            .and_then(|location| Path::parse(location).ok())
            .ok_or_else(|| {
                corrupt(
                    "a record holds an offloaded result's pointer whose location is not an \
                     object path: the record was damaged; evict the key to run its work again",
                )
            })?;
        Ok(Pointer {
            size: u64::from_be_bytes(size),
            sha256,
            location,
        })
    }
}

/// A [`StoreErrorKind::Corrupt`] store error saying `why`.
pub(crate) fn corrupt(why: impl Into<String>) -> Error {
    Error::Store(StoreError::new(StoreErrorKind::Corrupt, why.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer() -> Pointer {
        Pointer {
            size: 8 << 20,
            sha256: [7; 32],
            location: Path::from("idem/2026-11-29T13/ab.cd"),
        }
    }

    fn is_corrupt(decoded: Option<Result<Pointer, Error>>) -> bool {
        matches!(decoded, Some(Err(Error::Store(e))) if e.kind() == StoreErrorKind::Corrupt)
    }

    #[test]
    fn a_pointer_reads_back_as_written() {
        let bytes = pointer().encode();
        assert_eq!(bytes.len(), len_with("idem/2026-11-29T13/ab.cd".len()));
        assert!(is_pointer(&bytes));
        assert_eq!(Pointer::decode(&bytes).unwrap().unwrap(), pointer());
    }

    #[test]
    fn a_value_without_the_magic_is_no_pointer() {
        // An engine's envelope (0xE1 …), JSON, nothing at all, the magic cut short.
        for value in [
            &b"\xE1\x00\x00\x00\x00\x00{}"[..],
            b"{\"a\":1}",
            b"",
            &MAGIC[..7],
        ] {
            assert!(!is_pointer(value));
            assert!(Pointer::decode(value).is_none());
        }
    }

    #[test]
    fn a_truncated_pointer_is_corrupt() {
        let bytes = pointer().encode();
        for len in [MAGIC.len(), MAGIC.len() + 1, HEAD - 1, HEAD] {
            assert!(is_corrupt(Pointer::decode(&bytes[..len])), "cut at {len}");
        }
    }

    #[test]
    fn a_foreign_pointer_is_corrupt() {
        // Another format's version.
        let mut newer = pointer().encode();
        newer[MAGIC.len()] = VERSION + 1;
        assert!(is_corrupt(Pointer::decode(&newer)));
        // A location that is not UTF-8, or not an object path.
        for location in [&b"\xFF\xFE"[..], b"a//b", b"../x"] {
            let mut bytes = pointer().encode();
            bytes.truncate(HEAD);
            bytes.extend_from_slice(location);
            assert!(
                is_corrupt(Pointer::decode(&bytes)),
                "{:?}",
                String::from_utf8_lossy(location)
            );
        }
    }
}
