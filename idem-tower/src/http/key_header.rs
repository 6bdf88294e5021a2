//! Reading the `Idempotency-Key` request header: an RFC 8941 Item whose value is a String.

use http::header::GetAll;
use http::HeaderValue;

use idem_core::MAX_KEY_LEN;

/// Why an `Idempotency-Key` header was refused (the layer answers 400 with this as the detail).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum KeyHeaderError {
    #[error("the Idempotency-Key header was sent {count} times; send it once")]
    Repeated { count: usize },
    #[error(
        "the Idempotency-Key header is not a structured-field string (RFC 8941): {reason}; \
         send it in double quotes, e.g. Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\""
    )]
    Malformed { reason: &'static str },
    #[error("the Idempotency-Key is empty; send 1 to 255 characters")]
    Empty,
    #[error("the Idempotency-Key is {len} characters long; at most 255 are allowed")]
    TooLong { len: usize },
}

/// The client key the request carries: `Ok(None)` without the header.
///
/// The key's alphabet is the engine's, printable ASCII (0x20..=0x7E), which is exactly what an
/// RFC 8941 string holds. With `accept_bare`, a value that does not start with a double quote
/// is taken verbatim, as Stripe-style clients send it; it must be visible ASCII (0x21..=0x7E):
/// HTTP strips spaces around a field value, so a bare key cannot carry one faithfully, and a key
/// that holds a space is sent quoted.
pub(crate) fn client_key(
    fields: GetAll<'_, HeaderValue>,
    accept_bare: bool,
) -> Result<Option<String>, KeyHeaderError> {
    let mut fields = fields.iter();
    let Some(field) = fields.next() else {
        return Ok(None);
    };
    let more = fields.count();
    if more > 0 {
        // RFC 8941 joins repeated lines with a comma, which is never a valid Item.
        return Err(KeyHeaderError::Repeated { count: more + 1 });
    }
    let value = trim_ows(field.as_bytes());
    let key = if accept_bare && value.first() != Some(&b'"') {
        bare(value)?
    } else {
        Parser {
            input: value,
            pos: 0,
        }
        .item_string()?
    };
    if key.is_empty() {
        return Err(KeyHeaderError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyHeaderError::TooLong { len: key.len() });
    }
    Ok(Some(key))
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

fn bare(value: &[u8]) -> Result<String, KeyHeaderError> {
    if value.iter().any(|b| !(0x21..=0x7e).contains(b)) {
        return Err(KeyHeaderError::Malformed {
            reason: "an unquoted key may hold visible ASCII characters only (a key with a \
                     space is sent quoted: HTTP strips spaces around an unquoted value)",
        });
    }
    // Visible ASCII is UTF-8: copied whole, not a char at a time.
    std::str::from_utf8(value)
        .map(str::to_owned)
        .map_err(|_| malformed("an unquoted key may hold visible ASCII characters only"))
}

fn malformed(reason: &'static str) -> KeyHeaderError {
    KeyHeaderError::Malformed { reason }
}

/// The parsing algorithms of RFC 8941 section 4.2, for one Item.
struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
    }

    /// An Item whose bare item is a String; parameters are parsed and ignored, as RFC 8941
    /// expects of parameters a field does not define.
    fn item_string(mut self) -> Result<String, KeyHeaderError> {
        if self.peek() != Some(b'"') {
            return Err(malformed("the value does not start with a double quote"));
        }
        let key = self.string()?;
        self.parameters()?;
        if self.pos != self.input.len() {
            return Err(malformed("unexpected characters after the string"));
        }
        Ok(key)
    }

    fn string(&mut self) -> Result<String, KeyHeaderError> {
        self.next();
        // At most the rest of the input: one allocation.
        let mut out = Vec::with_capacity(self.input.len().saturating_sub(self.pos));
        loop {
            // A run of plain characters at once, then the one that ends it.
            let rest = self.input.get(self.pos..).unwrap_or_default();
            let run = rest
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || !(0x20..=0x7e).contains(&c))
                .unwrap_or(rest.len());
            out.extend_from_slice(&rest[..run]);
            self.pos += run;
            match self.next() {
                None => return Err(malformed("the closing double quote is missing")),
                Some(b'"') => break,
                Some(b'\\') => match self.next() {
                    Some(c @ (b'"' | b'\\')) => out.push(c),
                    _ => return Err(malformed("a backslash may only escape '\"' or '\\'")),
                },
                Some(_) => {
                    return Err(malformed(
                        "the string holds a character outside printable ASCII",
                    ))
                }
            }
        }
        // Only printable ASCII was kept, so this cannot fail.
        String::from_utf8(out)
            .map_err(|_| malformed("the string holds a character outside printable ASCII"))
    }

    fn parameters(&mut self) -> Result<(), KeyHeaderError> {
        while self.peek() == Some(b';') {
            self.pos += 1;
            self.skip_sp();
            self.param_key()?;
            if self.peek() == Some(b'=') {
                self.pos += 1;
                self.bare_item()?;
            }
        }
        Ok(())
    }

    fn param_key(&mut self) -> Result<(), KeyHeaderError> {
        match self.next() {
            Some(b'a'..=b'z' | b'*') => {}
            _ => return Err(malformed("a parameter name must start with a-z or '*'")),
        }
        while let Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*') = self.peek() {
            self.pos += 1;
        }
        Ok(())
    }

    fn bare_item(&mut self) -> Result<(), KeyHeaderError> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'"') => self.string().map(drop),
            Some(b':') => self.byte_sequence(),
            Some(b'?') => {
                self.pos += 1;
                match self.next() {
                    Some(b'0' | b'1') => Ok(()),
                    _ => Err(malformed("a boolean parameter must be ?0 or ?1")),
                }
            }
            Some(b'A'..=b'Z' | b'a'..=b'z' | b'*') => {
                self.pos += 1;
                while let Some(c) = self.peek() {
                    if !(is_tchar(c) || c == b':' || c == b'/') {
                        break;
                    }
                    self.pos += 1;
                }
                Ok(())
            }
            _ => Err(malformed(
                "a parameter value is not a structured-field item",
            )),
        }
    }

    fn number(&mut self) -> Result<(), KeyHeaderError> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let (mut int_digits, mut frac_digits, mut decimal) = (0, 0, false);
        while let Some(c) = self.peek() {
            match c {
                b'0'..=b'9' if decimal => frac_digits += 1,
                b'0'..=b'9' => int_digits += 1,
                b'.' if !decimal && int_digits <= 12 => decimal = true,
                _ => break,
            }
            self.pos += 1;
            if int_digits > 15 || frac_digits > 3 {
                return Err(malformed("a numeric parameter has too many digits"));
            }
        }
        if int_digits == 0 || (decimal && frac_digits == 0) {
            return Err(malformed("a numeric parameter is malformed"));
        }
        Ok(())
    }

    fn byte_sequence(&mut self) -> Result<(), KeyHeaderError> {
        self.pos += 1;
        loop {
            match self.next() {
                Some(b':') => return Ok(()),
                Some(b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' | b'=') => {}
                _ => return Err(malformed("a byte-sequence parameter is malformed")),
            }
        }
    }
}

fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn parse(values: &[&[u8]], bare: bool) -> Result<Option<String>, KeyHeaderError> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append("idempotency-key", HeaderValue::from_bytes(v).unwrap());
        }
        client_key(headers.get_all("idempotency-key"), bare)
    }

    fn one(v: &str) -> Result<Option<String>, KeyHeaderError> {
        parse(&[v.as_bytes()], false)
    }

    #[test]
    fn strings_parse() {
        let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
        assert_eq!(one(&format!("\"{uuid}\"")), Ok(Some(uuid.into())));
        assert_eq!(one(" \"a b\" "), Ok(Some("a b".into())));
        assert_eq!(one(r#""q\"b\\s""#), Ok(Some(r#"q"b\s"#.into())));
        assert_eq!(parse(&[], false), Ok(None));
    }

    #[test]
    fn parameters_are_ignored() {
        assert_eq!(
            one(r#""k";a=1;b;c="x";d=?0;e=:aGk=:;f=tok/x:y;g=-1.5"#),
            Ok(Some("k".into()))
        );
        assert!(one(r#""k";A=1"#).is_err());
        assert!(one(r#""k";a=1.2345"#).is_err());
        assert!(one(r#""k";a=1."#).is_err());
        assert!(one(r#""k";a=?2"#).is_err());
        assert!(one(r#""k";a=:!:"#).is_err());
        assert!(one(r#""k";a=1234567890123456"#).is_err());
        assert!(one(r#""k";a=@1"#).is_err());
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "abc",
            "\"abc",
            "\"a\" x",
            r#""a\b""#,
            "\"a\",\"b\"",
            "?1",
            "42",
            "tok",
        ] {
            assert!(
                matches!(one(bad), Err(KeyHeaderError::Malformed { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            parse(&[b"\"\xe9\""], false),
            Err(KeyHeaderError::Malformed { .. })
        ));
        assert_eq!(one("\"\""), Err(KeyHeaderError::Empty));
        let long = format!("\"{}\"", "k".repeat(256));
        assert_eq!(one(&long), Err(KeyHeaderError::TooLong { len: 256 }));
        assert!(one(&format!("\"{}\"", "k".repeat(255))).unwrap().is_some());
        assert_eq!(
            parse(&[b"\"a\"", b"\"a\""], false),
            Err(KeyHeaderError::Repeated { count: 2 })
        );
    }

    /// Every key the engine takes (printable ASCII, 0x20..=0x7E) can be sent quoted, escaping
    /// `"` and `\`; bare, every one without a space (a leading `"` starts the quoted form).
    #[test]
    fn the_header_carries_the_engines_alphabet() {
        for byte in 0x20..=0x7e_u8 {
            let c = char::from(byte);
            let key = format!("a{c}b");
            assert!(idem_core::validate_client_key(&key).is_ok(), "{key:?}");
            let escaped = key.replace('\\', "\\\\").replace('"', "\\\"");
            assert_eq!(
                one(&format!("\"{escaped}\"")),
                Ok(Some(key.clone())),
                "{key:?}"
            );
            let bare = parse(&[key.as_bytes()], true);
            if c == ' ' {
                let Err(KeyHeaderError::Malformed { reason }) = bare else {
                    panic!("a bare key with a space: {bare:?}");
                };
                assert!(reason.contains("sent quoted"), "{reason}");
            } else {
                assert_eq!(bare, Ok(Some(key)));
            }
        }
        // Outside the alphabet, neither form.
        for byte in [0x09_u8, 0x80, 0xff] {
            let quoted = [b'"', b'a', byte, b'b', b'"'];
            assert!(parse(&[&quoted], true).is_err(), "{byte:#x}");
            assert!(parse(&[&quoted[1..4]], true).is_err(), "{byte:#x}");
        }
    }

    #[test]
    fn bare_keys_only_when_allowed() {
        let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
        assert_eq!(parse(&[uuid.as_bytes()], true), Ok(Some(uuid.into())));
        assert_eq!(parse(&[b"\"q\""], true), Ok(Some("q".into())));
        assert!(parse(&[b"a b"], true).is_err());
        assert!(parse(&[b"\"open"], true).is_err());
        assert!(parse(&[uuid.as_bytes()], false).is_err());
        assert_eq!(
            parse(&["k".repeat(256).as_bytes()], true),
            Err(KeyHeaderError::TooLong { len: 256 })
        );
    }
}
