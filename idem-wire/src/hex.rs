//! Keys, claim tokens and fingerprints as the protocol carries them: hexadecimal digits (a
//! token in 32, a fingerprint's SHA-256 and `RemoteStore`'s keys in 64), written in lowercase.
//!
//! ```
//! use idem_wire::hex;
//! assert_eq!(hex::encode(&[0x0f, 0xa0]), "0fa0");
//! assert_eq!(hex::decode::<2>("0fa0"), Some([0x0f, 0xa0]));
//! assert_eq!(hex::decode::<2>("0fa"), None);
//! ```

use std::fmt::Write as _;

/// `bytes` as lowercase hexadecimal digits.
pub fn encode(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 * bytes.len());
    for b in bytes {
        let _ = write!(text, "{b:02x}");
    }
    text
}

/// `N` bytes from their `2 * N` hexadecimal digits; `None` for anything else.
pub fn decode<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.is_ascii() {
        return None;
    }
    let mut bytes = [0u8; N];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(bytes)
}
