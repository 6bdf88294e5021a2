//! The gRPC wire format the layer reads: the one length-prefixed message of a unary request
//! ("Length-Prefixed-Message" of gRPC over HTTP/2), a string field of a protobuf message, and
//! the request fingerprint.

use sha2::{Digest, Sha256};

use idem_core::Fingerprint;

/// The message of a unary request, as it came: its bytes are compressed when `compressed` is set
/// (by the `grpc-encoding` the client chose).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Message<'a> {
    pub(crate) compressed: bool,
    pub(crate) bytes: &'a [u8],
}

/// The one message of a unary request body: a compressed flag (one byte, 0 or 1), a length (u32,
/// big-endian) and that many bytes, and nothing after it.
pub(crate) fn unary_message(body: &[u8]) -> Result<Message<'_>, String> {
    let Some((&flag, rest)) = body.split_first() else {
        return Err("a unary call carries one message, and this request has none".to_owned());
    };
    let compressed = match flag {
        0 => false,
        1 => true,
        other => {
            return Err(format!(
                "the message's compressed flag is {other}, not 0 or 1"
            ))
        }
    };
    let (len, message) = rest
        .split_first_chunk::<4>()
        .ok_or("the request ends inside a message prefix")?;
    let len = u32::from_be_bytes(*len) as usize;
    if message.len() < len {
        return Err("the request ends inside its message".to_owned());
    }
    if message.len() > len {
        return Err("a unary call carries one message, and this request holds more".to_owned());
    }
    Ok(Message {
        compressed,
        bytes: message,
    })
}

/// The value of the string field `number` at the top level of a protobuf message, or `None`
/// when it is absent or empty (proto3's default, which AIP-155 reads as "no request id"). When
/// the field occurs more than once, the last occurrence counts, as protobuf parsers read it.
pub(crate) fn string_field(message: &[u8], number: u32) -> Result<Option<&str>, String> {
    let mut r = message;
    let mut found = None;
    // Bounded by the message: every pass consumes at least one byte.
    while !r.is_empty() {
        let tag = varint(&mut r)?;
        let (field, wire_type) = (tag >> 3, tag & 7);
        let value = match wire_type {
            0 => {
                varint(&mut r)?;
                None
            }
            1 => {
                take(&mut r, 8)?;
                None
            }
            2 => {
                let len = usize::try_from(varint(&mut r)?).map_err(|_| "a field is too long")?;
                Some(take(&mut r, len)?)
            }
            5 => {
                take(&mut r, 4)?;
                None
            }
            other => {
                return Err(format!(
                    "field {field} has wire type {other}, which this reader does not skip \
                     (groups are not read)"
                ))
            }
        };
        if field == u64::from(number) {
            let bytes = value
                .ok_or_else(|| format!("field {number} of the request message is not a string"))?;
            let text = std::str::from_utf8(bytes)
                .map_err(|_| format!("field {number} of the request message is not UTF-8"))?;
            found = Some(text);
        }
    }
    Ok(found.filter(|s| !s.is_empty()))
}

fn varint(r: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = r
            .split_first()
            .ok_or("the request message ends inside a number")?;
        *r = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("the request message holds a number longer than ten bytes".to_owned())
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if r.len() < n {
        return Err("the request message ends inside a field".to_owned());
    }
    let (head, rest) = r.split_at(n);
    *r = rest;
    Ok(head)
}

/// The policy version of [`fingerprint`]'s scheme (a layer's default `policy_version`):
/// `"grpc"` in ASCII for its first scheme (`idem-grpc/v1`); a new scheme takes a new number.
pub(crate) const FINGERPRINT_VERSION: u32 = u32::from_be_bytes(*b"grpc");

/// The fingerprint of a unary call: SHA-256 over the method path and the request message as it
/// came (its compressed flag and bytes), length-prefixed.
pub(crate) fn fingerprint(path: &str, message: Message<'_>) -> Fingerprint {
    let mut h = Sha256::new();
    h.update(b"idem-grpc/v1");
    h.update((path.len() as u64).to_be_bytes());
    h.update(path.as_bytes());
    h.update([u8::from(message.compressed)]);
    h.update((message.bytes.len() as u64).to_be_bytes());
    h.update(message.bytes);
    Fingerprint::from_digest(h.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    #[test]
    fn one_message() {
        let body = framed(b"abc");
        let m = unary_message(&body).unwrap();
        assert_eq!((m.compressed, m.bytes), (false, &b"abc"[..]));
        assert!(unary_message(&[]).is_err());
        assert!(unary_message(&[0, 0, 0]).is_err());
        assert!(unary_message(&[2, 0, 0, 0, 0]).is_err());
        let mut two = framed(b"abc");
        two.extend_from_slice(&framed(b"d"));
        assert!(unary_message(&two).is_err());
        assert!(unary_message(&body[..6]).is_err());
    }

    /// `amount = 1` (varint 500), `to = 2` ("bob"), a fixed64, a fixed32, then `request_id = 3`.
    fn transfer(request_id: &str) -> Vec<u8> {
        let mut m = vec![0x08, 0xf4, 0x03, 0x12, 3, b'b', b'o', b'b'];
        m.extend_from_slice(&[0x21, 1, 2, 3, 4, 5, 6, 7, 8, 0x2d, 1, 2, 3, 4]);
        m.extend_from_slice(&[0x1a, request_id.len() as u8]);
        m.extend_from_slice(request_id.as_bytes());
        m
    }

    #[test]
    fn string_fields() {
        let m = transfer("req-1");
        assert_eq!(string_field(&m, 3).unwrap(), Some("req-1"));
        assert_eq!(string_field(&m, 2).unwrap(), Some("bob"));
        assert_eq!(string_field(&m, 9).unwrap(), None);
        assert_eq!(string_field(&transfer(""), 3).unwrap(), None);
        assert!(string_field(&m, 1).unwrap_err().contains("not a string"));
        assert!(string_field(&m[..m.len() - 1], 3).is_err());
        assert!(string_field(&[0x1a, 2, 0xff, 0xfe], 3).is_err());
        assert!(string_field(&[0x0b], 3).is_err()); // a group
                                                    // The last occurrence counts.
        let mut twice = m.clone();
        twice.extend_from_slice(&[0x1a, 1, b'z']);
        assert_eq!(string_field(&twice, 3).unwrap(), Some("z"));
    }

    #[test]
    fn fingerprints() {
        let a = Message {
            compressed: false,
            bytes: b"abc",
        };
        assert_eq!(fingerprint("/p.S/M", a), fingerprint("/p.S/M", a));
        assert_ne!(fingerprint("/p.S/M", a), fingerprint("/p.S/N", a));
        let compressed = Message {
            compressed: true,
            ..a
        };
        assert_ne!(fingerprint("/p.S/M", a), fingerprint("/p.S/M", compressed));
        let other = Message {
            compressed: false,
            bytes: b"abd",
        };
        assert_ne!(fingerprint("/p.S/M", a), fingerprint("/p.S/M", other));
    }
}
