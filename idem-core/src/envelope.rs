//! The bytes the engines keep for a completed call: the encoded result inside a small envelope
//! with a checksum, or the note that the result was not retained.
//!
//! ```text
//! byte 0      0xE1: the envelope's format (version 1)
//! byte 1      flags: 0 = a result; 1 = the result was not retained; 2 = the operation was
//!             abandoned (an operator's resolution)
//! bytes 2..6  CRC-32 (IEEE) of the flags and the payload, big-endian
//! bytes 6..   the encoded result, or (not retained, abandoned) why, as UTF-8
//! ```
//!
//! The checksum makes a damaged record (a flipped byte on disk, a truncated value) a typed
//! [`StoreErrorKind::Corrupt`] error instead of a replay of some other value. Stores see the
//! envelope as opaque bytes, so every store gets the check alike; a record written through the
//! raw [`Store`](crate::Store) API without an envelope reads as corrupt through an engine.

use crate::error::{Error, StoreError, StoreErrorKind};

const FORMAT: u8 = 0xE1;
const NOT_RETAINED: u8 = 1;
const ABANDONED: u8 = 2;
/// The envelope's head: format, flags, checksum.
pub(crate) const HEAD: usize = 6;

/// An empty buffer for an encoder to write a payload of about `len` bytes into, with room to
/// spare for the head the engine's envelope puts in front of it when the result is stored (so
/// that it does not reallocate and copy).
pub fn payload_buffer(len: usize) -> Vec<u8> {
    Vec::with_capacity(len + HEAD)
}

/// What a completed record holds, as the engines read it back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Kept<'a> {
    /// The encoded result.
    Result(&'a [u8]),
    /// The work completed but its result was not kept; the reason.
    NotRetained(&'a str),
    /// The operation was resolved as abandoned; the reason.
    Abandoned(&'a str),
}

/// Wraps an encoded result.
///
/// The payload's own buffer becomes the envelope: the head is inserted in front of it, which
/// needs no allocation when the buffer has 6 bytes to spare (an encoder's usually has).
pub(crate) fn result(mut payload: Vec<u8>) -> Vec<u8> {
    let sum = checksum(0, &payload);
    let len = payload.len();
    // Room at the end, then the payload moved up: cheaper than `Vec::splice`.
    payload.resize(len + HEAD, 0);
    payload.copy_within(..len, HEAD);
    payload[0] = FORMAT;
    payload[1] = 0;
    payload[2..HEAD].copy_from_slice(&sum.to_be_bytes());
    payload
}

/// The record of a result that was not kept, with the reason a retry is told.
pub(crate) fn not_retained(reason: &str) -> Vec<u8> {
    wrap(NOT_RETAINED, reason.as_bytes())
}

/// The record of an operation resolved as abandoned, with the reason a retry is told.
pub(crate) fn abandoned(reason: &str) -> Vec<u8> {
    wrap(ABANDONED, reason.as_bytes())
}

fn wrap(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD + payload.len());
    out.push(FORMAT);
    out.push(flags);
    out.extend_from_slice(&checksum(flags, payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The CRC-32 of each flags byte the envelope knows (0, 1, 2) alone: where [`checksum`] starts
/// for the payload, one update of the hasher instead of two (a second costs its set-up again,
/// on every result stored and every replay).
const FLAGS_CRC: [u32; 3] = [0xd202_ef8d, 0xa505_df1b, 0x3c0c_8ea1];

/// The CRC-32 of `flags` followed by `payload`.
fn checksum(flags: u8, payload: &[u8]) -> u32 {
    let mut h = match FLAGS_CRC.get(usize::from(flags)) {
        Some(&flags_crc) => crc32fast::Hasher::new_with_initial(flags_crc),
        // Unknown flags (a damaged record): counted the long way.
        None => {
            let mut h = crc32fast::Hasher::new();
            h.update(&[flags]);
            h
        }
    };
    h.update(payload);
    h.finalize()
}

/// Opens an envelope, checking its checksum.
pub(crate) fn open(bytes: &[u8]) -> Result<Kept<'_>, Error> {
    let damaged = |what: &str| {
        Error::Store(StoreError::new(
            StoreErrorKind::Corrupt,
            format!(
                "the stored result of this key is damaged ({what}); evict the key, or wait for its \
                 retention to end"
            ),
        ))
    };
    if bytes.len() < HEAD || bytes[0] != FORMAT {
        return Err(damaged("not an idem result envelope"));
    }
    let (head, payload) = bytes.split_at(HEAD);
    let mut sum = [0; 4];
    sum.copy_from_slice(&head[2..HEAD]);
    if checksum(head[1], payload) != u32::from_be_bytes(sum) {
        return Err(damaged("its checksum does not match"));
    }
    match head[1] {
        0 => Ok(Kept::Result(payload)),
        NOT_RETAINED => std::str::from_utf8(payload)
            .map(Kept::NotRetained)
            .map_err(|_| damaged("its reason is not UTF-8")),
        ABANDONED => std::str::from_utf8(payload)
            .map(Kept::Abandoned)
            .map_err(|_| damaged("its reason is not UTF-8")),
        _ => Err(damaged("unknown flags")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksum of the flags and the payload, as the envelope's format defines it: the
    /// two fed to the hasher one after the other.
    fn defined(flags: u8, payload: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&[flags]);
        h.update(payload);
        h.finalize()
    }

    /// The table the checksum starts from is the CRC of each flags byte, so a checksum is the
    /// format's for every flags byte (the known ones from the table, any other the long way):
    /// written before the table and read after it, or the other way round, a record opens.
    #[test]
    fn the_checksum_is_the_formats_for_every_flags_byte() {
        for (flags, crc) in FLAGS_CRC.iter().enumerate() {
            assert_eq!(*crc, crc32fast::hash(&[flags as u8]), "flags {flags}");
        }
        for flags in 0..=u8::MAX {
            for payload in [&b""[..], b"{\"a\":1}", &[0xff; 300]] {
                assert_eq!(
                    checksum(flags, payload),
                    defined(flags, payload),
                    "flags {flags}, {} bytes",
                    payload.len()
                );
            }
        }
    }

    #[test]
    fn round_trips() {
        assert_eq!(
            open(&result(b"{\"a\":1}".to_vec())).unwrap(),
            Kept::Result(b"{\"a\":1}")
        );
        assert_eq!(open(&result(Vec::new())).unwrap(), Kept::Result(b""));
        assert_eq!(
            open(&not_retained("too large")).unwrap(),
            Kept::NotRetained("too large")
        );
        assert_eq!(
            open(&abandoned("refunded by hand")).unwrap(),
            Kept::Abandoned("refunded by hand")
        );
    }

    /// Sealing in place writes the same bytes as the copying `wrap` (and as every stored record
    /// so far), with or without room to spare in the payload's buffer.
    #[test]
    fn sealing_in_place_keeps_the_format() {
        let payload = b"{\"amount\":4200}";
        assert_eq!(result(payload.to_vec()), wrap(0, payload));
        let mut roomy = Vec::with_capacity(128);
        roomy.extend_from_slice(payload);
        assert_eq!(result(roomy), wrap(0, payload));
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let good = result(b"receipt-4200".to_vec());
        for byte in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[byte] ^= 1 << bit;
                let opened = open(&bad);
                assert!(
                    matches!(&opened, Err(Error::Store(e)) if e.kind() == StoreErrorKind::Corrupt),
                    "byte {byte} bit {bit}: {opened:?}"
                );
            }
        }
        assert!(open(&good[..good.len() - 1]).is_err());
        assert!(open(b"").is_err());
        assert!(open(b"null").is_err());
    }
}
